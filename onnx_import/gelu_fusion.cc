#include "onnx_import/gelu_fusion.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <vector>

namespace pt {
namespace {

bool is_graph_output(const Graph& g, ValueId v) {
  return std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end();
}

// The node (of the default domain, op `op`) that alone reads v, v no graph output; -1 else.
int lone_reader(const Graph& g, ValueId v, const char* op) {
  const Value& val = g.value(v);
  if (val.consumers.size() != 1 || is_graph_output(g, v)) return -1;
  const Node& n = g.nodes[static_cast<size_t>(val.consumers[0])];
  return n.domain.empty() && n.op_type == op && n.outputs.size() == 1 ? val.consumers[0] : -1;
}

// Whether v is a float scalar constant within float rounding of `want`.
bool is_scalar(const Graph& g, ValueId v, double want) {
  const Value& val = g.value(v);
  if (!val.init || val.type.dtype != DType::kFloat32 || val.type.numel() != 1) return false;
  return std::fabs(val.init->as<float>()[0] - want) <= 1e-6 * want;
}

// Of a two-input node reading `known`, the other input; kNoValue when it reads `known` twice or
// not at all.
ValueId other_input(const Node& n, ValueId known) {
  if (n.inputs.size() != 2 || (n.inputs[0] == known) == (n.inputs[1] == known)) return kNoValue;
  return n.inputs[0] == known ? n.inputs[1] : n.inputs[0];
}

// The five nodes of one GELU around the Erf at index e, or nullopt: Div, Erf, Add, Mul (x), Mul
// (0.5), the last one's output GELU's.
std::optional<std::vector<int>> gelu_at(const Graph& g, int e) {
  const Node& erf = g.nodes[static_cast<size_t>(e)];
  if (!erf.domain.empty() || erf.op_type != "Erf" || erf.inputs.size() != 1 || erf.outputs.size() != 1)
    return std::nullopt;
  const ValueId d = erf.inputs[0];
  const int div = g.value(d).producer;
  if (div < 0 || lone_reader(g, d, "Erf") != e) return std::nullopt;
  const Node& dn = g.nodes[static_cast<size_t>(div)];
  if (!dn.domain.empty() || dn.op_type != "Div" || dn.inputs.size() != 2 || !is_scalar(g, dn.inputs[1], std::sqrt(2.0)))
    return std::nullopt;
  const ValueId x = dn.inputs[0];
  const TensorType& t = g.value(x).type;
  const int add = lone_reader(g, erf.outputs[0], "Add");
  if (add < 0 || !is_scalar(g, other_input(g.nodes[static_cast<size_t>(add)], erf.outputs[0]), 1.0))
    return std::nullopt;
  const int mul = lone_reader(g, g.nodes[static_cast<size_t>(add)].outputs[0], "Mul");
  if (mul < 0 || other_input(g.nodes[static_cast<size_t>(mul)], g.nodes[static_cast<size_t>(add)].outputs[0]) != x)
    return std::nullopt;
  const int half = lone_reader(g, g.nodes[static_cast<size_t>(mul)].outputs[0], "Mul");
  if (half < 0 || !is_scalar(g, other_input(g.nodes[static_cast<size_t>(half)], g.nodes[static_cast<size_t>(mul)].outputs[0]), 0.5))
    return std::nullopt;
  for (int i : {div, e, add, mul, half})
    if (!(g.value(g.nodes[static_cast<size_t>(i)].outputs[0]).type == t)) return std::nullopt;
  if (t.dtype != DType::kFloat32) return std::nullopt;
  return std::vector<int>{div, e, add, mul, half};
}

// The operand of the two-input node n other than a float scalar within float rounding of c;
// kNoValue when neither (or both) is.
ValueId scaled_operand(const Graph& g, const Node& n, double c) {
  if (n.inputs.size() != 2) return kNoValue;
  const bool first = is_scalar(g, n.inputs[0], c), second = is_scalar(g, n.inputs[1], c);
  if (first == second) return kNoValue;
  return first ? n.inputs[1] : n.inputs[0];
}

// The producer of v when it is a `op` node read by `reader` alone; -1 else.
int sole_producer(const Graph& g, ValueId v, const char* op, int reader) {
  const int p = g.value(v).producer;
  if (p < 0 || lone_reader(g, v, g.nodes[static_cast<size_t>(reader)].op_type.c_str()) != reader) return -1;
  const Node& n = g.nodes[static_cast<size_t>(p)];
  return n.domain.empty() && n.op_type == op && n.outputs.size() == 1 ? p : -1;
}

// The eight nodes of one tanh GELU around the Tanh at index t (GPT-2's gelu_new as the default
// exporter writes it), or nullopt:
//   y = Mul(Mul(x, 0.5), Add(Tanh(Mul(Add(x, Mul(Pow(x, 3), 0.044715)), sqrt(2 / pi))), 1))
// as {Mul (0.5), Pow, Mul (0.044715), Add, Mul (sqrt(2 / pi)), Tanh, Add (1), Mul}, the last
// one's output GELU's.
std::optional<std::vector<int>> tanh_gelu_at(const Graph& g, int t) {
  const Node& tanh = g.nodes[static_cast<size_t>(t)];
  if (!tanh.domain.empty() || tanh.op_type != "Tanh" || tanh.inputs.size() != 1 || tanh.outputs.size() != 1)
    return std::nullopt;
  const int scale = sole_producer(g, tanh.inputs[0], "Mul", t);
  if (scale < 0) return std::nullopt;
  const ValueId inner = scaled_operand(g, g.nodes[static_cast<size_t>(scale)], std::sqrt(2.0 / M_PI));
  const int sum = inner == kNoValue ? -1 : sole_producer(g, inner, "Add", scale);
  if (sum < 0) return std::nullopt;
  // Add(x, Mul(Pow(x, 3), 0.044715)), either order.
  const Node& sn = g.nodes[static_cast<size_t>(sum)];
  if (sn.inputs.size() != 2) return std::nullopt;
  int cube_scale = -1;
  ValueId x = kNoValue;
  for (size_t k = 0; k < 2 && cube_scale < 0; ++k) {
    cube_scale = sole_producer(g, sn.inputs[k], "Mul", sum);
    x = sn.inputs[1 - k];
  }
  if (cube_scale < 0) return std::nullopt;
  const ValueId cubed = scaled_operand(g, g.nodes[static_cast<size_t>(cube_scale)], 0.044715);
  const int pow = cubed == kNoValue ? -1 : sole_producer(g, cubed, "Pow", cube_scale);
  if (pow < 0) return std::nullopt;
  const Node& pn = g.nodes[static_cast<size_t>(pow)];
  if (pn.inputs.size() != 2 || pn.inputs[0] != x || !is_scalar(g, pn.inputs[1], 3.0)) return std::nullopt;
  const int plus_one = lone_reader(g, tanh.outputs[0], "Add");
  if (plus_one < 0 || !is_scalar(g, other_input(g.nodes[static_cast<size_t>(plus_one)], tanh.outputs[0]), 1.0))
    return std::nullopt;
  const ValueId po = g.nodes[static_cast<size_t>(plus_one)].outputs[0];
  const int out = lone_reader(g, po, "Mul");
  if (out < 0) return std::nullopt;
  const ValueId h = other_input(g.nodes[static_cast<size_t>(out)], po);
  const int half = h == kNoValue ? -1 : sole_producer(g, h, "Mul", out);
  if (half < 0 || scaled_operand(g, g.nodes[static_cast<size_t>(half)], 0.5) != x) return std::nullopt;
  const TensorType& type = g.value(x).type;
  if (type.dtype != DType::kFloat32) return std::nullopt;
  const std::vector<int> nodes{half, pow, cube_scale, sum, scale, t, plus_one, out};
  for (int i : nodes)
    if (!(g.value(g.nodes[static_cast<size_t>(i)].outputs[0]).type == type)) return std::nullopt;
  return nodes;
}

}  // namespace

int fuse_gelu(Graph& g) {
  std::vector<bool> gone(g.nodes.size(), false);
  int fused = 0;
  for (size_t e = 0; e < g.nodes.size(); ++e) {
    // The matched nodes, the last one's output the GELU's, and the GELU's input x.
    std::optional<std::vector<int>> nodes = gelu_at(g, static_cast<int>(e));
    const char* approximate = "none";
    ValueId x = kNoValue;
    if (nodes) {
      x = g.nodes[static_cast<size_t>(nodes->front())].inputs[0];  // the Div's
    } else if ((nodes = tanh_gelu_at(g, static_cast<int>(e)))) {
      approximate = "tanh";
      x = g.nodes[static_cast<size_t>((*nodes)[1])].inputs[0];  // the Pow's
    } else {
      continue;
    }
    Node& last = g.nodes[static_cast<size_t>(nodes->back())];
    Node gelu{last.name, "Gelu", "", {x}, {last.outputs[0]}, {{"approximate", std::string(approximate)}}};
    for (size_t k = 0; k + 1 < nodes->size(); ++k) gone[static_cast<size_t>((*nodes)[k])] = true;
    last = std::move(gelu);  // at the last node's place: x is made before, y read after
    ++fused;
  }
  if (fused == 0) return 0;
  g.remove_nodes(gone);
  // The scalars only the fused nodes read leave the initializers (and the buffers `inspect` lists).
  std::vector<ValueId> initializers;
  for (ValueId v : g.initializers) {
    if (!g.value(v).consumers.empty() || is_graph_output(g, v)) initializers.push_back(v);
    else g.buffers.erase(g.value(v).name);
  }
  g.initializers = std::move(initializers);
  return fused;
}

}  // namespace pt
