#include "train/metrics.h"

#include <nlohmann/json.hpp>

#include "core/files.h"

namespace pt {
namespace {

// Keeps the metrics lines of steps a resumed run has already taken, drops the rest.
void trim_metrics(const std::string& path, int64_t steps_done) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("step") && j.at("step").get<int64_t>() <= steps_done) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      // a line cut short by the kill: dropped
    }
  }
  write_file_atomic(path, kept, "choose another output.metrics");
}

// --profile's nodes, each with its seconds per run (the profiled steps' time over its runs, one
// per micro-batch a step) and what the cost model counts for it: the data to fit the model's
// constants to (bench/fit_costs.py).
nlohmann::json profile_rows(const Trainer& t) {
  const double runs = static_cast<double>(t.steps_done() - t.profiled_from()) * t.schedule().micro_batches;
  nlohmann::json rows = nlohmann::json::array();
  for (const PipelineExecutor::NodeTime& n : t.node_profile())
    rows.push_back({{"chunk", n.chunk},
                    {"pass", n.pass},
                    {"op", n.op},
                    {"node", n.node},
                    {"shape", n.shape},
                    {"seconds", n.seconds / runs},
                    {"flops", n.cost.flops_fwd},
                    {"bytes_read", n.cost.bytes_read},
                    {"bytes_written", n.cost.bytes_written},
                    {"cached_bytes", n.cost.cached_bytes},
                    {"launch", n.cost.launch}});
  return rows;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, int64_t resumed_at, const std::string& where) {
  if (path.empty()) return;
  make_parent(path);
  if (resumed_at >= 0) trim_metrics(path, resumed_at);
  out_.open(path, resumed_at >= 0 ? std::ios::app : std::ios::trunc);
  if (!out_) throw UserError(where, "cannot write '" + path + "'", "choose another file");
}

void MetricsWriter::step(const StepRecord& r) {
  if (!out_.is_open()) return;
  nlohmann::json j = {{"step", r.step + 1},       {"loss", r.loss},      {"lr", r.lr},
                      {"grad_norm", r.grad_norm}, {"step_s", r.seconds}, {"samples_per_s", r.samples_per_s},
                      {"bubble", r.bubble},       {"peak_kept_bytes", r.peak_kept_bytes}};
  out_ << j.dump() << "\n" << std::flush;
}

void MetricsWriter::evaluated(int64_t done, const EvalResult& r, bool) {
  if (!out_.is_open()) return;
  nlohmann::json j = {{"step", done}, {"eval_loss", r.loss}, {"eval_samples", r.samples}};
  if (r.accuracy >= 0) j["eval_accuracy"] = r.accuracy;
  out_ << j.dump() << "\n" << std::flush;
}

void MetricsWriter::summary(const Trainer& t, const TrainSummary& s, int threads) {
  if (!out_.is_open()) return;
  const Schedule& schedule = t.schedule();
  nlohmann::json chunk_costs_s = nlohmann::json::array(), chunk_costs_model = nlohmann::json::array();
  nlohmann::json chunk_costs_spent_s = nlohmann::json::array();
  for (const ChunkCost& c : s.costs.chunks) chunk_costs_s.push_back({c.f, c.b, c.w});
  for (const ChunkCost& c : s.spent.chunks) chunk_costs_spent_s.push_back({c.f, c.b, c.w});
  for (const ChunkCost& c : t.planned().chunks) chunk_costs_model.push_back({c.f, c.b, c.w});
  nlohmann::json chunk_devices = nlohmann::json::array();
  for (size_t c = 0; c < t.planned().chunks.size(); ++c) chunk_devices.push_back(schedule.device_of(static_cast<int>(c)));
  nlohmann::json j = {{"schedule", schedule.kind},
                      {"stages", schedule.stages},
                      {"chunks", schedule.chunks},
                      {"micro_batches", schedule.micro_batches},
                      {"rows", t.rows()},
                      {"threads", threads},
                      {"measured_bubble", s.bubble},
                      {"measured_makespan_s", s.makespan},
                      {"simulated_bubble", s.predicted.bubble},
                      {"simulated_makespan_s", s.predicted.makespan},
                      {"step_s_median", s.step_s_median},
                      {"peak_kept_bytes_measured", s.peak_kept},
                      {"peak_kept_bytes_planned", s.planned_peak},
                      {"chunk_costs_s", chunk_costs_s},
                      {"chunk_costs_spent_s", chunk_costs_spent_s},
                      {"chunk_costs_spent_clock", s.spent_clock == ActionClock::kThreadCpu ? "thread_cpu" : "wall"},
                      {"chunk_costs_model", chunk_costs_model},
                      {"chunk_devices", chunk_devices}};
  if (t.profiled_from() >= 0) j["profile"] = profile_rows(t);
  out_ << nlohmann::json{{"summary", j}}.dump() << "\n" << std::flush;
}

}  // namespace pt
