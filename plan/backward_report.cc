#include "plan/backward_report.h"

#include <iomanip>
#include <ostream>
#include <sstream>

#include "partition/partition_report.h"  // format_count
#include "plan/chunk_costs.h"
#include "plan/pipeline.h"

namespace pt {
namespace {

double percent(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

}  // namespace

const std::vector<std::string> kComparedPolicies = {"none", "selective", "every:1", "full"};

int64_t train_flops(const BackwardGraphs& b) {
  const ChunkWork w = chunk_work(b);
  return w.f.flops_fwd + w.b.flops_fwd + w.w.flops_fwd - b.recompute_flops;
}

std::vector<std::vector<BackwardGraphs>> compared_runs(const Graph& g, const PartitionPlan& plan, const LossSpec& loss,
                                                       const std::vector<std::string>& frozen) {
  std::vector<std::vector<BackwardGraphs>> runs;
  for (const std::string& p : kComparedPolicies)
    runs.push_back(build_chunk_backward(g, plan, backward_options(loss, p, frozen, plan.devices, static_cast<int>(plan.chunks.size()))));
  return runs;
}

void print_backward(std::ostream& os, const PartitionPlan& plan, const std::vector<BackwardGraphs>& chosen,
                    const std::vector<std::vector<BackwardGraphs>>& runs, const std::string& recompute) {
  os << "\nbackward (recompute " << recompute << "), per micro-batch:\n";
  os << "  chunk device  F FLOPs  B FLOPs  W FLOPs  kept (F->B,W)  passed (B->W)  recompute FLOPs  extra  params\n";
  for (size_t c = 0; c < chosen.size(); ++c) {
    const BackwardGraphs& b = chosen[c];
    const ChunkWork w = chunk_work(b);
    os << "  " << std::setw(5) << c << std::setw(7) << plan.chunks[c].device << std::setw(9)
       << format_count(double(w.f.flops_fwd)) << std::setw(9) << format_count(double(w.b.flops_fwd)) << std::setw(9)
       << format_count(double(w.w.flops_fwd)) << std::setw(15)
       << format_bytes(b.kept_bytes) << std::setw(15) << format_bytes(b.passed_bytes)
       << std::setw(17) << b.recompute_flops << std::setw(6) << std::fixed << std::setprecision(1)
       << percent(b.recompute_flops, train_flops(b)) << "%" << std::setw(8) << b.params.size()
       << "\n";
  }
  os << "\nkept bytes per micro-batch (extra FLOPs) by policy:\n  chunk";
  for (const std::string& p : kComparedPolicies) os << std::setw(22) << p;
  os << "\n";
  for (size_t c = 0; c < chosen.size(); ++c) {
    os << "  " << std::setw(5) << c;
    for (const auto& run : runs) {
      std::ostringstream cell;
      cell << format_bytes(run[c].kept_bytes) << " (" << std::fixed << std::setprecision(1)
           << percent(run[c].recompute_flops, train_flops(run[c])) << "%)";
      os << std::setw(22) << cell.str();
    }
    os << "\n";
  }
}

nlohmann::json backward_json(const PartitionPlan& plan, const std::vector<BackwardGraphs>& chosen,
                             const std::vector<std::vector<BackwardGraphs>>& runs, const std::string& recompute) {
  nlohmann::json chunks = nlohmann::json::array();
  for (size_t c = 0; c < chosen.size(); ++c) {
    const BackwardGraphs& b = chosen[c];
    nlohmann::json by_policy;
    for (size_t p = 0; p < runs.size(); ++p)
      by_policy[kComparedPolicies[p]] = {{"kept_bytes", runs[p][c].kept_bytes},
                                         {"extra_flops_percent", percent(runs[p][c].recompute_flops, train_flops(runs[p][c]))}};
    const ChunkWork w = chunk_work(b);
    chunks.push_back({{"chunk", c},
                      {"device", plan.chunks[c].device},
                      {"flops_fwd", w.f.flops_fwd},
                      {"flops_bwd_input", w.b.flops_fwd},
                      {"flops_bwd_weight", w.w.flops_fwd},
                      {"kept_bytes", b.kept_bytes},
                      {"passed_bytes", b.passed_bytes},
                      {"recompute_flops", b.recompute_flops},
                      {"extra_flops_percent", percent(b.recompute_flops, train_flops(b))},
                      {"params", b.params.size()},
                      {"by_policy", by_policy}});
  }
  return {{"recompute", recompute}, {"per_micro_batch", true}, {"chunks", chunks}};
}

}  // namespace pt
