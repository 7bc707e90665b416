// `pipetrain train config.yaml`: the chain up to the Trainer (cli/train_plan.h), the training
// loop (train/trainer.h), and around them what a command does: checks before any work, the
// lines it prints, the files it writes.
//
// What it writes: progress lines, metrics as JSON lines, checkpoints (the Trainer), the trained
// model (the input model with new weights, in its dtypes unless output.dtype: fp32), the
// trained state_dict as safetensors (cli/trained_weights.h), a Chrome trace and an SVG of the
// measured timeline above the simulated one. Every file is written whole or not at all. Ctrl-C or SIGTERM (train/interrupt.h)
// stops the loop at the next step boundary: a checkpoint of the last finished step, one line, exit
// 130 (SIGINT) or 143 (SIGTERM).
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "cli/config.h"
#include "cli/driver.h"
#include "train/interrupt.h"
#include "cli/train_memory.h"
#include "cli/train_plan.h"
#include "cli/train_report.h"
#include "cli/trained_weights.h"
#include "core/bytes.h"
#include "core/files.h"
#include "onnx_import/export.h"
#include "onnx_import/module_state.h"
#include "schedule/render.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace pt {
namespace fs = std::filesystem;
namespace {

// Before any work: an output the run could not write at its end is one line now. The path must
// not be a folder, and its nearest existing ancestor must be a folder this process may write.
void check_writable(const std::string& path, const std::string& where) {
  if (path.empty()) return;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw UserError(where, path + " is a folder", "name a file in it, e.g. " + (fs::path(path) / "out").string());
  fs::path up = fs::absolute(path, ec).parent_path();
  while (!up.empty() && !fs::exists(up, ec) && up != up.parent_path()) up = up.parent_path();
  if (!fs::is_directory(up, ec))
    throw UserError(where, up.string() + " is a file, so " + path + " cannot be made under it", "choose another path");
  if (::access(up.c_str(), W_OK) != 0)
    throw UserError(where, "the folder " + up.string() + " is not writable", "choose another path, or make it writable");
}

// A checkpoint folder holds one run's series: a fresh run that would write checkpoints into a
// folder holding some refuses (before anything is built or written), unless --overwrite.
void claim_checkpoint_dir(const TrainConfig& cfg, const TrainArgs& args) {
  if (cfg.checkpoint.dir.empty() || cfg.checkpoint.every <= 0 || args.overwrite) return;
  const std::vector<int64_t> steps = checkpoint_steps(cfg.checkpoint.dir);
  if (steps.empty()) return;
  throw UserError(cfg.where("checkpoint.dir"),
                  "'" + cfg.checkpoint.dir + "' holds another run's checkpoints (up to step " +
                      std::to_string(steps.back()) + ")",
                  "continue that run with --resume, start over with --overwrite (deletes them), or --set "
                  "checkpoint.dir=ANOTHER");
}

// Across processes: the stages of a replica split evenly over its ranks.
void check_across_processes(const TrainConfig& cfg, const TrainRanks& ranks) {
  const int n = ranks.size() / ranks.replicas();  // the processes of one replica
  if (cfg.pipeline.stages % n != 0)
    throw UserError(cfg.where("pipeline.stages"),
                    std::to_string(cfg.pipeline.stages) + " stages do not split evenly over the ranks" +
                        std::string(ranks.replicas() > 1 ? " of a replica" : "") + " (running on " + std::to_string(n) +
                        " processes)",
                    "use a multiple of " + std::to_string(n) + " stages, or start " + std::to_string(cfg.pipeline.stages) +
                        " processes or fewer that divide it");
}

// Every check that needs no model: the checkpoint folder, --resume, the outputs.
void check_before_work(const TrainConfig& cfg, const TrainArgs& args, const TrainRanks& ranks) {
  if (!ranks.alone()) check_across_processes(cfg, ranks);
  if (args.resume && cfg.checkpoint.dir.empty())
    throw UserError("--resume", "the config names no checkpoint.dir", "add checkpoint: {dir: DIR, every: N}");
  if (!args.resume) claim_checkpoint_dir(cfg, args);
  for (const auto& [key, path] : {std::pair<const char*, const std::string&>{"output.model", cfg.output.model},
                                  {"output.safetensors", cfg.output.safetensors},
                                  {"output.metrics", cfg.output.metrics},
                                  {"output.trace", cfg.output.trace},
                                  {"output.timeline", cfg.output.timeline}})
    check_writable(path, cfg.where(key));
}

// Every BatchNorm's running statistics took one training-mode forward per micro-batch of the
// global batch (every replica's) of every step, resumed or not. fetch: their bytes (null: the
// tensors hold them).
TrainedState trained_state(const TrainConfig& cfg, const Trainer& t, const TensorFetch& fetch = {}) {
  TrainedState s;
  s.tensors = t.trained_tensors();
  s.fetch = fetch;
  for (const BatchNormStats& bn : t.form().batch_norms) s.counted.insert(bn.running_mean);
  s.forwards = cfg.steps * t.batch_norm_updates_per_step();
  s.module_names = t.model().module_names;
  s.start_state = cfg.output.start_state;
  s.file_dtypes = t.model().file_dtypes;
  s.float32 = cfg.output.dtype == "fp32";
  return s;
}

// The outputs of a finished run: the trained model, its weights (their bytes through `fetch`,
// Trainer::write_trained), the trace and the timeline.
void write_outputs(const TrainConfig& cfg, const Trainer& t, const std::optional<ModuleState>& module,
                   const TrainSummary& summary, const TensorFetch& fetch) {
  if (!cfg.output.model.empty()) {
    make_parent(cfg.output.model);
    save_model_with_weights(cfg.model, t.trained_tensors(), cfg.output.model, cfg.parameters, cfg.output.dtype == "fp32",
                            fetch);
    std::cout << "trained model -> " << cfg.output.model << "\n";
  }
  if (!cfg.output.safetensors.empty()) {
    const std::map<std::string, std::string> meta = {
        {"format", "pt"}, {"producer", "pipetrain"}, {"model", cfg.model}, {"steps", std::to_string(cfg.steps)}};
    make_parent(cfg.output.safetensors);
    const WeightsWritten w =
        write_trained_weights(cfg.model, module, trained_state(cfg, t, fetch), meta, cfg.output.safetensors);
    std::cout << "trained weights -> " << cfg.output.safetensors << "\n";
    print_weights_written(std::cout, w, cfg.optimizer.weight_decay > 0);
  }
  if (!cfg.output.trace.empty()) {
    make_parent(cfg.output.trace);
    t.trace().write(cfg.output.trace, "output.trace");
    std::cout << "trace (" << t.trace().events() << " events, open in Perfetto) -> " << cfg.output.trace << "\n";
  }
  if (!cfg.output.timeline.empty()) {
    make_parent(cfg.output.timeline);
    write_file_atomic(cfg.output.timeline,
                      svg_timelines(t.lowered(), {{"measured (last step)", summary.measured},
                                                  {"simulated on measured costs", summary.predicted}}),
                      "choose another output.timeline");
    std::cout << "timeline, measured above simulated -> " << cfg.output.timeline << "\n";
  }
}

// Ctrl-C or SIGTERM between steps: the last finished step is kept where a checkpoint.dir is set,
// one line says what was kept and how to go on; the outputs of a finished run are not written.
int stop_interrupted(const TrainConfig& cfg, Trainer& t, const TrainRanks& ranks, int signal) {
  const int64_t done = t.steps_done();
  std::ostringstream line;
  line << "interrupted at step " << done << " of " << cfg.steps << ": ";
  if (cfg.checkpoint.dir.empty()) {
    line << "nothing was kept (the config names no checkpoint.dir); add checkpoint: {dir: DIR, every: N} to "
            "make a run resumable";
  } else {
    if (t.saved_step() != done) t.save_checkpoint(done);
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld.ckpt", static_cast<long long>(done));
    line << "checkpoint " << name << " in " << cfg.checkpoint.dir << "; continue with --resume";
  }
  std::cout << std::flush;
  if (ranks.rank() == 0) std::cerr << line.str() << "\n";
  return interrupted_exit_code(signal);
}

// Checks, the chain, the memory it plans against the machine's, the Trainer; then resume, the
// loop and the outputs. guard: across processes, the one run_train installed before set-up (a
// rank lost then ends the job with its line too); alone, train makes its own for the step loop.
int train(const TrainConfig& cfg, const TrainArgs& args, const TrainRanks& ranks, InterruptGuard* guard) {
  check_before_work(cfg, args, ranks);
  TrainerPlan plan = plan_training(cfg, args.quiet);
  const TrainMemory memory = planned_memory(cfg, plan, ranks);
  check_memory(cfg, memory, ranks);  // before the Trainer loads any parameter
  const std::optional<ModuleState> module = at_key(cfg, "model", [&] { return read_module_state(cfg.model); });
  std::string warmup;
  const OptimizerConfig optimizer = optimizer_config(cfg, &warmup);
  Trainer t(std::move(plan), trainer_options(cfg, args, optimizer), ranks);
  if (cfg.device != "cpu" && !args.quiet) std::cout << "devices: " << t.device_summary() << "\n";
  if (!warmup.empty() && !args.quiet) std::cout << warmup << "\n";
  // A start state that cannot complete the output fails now, not after training.
  if (!cfg.output.safetensors.empty() && !module)
    at_key(cfg, "output.start_state", [&] { check_start_state(trained_state(cfg, t)); });
  if (args.resume) {
    const std::optional<int64_t> step = t.resume();
    if (!step) std::cout << "no checkpoint in " << cfg.checkpoint.dir << " yet: starting at step 0\n";
    else if (*step < cfg.steps) std::cout << "resumed from step " << *step << " (" << cfg.checkpoint.dir << ")\n";
    if (t.first_step() >= cfg.steps) {  // a finished run: every output stays as it was
      std::cout << "nothing to do: step " << t.first_step() << " of " << cfg.steps << " (" << cfg.checkpoint.dir
                << "); raise steps (--set steps=N) to train on\n";
      return 0;
    }
  } else if (args.overwrite && !cfg.checkpoint.dir.empty() && !checkpoint_steps(cfg.checkpoint.dir).empty()) {
    if (ranks.rank() == 0) clear_checkpoints(cfg.checkpoint.dir);
    if (!args.quiet) std::cout << "--overwrite: removed the checkpoints in " << cfg.checkpoint.dir << "\n";
  }
  TrainPrinter printer(cfg, args, t.first_step(), ranks);
  printer.start(t, ranks, memory);
  std::optional<InterruptGuard> own;  // a signal stops the loop at the next step boundary
  InterruptGuard& g = guard ? *guard : own.emplace();
  g.resume_hint(cfg.checkpoint.dir.empty()
                    ? "nothing was kept (the config names no checkpoint.dir); add checkpoint: {dir: DIR, every: N} to "
                      "make a run resumable"
                    : "continue from the last checkpoint in " + cfg.checkpoint.dir + " with --resume");
  const int signal = t.run(printer, {[&] { return g.signal(); }, [&](int64_t n) { g.completed(n); }});
  printer.end();
  if (signal) return stop_interrupted(cfg, t, ranks, signal);
  own.reset();
  const TrainSummary summary = t.finish();
  printer.summary(t, summary, memory, ranks);
  t.write_trained([&](const TensorFetch& fetch) { write_outputs(cfg, t, module, summary, fetch); });
  return 0;
}

}  // namespace

// One process, or each rank of an mpirun: a rank other than 0 prints nothing and writes no file;
// an error on any rank ends every rank (the others would wait for its messages), its line
// written once, by the rank that failed first (the lowest of those, when several fail at once).
int run_train(const TrainArgs& a) {
  TrainRanks ranks;
  if (ranks.alone()) {
    TrainConfig cfg = load_config(a.config, a.set);
    ranks.split(cfg.parallel.data, cfg.where("parallel.data"));  // D > 1 alone: one line
    return train(cfg, a, ranks, nullptr);
  }
  // From here on a rank lost (or mpirun's SIGTERM) ends this one with its line, set-up included.
  InterruptGuard guard;
  guard.watch_ranks(ranks.rank(), ranks.size(), ranks.host_ranks());
  std::streambuf* out = std::cout.rdbuf();
  std::ofstream discard;
  if (ranks.rank() != 0) std::cout.rdbuf(discard.rdbuf());
  try {
    TrainConfig cfg = load_config(a.config, a.set);
    ranks.split(cfg.parallel.data, cfg.where("parallel.data"));
    if (ranks.rank() != 0) cfg.output = {};
    const int code = train(cfg, a, ranks, &guard);
    std::cout.rdbuf(out);
    return code;
  } catch (const std::exception& e) {
    std::cout.rdbuf(out);
    std::cout.flush();
    // Ranks failing on one cause (a config every rank reads) agree on which writes the line.
    const bool write = ranks.report_failure();
    if (write) {
      // One write: mpirun forwards every rank's stderr, and a line in pieces would interleave.
      const std::string line = "error: rank " + std::to_string(ranks.rank()) + " of " + std::to_string(ranks.size()) +
                               ": " + e.what() + "\n";
      std::fwrite(line.data(), 1, line.size(), stderr);
      std::fflush(stderr);
    }
    ranks.end_failed(2, write);
  }
}

}  // namespace pt
