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

}  // namespace

int fuse_gelu(Graph& g) {
  std::vector<bool> gone(g.nodes.size(), false);
  int fused = 0;
  for (size_t e = 0; e < g.nodes.size(); ++e) {
    const auto five = gelu_at(g, static_cast<int>(e));
    if (!five) continue;
    const Node& div = g.nodes[static_cast<size_t>((*five)[0])];
    Node& half = g.nodes[static_cast<size_t>((*five)[4])];
    Node gelu{half.name, "Gelu", "", {div.inputs[0]}, {half.outputs[0]}, {{"approximate", std::string("none")}}};
    for (size_t k = 0; k < 4; ++k) gone[static_cast<size_t>((*five)[k])] = true;
    half = std::move(gelu);  // at the last node's place: x is made before, y read after
    ++fused;
  }
  if (fused == 0) return 0;
  g.remove_nodes(gone);
  // The scalars only the five read leave the initializers (and the buffers `inspect` lists).
  std::vector<ValueId> initializers;
  for (ValueId v : g.initializers) {
    if (!g.value(v).consumers.empty() || is_graph_output(g, v)) initializers.push_back(v);
    else g.buffers.erase(g.value(v).name);
  }
  g.initializers = std::move(initializers);
  return fused;
}

}  // namespace pt
