// cli/train_report.h: what `pipetrain train` prints and records while the Trainer runs
// (train/trainer.h). In: the Trainer's records (a TrainObserver) and its summary; out: the start
// lines, one progress line per step (on a terminal in one process rewritten in place, otherwise
// every steps/20), the evaluation and checkpoint lines, output.metrics as JSON lines (one per step and
// evaluation, a summary last: train/metrics.h), the summary of the measured step against the simulated one
// and of the memory planned against the peak RSS (cli/train_memory.h), and with --profile the
// kernel time per pass and op.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "cli/args.h"
#include "cli/config.h"
#include "cli/train_memory.h"
#include "cli/trained_weights.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace pt {

// The lines below "trained weights -> PATH": what the state_dict completed, added or left out.
void print_weights_written(std::ostream& os, const WeightsWritten& w, bool weight_decay);

class TrainPrinter : public TrainObserver {
 public:
  // Opens output.metrics: a resumed run keeps the lines of the steps it has taken. The progress
  // line is rewritten in place only on a terminal and in one process: under mpirun a rank's
  // stdout is a pseudo-terminal of mpirun's whatever mpirun's own output is (a log file too).
  TrainPrinter(const TrainConfig& cfg, const TrainArgs& args, int64_t first_step, const TrainRanks& ranks);
  // The data line (synthetic data), the run line, ZeRO-1's and the memory the run plans.
  void start(const Trainer& t, const TrainRanks& ranks, const TrainMemory& memory);
  void step(const StepRecord& r) override;
  void evaluated(int64_t done, const EvalResult& r, bool last) override;
  void checkpointed(int64_t done) override;
  void end();  // closes the progress line
  // On every rank (the memory line gathers each rank's peak RSS).
  void summary(const Trainer& t, const TrainSummary& s, const TrainMemory& memory, const TrainRanks& ranks);

 private:
  // A line that stays (eval results, checkpoints); `always`: even with -q (the final eval).
  void note(const std::string& text, bool always = false);
  void print_profile(const Trainer& t) const;

  const TrainConfig& cfg_;
  bool quiet_, tty_;
  int64_t every_;
  bool open_ = false;
  MetricsWriter metrics_;
};

}  // namespace pt
