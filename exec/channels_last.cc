#include "exec/channels_last.h"

#include <algorithm>
#include <set>
#include <string>

namespace pt {
namespace {

bool is_conv(const Node& n) { return n.domain.empty() && n.op_type == "Conv"; }

// Readers that take a channels-last X as it is: a Conv, and GlobalAveragePool (nn_channel.cc),
// whose (N, C, 1, 1) output is the same bytes either way.
bool reads_channels_last(const Node& n) {
  return is_conv(n) || (n.domain.empty() && n.op_type == "GlobalAveragePool");
}

bool four_d_float(const Value& v) { return v.type.dtype == DType::kFloat32 && v.type.shape.size() == 4; }

// A pointwise op whose full-size inputs have its output's shape, the rest one element each.
bool chain_pointwise(const Graph& g, const Node& n) {
  static const std::set<std::string> kOps = {"Clip", "Relu", "LeakyRelu", "HardSigmoid", "HardSwish",
                                             "Sigmoid", "Tanh", "Add", "Sub", "Mul", "Div"};
  if (!n.domain.empty() || !kOps.count(n.op_type) || n.outputs.size() != 1 || n.outputs[0] == kNoValue) return false;
  const Value& y = g.value(n.outputs[0]);
  if (!four_d_float(y)) return false;
  for (ValueId v : n.inputs) {
    if (v == kNoValue) continue;
    const TensorType& t = g.value(v).type;
    if (t.numel() != 1 && (t.shape != y.type.shape || t.dtype != y.type.dtype)) return false;
  }
  return true;
}

// A BatchNormalization of 4-D float data: Y is X normalised per channel, which its kernel does
// channels-last as well as plain (exec/cpu/nn_channel.cc), with the same bits. It joins the
// chain as a pointwise op does: X and Y chosen together, the per-channel inputs and the running
// statistics (one dimension) never.
bool chain_batch_norm(const Graph& g, const Node& n) {
  return n.domain.empty() && n.op_type == "BatchNormalization" && !n.inputs.empty() && !n.outputs.empty() &&
         n.outputs[0] != kNoValue && four_d_float(g.value(n.inputs[0])) &&
         g.value(n.inputs[0]).type == g.value(n.outputs[0]).type;
}

bool full_size(const Graph& g, ValueId input, ValueId output) {
  return g.value(input).type.shape == g.value(output).type.shape;
}

}  // namespace

std::vector<bool> channels_last_values(const Graph& g) {
  std::vector<bool> chosen(g.values.size(), false);
  std::vector<bool> pointwise(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    pointwise[i] = chain_pointwise(g, g.nodes[i]) || chain_batch_norm(g, g.nodes[i]);
  std::vector<bool> is_output(g.values.size(), false);
  for (ValueId v : g.outputs) is_output[static_cast<size_t>(v)] = true;

  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.value(static_cast<ValueId>(v));
    if (val.producer < 0 || is_output[v] || val.init || !four_d_float(val)) continue;
    const Node& p = g.nodes[static_cast<size_t>(val.producer)];
    if (!(is_conv(p) && p.outputs[0] == static_cast<ValueId>(v)) && !pointwise[static_cast<size_t>(val.producer)])
      continue;
    bool readers_take_it = true;
    for (int c : val.consumers) {
      const Node& r = g.nodes[static_cast<size_t>(c)];
      for (size_t k = 0; k < r.inputs.size(); ++k) {
        if (r.inputs[k] != static_cast<ValueId>(v)) continue;
        const bool as_x = reads_channels_last(r) && k == 0;
        const bool as_operand = pointwise[static_cast<size_t>(c)] && full_size(g, r.inputs[k], r.outputs[0]);
        if (!as_x && !as_operand) readers_take_it = false;
      }
    }
    chosen[v] = readers_take_it;
  }

  // A pointwise op's output and full-size inputs go together: drop every group with one left
  // out, until no group is split (dropping one can split a neighbouring group).
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!pointwise[i]) continue;
    const Node& n = g.nodes[i];
    std::vector<size_t> group = {static_cast<size_t>(n.outputs[0])};
    for (ValueId v : n.inputs)
      if (v != kNoValue && full_size(g, v, n.outputs[0])) group.push_back(static_cast<size_t>(v));
    groups.push_back(std::move(group));
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (const std::vector<size_t>& group : groups) {
      if (std::all_of(group.begin(), group.end(), [&](size_t v) { return chosen[v]; })) continue;
      for (size_t v : group) {
        changed = changed || chosen[v];
        chosen[v] = false;
      }
    }
  }
  return chosen;
}

}  // namespace pt
