#include "cli/train_report.h"

#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/report.h"
#include "core/bytes.h"
#include "core/files.h"
#include "plan/chunk_costs.h"

namespace pt {
namespace {

std::string first_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 5; ++i) s += " " + keys[i];
  return s + (keys.size() > 5 ? " ..." : "");
}

// measured / model to two places, "-" where the model counts nothing.
std::string ratio_text(double ms, double model) {
  if (model <= 0) return "-";
  std::ostringstream r;
  r << std::fixed << std::setprecision(2) << ms / model;
  return r.str();
}

}  // namespace

void print_weights_written(std::ostream& os, const WeightsWritten& w, bool weight_decay) {
  if (!w.completed.empty() && weight_decay)
    os << "  warning: the elements of" << first_keys(w.completed) << " that the model file does not hold are "
       << "written as output.start_state has them; PyTorch's weight decay would have shrunk them\n";
  if (!w.not_in_start.empty())
    os << "  " << w.not_in_start.size() << " trained tensor(s) output.start_state does not name, written too:"
       << first_keys(w.not_in_start) << " (load with strict=False)\n";
  if (w.missing.empty()) return;
  os << "  " << w.missing.size() << " state_dict key(s) the model file does not hold, left out:" << first_keys(w.missing)
     << " (load with strict=False)\n";
}

TrainPrinter::TrainPrinter(const TrainConfig& cfg, const TrainArgs& args, int64_t first_step, const TrainRanks& ranks)
    : cfg_(cfg), quiet_(args.quiet), tty_(ranks.alone() && ::isatty(STDOUT_FILENO) != 0), every_(std::max<int64_t>(1, cfg.steps / 20)),
      metrics_(cfg.output.metrics, args.resume ? first_step : -1, cfg.where("output.metrics")) {}

// A config without `data:` trains on seeded random samples (data.kind: synthetic, for benchmarks
// and tries): one line says so at the start, and how to give real data (rank 0 alone prints).
void TrainPrinter::start(const Trainer& t, const TrainRanks& ranks, const TrainMemory& memory) {
  if (quiet_) return;
  const Graph& model = t.model();
  if (!cfg_.places.count("data")) {
    std::string inputs;
    for (ValueId v : model.inputs) inputs += (inputs.empty() ? "" : ", ") + model.value(v).name + ": FILE.npy";
    std::cout << "data: the config names none, so this run trains on " << t.data().samples()
              << " synthetic samples (seeded random inputs and targets); to train on yours add data: {kind: npy, inputs: {"
              << inputs << "}, targets: FILE.npy} or {kind: tokens, file: FILE}\n";
  }
  const Schedule& s = t.schedule();
  std::cout << "training " << cfg_.model << ": " << t.parameter_count() << " parameter tensors, "
            << t.data().train_samples() << " training samples (" << t.data().eval_samples() << " held out), " << s.kind
            << " on " << s.stages << " stage(s), " << s.micro_batches << " micro-batches of " << t.rows()
            << (ranks.replicas() > 1 ? " per replica, " + std::to_string(ranks.replicas()) + " data-parallel replicas" : "")
            << (ranks.alone() ? "" : " on " + std::to_string(ranks.size()) + " processes") << "\n";
  if (const std::string half = half_weights_line(model, cfg_.output.dtype == "fp32"); !half.empty())
    std::cout << half << "\n";
  if (t.sharded())
    std::cout << "ZeRO-1: each replica holds the optimizer state of 1/" << ranks.replicas()
              << " of the parameters: " << format_bytes(t.optimizer_state_bytes()) << " on rank 0\n";
  print_memory_plan(std::cout, memory, ranks);
}

void TrainPrinter::step(const StepRecord& r) {
  if (!quiet_) {
    const int width = 24;
    const int done = static_cast<int>(width * (r.step + 1) / cfg_.steps);
    std::ostringstream line;
    line << "[" << std::string(static_cast<size_t>(done), '#') << std::string(static_cast<size_t>(width - done), '.')
         << "] step " << r.step + 1 << "/" << cfg_.steps << "  loss " << std::fixed << std::setprecision(4) << r.loss
         << "  lr " << std::scientific << std::setprecision(2) << r.lr << "  " << std::fixed << std::setprecision(0)
         << r.samples_per_s << " samples/s  bubble " << std::setprecision(1) << 100 * r.bubble << "%";
    if (tty_) {
      std::cout << "\r" << line.str() << "\x1b[K" << std::flush;
      open_ = true;
    } else if ((r.step + 1) % every_ == 0 || r.step == 0 || r.step + 1 == cfg_.steps) {
      std::cout << line.str() << "\n" << std::flush;
    }
  }
  metrics_.step(r);
}

void TrainPrinter::evaluated(int64_t done, const EvalResult& r, bool last) {
  std::ostringstream line;
  line << "eval after step " << done << ": loss " << std::fixed << std::setprecision(4) << r.loss;
  if (r.accuracy >= 0) line << ", accuracy " << std::setprecision(3) << r.accuracy;
  line << " (" << r.samples << " held-out samples)";
  note(line.str(), last);
  metrics_.evaluated(done, r, last);
}

void TrainPrinter::checkpointed(int64_t done) { note("checkpoint: step " + std::to_string(done) + " -> " + cfg_.checkpoint.dir); }

void TrainPrinter::note(const std::string& text, bool always) {
  if (quiet_ && !always) return;
  if (open_) std::cout << "\n";
  open_ = false;
  std::cout << text << "\n" << std::flush;
}

void TrainPrinter::end() {
  if (open_ && !quiet_) std::cout << "\n";
  open_ = false;
}

void TrainPrinter::summary(const Trainer& t, const TrainSummary& s, const TrainMemory& memory, const TrainRanks& ranks) {
  const Schedule& schedule = t.schedule();
  std::cout << "schedule " << schedule.kind << ": " << schedule.stages << " stages x " << schedule.chunks << " chunk(s), "
            << schedule.micro_batches << " micro-batches; measured step " << std::fixed << std::setprecision(2)
            << s.makespan * 1e3 << " ms, bubble " << std::setprecision(1) << 100 * s.bubble
            << "%; simulated on measured costs " << std::setprecision(2) << s.predicted.makespan * 1e3 << " ms, bubble "
            << std::setprecision(1) << 100 * s.predicted.bubble << "%\n";
  std::cout << "peak kept activations per device, measured / planned:";
  for (size_t d = 0; d < s.planned_peak.size(); ++d)
    std::cout << (d ? "," : "") << " " << format_bytes(s.peak_kept[d]) << " / "
              << format_bytes(static_cast<int64_t>(s.planned_peak[d]));
  std::cout << "\n";
  if (!s.arena.empty()) {
    std::cout << "programs' arena per device, allocated / planned (the kernels' scratch is not planned):";
    for (size_t d = 0; d < s.arena.size() && d < memory.needs.devices.size(); ++d)
      std::cout << (d ? "," : "") << " " << format_bytes(s.arena[d]) << " / " << format_bytes(memory.needs.devices[d].arena);
    std::cout << "\n";
  }
  print_memory_summary(std::cout, memory, ranks);
  print_chunk_times(std::cout, schedule, t.planned(), s.spent, s.spent_clock == ActionClock::kThreadCpu);
  metrics_.summary(t, s, cfg_.threads);
  if (t.profiled_from() >= 0) print_profile(t);
}

// --profile: per pass (F, B, W) and op type, the kernel time per step summed over every device,
// largest first, and the share of all kernel time; beside it what the cost model counts for the
// same nodes (plan/chunk_costs.h work units), in ms at the one rate that makes the two totals
// equal, and the ratio: a row far from 1 is an op the model misprices (or a slow kernel).
void TrainPrinter::print_profile(const Trainer& t) const {
  const std::vector<PipelineExecutor::NodeTime> nodes = t.node_profile();
  const std::vector<PipelineExecutor::OpTime> rows = PipelineExecutor::by_op(nodes);
  const double steps = static_cast<double>(cfg_.steps - t.profiled_from());
  double total = 0, units = 0;
  for (const auto& r : rows) {
    total += r.seconds;
    units += work_units(r.cost);
  }
  if (total <= 0 || steps <= 0) return;
  const int micro_batches = t.schedule().micro_batches;
  units *= micro_batches;  // each chunk's F, B and W run once per micro-batch
  const double ms_per_unit = units > 0 ? total / steps * 1e3 / units : 0;
  std::cout << "kernel time per step, steps " << t.profiled_from() + 1 << " to " << cfg_.steps
            << " (each kernel timed alone, all devices): " << std::fixed << std::setprecision(2)
            << total / steps * 1e3 << " ms; model ms at " << std::setprecision(2)
            << (ms_per_unit > 0 ? 1 / (ms_per_unit * 1e-3) : 0) << " GFLOP-equivalents/s\n";
  std::cout << "  pass  op                          nodes        ms  share  model ms  ratio\n";
  double shown = 0;
  for (size_t i = 0; i < rows.size() && (i < 12 || shown < 0.995 * total) && i < 40; ++i) {
    const auto& r = rows[i];
    shown += r.seconds;
    const double ms = r.seconds / steps * 1e3, model = work_units(r.cost) * micro_batches * ms_per_unit;
    std::cout << "  " << std::left << std::setw(6) << r.pass << std::setw(28) << r.op << std::right << std::setw(5)
              << r.nodes << std::setw(10) << std::setprecision(3) << ms << std::setw(6) << std::setprecision(1)
              << 100 * r.seconds / total << "%" << std::setw(10) << std::setprecision(3) << model << std::setw(7)
              << ratio_text(ms, model) << "\n";
  }
  // The nodes behind the rows: the slowest ten, each with its shape, the way to a slow kernel.
  std::cout << "slowest nodes, ms per step:\n"
            << "  chunk  pass  op                              ms  model ms  ratio  node [output shape]\n";
  for (size_t i = 0; i < nodes.size() && i < 10; ++i) {
    const auto& n = nodes[i];
    const double ms = n.seconds / steps * 1e3, model = work_units(n.cost) * micro_batches * ms_per_unit;
    std::cout << "  " << std::setw(5) << n.chunk << "  " << std::left << std::setw(6) << n.pass << std::setw(24)
              << n.op << std::right << std::setw(10) << std::setprecision(3) << ms << std::setw(10) << model
              << std::setw(7) << ratio_text(ms, model) << "  " << n.node << " " << shape_str(n.shape) << "\n";
  }
}

}  // namespace pt
