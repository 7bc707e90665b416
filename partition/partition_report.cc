#include "partition/partition_report.h"

#include <cstdio>
#include <ostream>

#include "partition/link.h"

namespace pt {
namespace {

std::string tensor_list(const Graph& g, const std::vector<ValueId>& ids) {
  std::string s;
  for (ValueId v : ids) s += (s.empty() ? "" : ", ") + g.value(v).name + " " + g.value(v).type.str();
  return s.empty() ? "-" : s;
}

}  // namespace

nlohmann::json tensors_json(const Graph& g, const std::vector<ValueId>& ids) {
  nlohmann::json arr = nlohmann::json::array();
  for (ValueId v : ids)
    arr.push_back({{"name", g.value(v).name},
                   {"shape", g.value(v).type.shape},
                   {"dtype", dtype_name(g.value(v).type.dtype)}});
  return arr;
}

std::string format_count(double x) {
  const char* suffix[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (x >= 1000 && i < 5) {
    x /= 1000;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i == 0 ? "%.0f%s" : "%.3g%s", x, suffix[i]);
  return buf;
}

nlohmann::json partition_json(const Graph& g, const PartitionPlan& plan) {
  nlohmann::json stages = nlohmann::json::array();
  for (const ChunkPlan& c : plan.chunks) {
    stages.push_back({{"index", c.index},
                      {"device", c.device},
                      {"nodes", c.end - c.begin},
                      {"first_node", g.nodes[static_cast<size_t>(c.begin)].name},
                      {"last_node", g.nodes[static_cast<size_t>(c.end - 1)].name},
                      {"params", c.param_count},
                      {"param_bytes", c.param_bytes},
                      {"flops_fwd", c.flops_fwd},
                      {"flops_bwd", c.flops_bwd},
                      {"activation_bytes", c.activation_bytes},
                      {"memory_bytes", c.memory},
                      {"cost", c.cost},
                      {"share", plan.total_cost ? double(c.cost) / double(plan.total_cost) : 0.0},
                      {"link_in_s", double(c.link_in) / plan.link.rate},
                      {"link_out_s", double(c.link_out) / plan.link.rate},
                      {"inputs", tensors_json(g, c.inputs)},
                      {"outputs", tensors_json(g, c.outputs)}});
  }
  return {{"strategy", strategy_name(plan.strategy)},
          {"devices", plan.devices},
          {"chunks_per_stage", plan.chunks_per_stage},
          {"total_cost", plan.total_cost},
          {"link", {{"name", plan.link.name},
                    {"bandwidth", plan.link.bandwidth},
                    {"latency_s", plan.link.latency},
                    {"device_flops", plan.link.rate}}},
          {"stages", stages},
          {"imbalance", plan.imbalance}};
}

void print_partition_table(std::ostream& os, const Graph& g, const PartitionPlan& plan,
                           const std::string& model_path, int64_t micro_batch) {
  const bool chunked = plan.chunks_per_stage > 1;
  os << model_path << ": " << plan.chunks.size() << (chunked ? " chunks" : " stages") << " on "
     << plan.devices << " devices"
     << (!chunked || plan.devices == 1 ? "" : plan.chunks.back().device == 0 ? " (V-shaped)" : " (looped: chunk c on device c mod P)")
     << ", strategy " << strategy_name(plan.strategy) << ", micro-batch " << micro_batch
     << "\n";
  const bool priced = plan.link.priced();
  if (priced)
    os << "link " << describe_link(plan.link)
       << "; a stage waits for its inputs and for its outputs' gradients\n";
  char line[256];
  std::snprintf(line, sizeof line, "%5s %6s %6s %9s %10s %10s %11s %11s %7s%s\n",
                chunked ? "chunk" : "stage", "device",
                "nodes", "params", "fwd FLOP", "bwd FLOP", "act/mb", "memory", "share",
                priced ? "   link us" : "");
  os << line;
  for (const ChunkPlan& c : plan.chunks) {
    const double share = plan.total_cost ? 100.0 * double(c.cost) / double(plan.total_cost) : 0;
    char link[32] = "";
    if (priced) std::snprintf(link, sizeof link, " %9.1f", 1e6 * double(c.link_in + c.link_out) / plan.link.rate);
    std::snprintf(line, sizeof line, "%5d %6d %6d %9s %10s %10s %11s %11s %6.1f%%%s\n", c.index,
                  c.device, c.end - c.begin, format_count(double(c.param_count)).c_str(),
                  format_count(double(c.flops_fwd)).c_str(),
                  format_count(double(c.flops_bwd)).c_str(),
                  format_bytes(c.activation_bytes).c_str(), format_bytes(c.memory).c_str(), share,
                  link);
    os << line;
    os << "        in:  " << tensor_list(g, c.inputs) << "\n";
    os << "        out: " << tensor_list(g, c.outputs) << "\n";
  }
  std::snprintf(line, sizeof line, "%.3f", plan.imbalance);
  os << "imbalance " << line
     << (priced ? " (largest device time, links included, / mean device time)\n"
                : " (largest device cost / mean device cost)\n");
}

}  // namespace pt
