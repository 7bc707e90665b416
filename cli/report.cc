#include "cli/report.h"

#include <cstdio>
#include <map>
#include <ostream>
#include <set>

#include "onnx_import/op_table.h"
#include "partition/initializer_roles.h"
#include "partition/partition_report.h"

namespace pt {
namespace {

std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

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

// Initializer -> its float16/bfloat16 dtype in the file, for those import widened.
nlohmann::json file_dtypes_json(const Graph& g) {
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [name, dtype] : g.file_dtypes) map[name] = dtype_name(dtype);
  return map;
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
  if (const std::string half = half_weights_line(g); !half.empty()) os << half << "\n";
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
          {"module_parameters", parameter_notes_json(g)},
          {"file_dtypes", file_dtypes_json(g)}};
}

std::string half_weights_line(const Graph& g, bool float32_out) {
  if (g.file_dtypes.empty()) return "";
  std::set<std::string> names;
  for (const auto& [name, dtype] : g.file_dtypes) names.insert(dtype_name(dtype));
  std::string held;
  for (const std::string& n : names) held += (held.empty() ? "" : " and ") + n;
  return "weights: " + held + " in the file (" + std::to_string(g.file_dtypes.size()) +
         " initializers), trained as float32 master weights; " +
         (float32_out ? "written as float32 (output.dtype: fp32)" : "written back as " + held + " (output.dtype: fp32 writes float32)");
}

void print_chunk_times(std::ostream& os, const Schedule& s, const Costs& planned, const Costs& measured,
                       bool thread_cpu) {
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
  os << "per chunk, measured ms (the median action's " << (thread_cpu ? "thread CPU time" : "wall time")
     << ") / cost model ms (at the run's rate, " << fixed(1 / (ms_per_unit * 1e-3), 2)
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
