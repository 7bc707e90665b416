#include "cli/report.h"

#include <cstdio>
#include <map>
#include <ostream>

#include "onnx_import/op_table.h"
#include "partition/linear_partition.h"

namespace pt {
namespace {

nlohmann::json tensors_json(const Graph& g, const std::vector<ValueId>& ids) {
  nlohmann::json arr = nlohmann::json::array();
  for (ValueId v : ids)
    arr.push_back({{"name", g.value(v).name},
                   {"shape", g.value(v).type.shape},
                   {"dtype", dtype_name(g.value(v).type.dtype)}});
  return arr;
}

std::string tensor_list(const Graph& g, const std::vector<ValueId>& ids) {
  std::string s;
  for (ValueId v : ids) s += (s.empty() ? "" : ", ") + g.value(v).name + " " + g.value(v).type.str();
  return s.empty() ? "-" : s;
}

std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

}  // namespace

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
  os << "imbalance " << fixed(plan.imbalance, 3)
     << (priced ? " (largest device time, links included, / mean device time)\n"
                : " (largest device cost / mean device cost)\n");
}

std::vector<InitializerRole> initializer_roles(const Graph& g) {
  const std::vector<bool> reached = gradient_reaches(g);
  std::vector<InitializerRole> out;
  for (ValueId v : g.initializers) {
    const Value& val = g.value(v);
    if (!val.is_parameter()) continue;
    InitializerRole r{val.name, reached[static_cast<size_t>(v)], ""};
    if (!r.trained) {
      for (int n : val.consumers) {
        const Node& node = g.nodes[static_cast<size_t>(n)];
        if (node.op_type == "BatchNormalization") r.why = "BatchNorm running statistic";
      }
      if (r.why.empty()) r.why = "read only where no gradient flows, e.g. a mask";
    }
    out.push_back(r);
  }
  for (const auto& [name, why] : g.buffers) out.push_back({name, false, why});
  return out;
}

namespace {

nlohmann::json initializers_json(const Graph& g) {
  nlohmann::json list = nlohmann::json::array();
  for (const InitializerRole& r : initializer_roles(g))
    list.push_back({{"name", r.name}, {"type", g.value(g.find(r.name)).type.str()}, {"trained", r.trained}});
  return list;
}

// What import did to give back the module's parameters (onnx_import/module_params.h).
void print_parameter_notes(std::ostream& os, const Graph& g) {
  if (g.parameter_notes.empty()) return;
  os << "module parameters the file merged or folded (parameters.tied / untied / trained override):\n";
  for (const ParameterNote& n : g.parameter_notes)
    os << "  " << n.initializer << ": " << n.action << "  (" << n.why << ")\n";
}

nlohmann::json parameter_notes_json(const Graph& g) {
  nlohmann::json list = nlohmann::json::array();
  for (const ParameterNote& n : g.parameter_notes)
    list.push_back({{"initializer", n.initializer}, {"action", n.action}, {"why", n.why}});
  return list;
}

}  // namespace

void print_inspect(std::ostream& os, const Graph& g, const std::vector<NodeCost>& costs, const ModelWork& work,
                   const std::string& model_path, int64_t micro_batch, bool list_nodes) {
  std::map<std::string, int> histogram;
  for (const Node& n : g.nodes) histogram[n.op_type]++;
  const NodeCost total = total_cost(costs);
  os << model_path << ": opset " << g.opset()
     << (g.source_opset && g.source_opset != g.opset() ? " (the file's " + std::to_string(g.source_opset) + ", adapted)" : "")
     << ", " << g.nodes.size() << " nodes (after folding), "
     << format_count(double(g.parameter_count())) << " parameters ("
     << format_bytes(g.parameter_bytes()) << ")\n";
  for (ValueId v : g.inputs) os << "input  " << g.value(v).name << " " << g.value(v).type.str() << "\n";
  for (ValueId v : g.outputs) os << "output " << g.value(v).name << " " << g.value(v).type.str() << "\n";
  const double b = double(micro_batch);
  os << "FLOPs per sample: forward " << format_count(double(work.work.f.flops_fwd) / b) << ", backward-input "
     << format_count(double(work.work.b.flops_fwd) / b) << ", backward-weight "
     << format_count(double(work.work.w.flops_fwd) / b) << "; kept activations per sample "
     << format_bytes(total.saved_bytes / micro_batch) << "\n";
  if (!work.why_estimated.empty())
    os << "  (B and W per-node estimates: autodiff refuses the model: " << work.why_estimated << ")\n";
  os << "ops:";
  for (const auto& [op, count] : histogram) os << " " << op << "=" << count;
  os << "\nunsupported: none\n";
  const std::vector<InitializerRole> roles = initializer_roles(g);
  int buffers = 0;
  for (const InitializerRole& r : roles) buffers += !r.trained;
  os << "initializers: " << roles.size() - static_cast<size_t>(buffers) << " trained, " << buffers
     << " look like buffers (no gradient reaches them; `pipetrain train` leaves them unchanged, "
        "parameters.frozen can name more)\n";
  for (const InitializerRole& r : roles)
    os << "  " << (r.trained ? "trained " : "buffer  ") << r.name << " " << g.value(g.find(r.name)).type.str()
       << (r.why.empty() ? "" : "  (" + r.why + ")") << "\n";
  print_parameter_notes(os, g);
  if (!list_nodes) return;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    os << i << " " << n.name << " " << n.op_type << " fwd=" << costs[i].flops_fwd
       << " bwd=" << costs[i].flops_bwd() << " saved=" << costs[i].saved_bytes << "\n";
  }
}

nlohmann::json inspect_json(const Graph& g, const std::vector<NodeCost>& costs, const ModelWork& work) {
  std::map<std::string, int> histogram;
  for (const Node& n : g.nodes) histogram[n.op_type]++;
  const NodeCost total = total_cost(costs);
  return {{"opset", g.opset()},
          {"nodes", g.nodes.size()},
          {"ops", histogram},
          {"params", g.parameter_count()},
          {"param_bytes", g.parameter_bytes()},
          {"flops_fwd", work.work.f.flops_fwd},
          {"flops_bwd_input", work.work.b.flops_fwd},
          {"flops_bwd_weight", work.work.w.flops_fwd},
          {"flops_from", !work.why_estimated.empty() ? "node estimates: " + work.why_estimated
                         : work.cut_after.empty() ? "derived graphs"
                                                  : "derived graphs, cut after " + work.cut_after},
          {"saved_bytes", total.saved_bytes},
          {"inputs", tensors_json(g, g.inputs)},
          {"outputs", tensors_json(g, g.outputs)},
          {"unsupported", nlohmann::json::array()},
          {"initializers", initializers_json(g)},
          {"module_parameters", parameter_notes_json(g)}};
}

void print_chunk_times(std::ostream& os, const Schedule& s, const Costs& planned, const Costs& measured) {
  bool fused = false;
  for (const auto& actions : s.devices)
    for (const Action& a : actions) fused = fused || a.op == Op::kBW;
  double units = 0, seconds = 0;
  for (size_t c = 0; c < planned.chunks.size(); ++c) {
    units += planned.chunks[c].f + planned.chunks[c].b + planned.chunks[c].w;
    seconds += measured.chunks[c].f + measured.chunks[c].b + measured.chunks[c].w;
  }
  if (units <= 0 || seconds <= 0) return;
  const double ms_per_unit = seconds * 1e3 / units;
  os << "per chunk, measured ms / cost model ms (at the run's rate, " << fixed(1 / (ms_per_unit * 1e-3), 2)
     << " GFLOP-equivalents/s) = ratio:\n";
  const auto cell = [&](const char* name, double have, double want) {
    os << "  " << name << " " << fixed(have * 1e3, 3) << " / " << fixed(want * ms_per_unit, 3) << " = "
       << (want > 0 ? fixed(have * 1e3 / (want * ms_per_unit), 2) : std::string("-"));
  };
  for (size_t c = 0; c < planned.chunks.size(); ++c) {
    const ChunkCost& p = planned.chunks[c];
    const ChunkCost& m = measured.chunks[c];
    os << "  chunk " << c << " (device " << s.device_of(static_cast<int>(c)) << "):";
    cell("F", m.f, p.f);
    if (fused) {
      cell("BW", m.b + m.w, p.b + p.w);
    } else {
      cell("B", m.b, p.b);
      cell("W", m.w, p.w);
    }
    os << "\n";
  }
}

void print_op_table(std::ostream& os) {
  for (const OpEntry& e : op_table()) {
    std::string name = std::string(e.domain).empty() ? e.op_type : std::string(e.domain) + "::" + e.op_type;
    char line[256];
    std::snprintf(line, sizeof line, "%-28s %-9s %-7s %s\n", name.c_str(),
                  e.support == OpSupport::kRun ? "run" : e.support == OpSupport::kFoldOnly ? "fold-only" : "rewritten", opset_range(e).c_str(), e.note);
    os << line;
  }
}

}  // namespace pt
