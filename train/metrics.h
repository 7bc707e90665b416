// train/metrics.h: a training run's record as JSON lines (output.metrics). In: the Trainer's
// records (a TrainObserver, train/trainer.h) and its summary. Out: one line per step (loss, lr,
// grad_norm, step_s, samples_per_s, bubble, peak_kept_bytes), one per evaluation (eval_loss,
// eval_samples, eval_accuracy), and a last {"summary": ...} line: the schedule, the measured and
// simulated step, peak kept bytes measured and planned, chunk costs measured and modelled and each
// chunk's device; with --profile every node's time and cost (profile).
// Each line is flushed as it is written, so a killed run leaves whole lines but the last.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "train/trainer.h"

namespace pt {

class MetricsWriter : public TrainObserver {
 public:
  // path empty: writes nothing. A resumed run (resumed_at >= 0) keeps the lines of the steps it
  // has taken and appends; a fresh run starts the file over. UserError at `where` when the file
  // cannot be written.
  MetricsWriter(const std::string& path, int64_t resumed_at, const std::string& where);
  void step(const StepRecord& r) override;
  void evaluated(int64_t done, const EvalResult& r, bool last) override;
  void summary(const Trainer& t, const TrainSummary& s, int threads);

 private:
  std::ofstream out_;
};

}  // namespace pt
