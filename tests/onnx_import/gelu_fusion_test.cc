// GELU as opset-17 exports write it (Div, Erf, Add, Mul, Mul) and GPT-2's tanh form (eight nodes)
// become one Gelu node at import (onnx_import/gelu_fusion.h), in either operand order, and only
// where the nodes are a GELU nothing else reads into.
#include "onnx_import/gelu_fusion.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "onnx_import/import.h"

namespace pt {
namespace {

std::map<std::string, int> op_counts(const Graph& g) {
  std::map<std::string, int> n;
  for (const Node& node : g.nodes) ++n[node.op_type];
  return n;
}

ValueId scalar(Graph& g, const std::string& name, float v) {
  Tensor t;
  t.type = {DType::kFloat32, {}};
  t.data.resize(4);
  t.as<float>()[0] = v;
  return g.add_initializer(name, std::move(t), true);
}

// x -> Div(x, sqrt 2) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5) -> y, with the Adds' and
// Muls' operands swapped when `swapped`, the half `half` and, when `leak`, the Erf's output a
// graph output too.
Graph expanded_gelu(bool swapped, float half, bool leak) {
  Graph g;
  const TensorType t{DType::kFloat32, {2, 8}};
  const ValueId x = g.add_value("x", t);
  const ValueId root2 = scalar(g, "root2", static_cast<float>(std::sqrt(2.0)));
  const ValueId one = scalar(g, "one", 1.f), h = scalar(g, "half", half);
  const ValueId d = g.add_value("d", t), e = g.add_value("e", t), a = g.add_value("a", t);
  const ValueId m = g.add_value("m", t), y = g.add_value("y", t);
  g.add_node(Node{"div", "Div", "", {x, root2}, {d}, {}});
  g.add_node(Node{"erf", "Erf", "", {d}, {e}, {}});
  g.add_node(Node{"add", "Add", "", swapped ? std::vector{one, e} : std::vector{e, one}, {a}, {}});
  g.add_node(Node{"mul", "Mul", "", swapped ? std::vector{a, x} : std::vector{x, a}, {m}, {}});
  g.add_node(Node{"half", "Mul", "", swapped ? std::vector{h, m} : std::vector{m, h}, {y}, {}});
  g.inputs = {x};
  g.outputs = {y};
  if (leak) g.outputs.push_back(e);
  g.opsets[""] = 17;
  g.rebuild_uses();
  return g;
}

TEST(GeluFusion, FiveNodesBecomeOneGeluInEitherOperandOrder) {
  for (const bool swapped : {false, true}) {
    Graph g = expanded_gelu(swapped, 0.5f, false);
    EXPECT_EQ(fuse_gelu(g), 1) << swapped;
    ASSERT_EQ(g.nodes.size(), 1u);
    const Node& gelu = g.nodes[0];
    EXPECT_EQ(gelu.op_type, "Gelu");
    EXPECT_EQ(gelu.attr_string("approximate", ""), "none");
    EXPECT_EQ(gelu.inputs, std::vector<ValueId>{g.inputs[0]});
    EXPECT_EQ(gelu.outputs, std::vector<ValueId>{g.outputs[0]});
    EXPECT_TRUE(g.initializers.empty()) << "the three scalars are read no more";
  }
}

TEST(GeluFusion, LeavesWhatIsNotAGelu) {
  Graph other_half = expanded_gelu(false, 0.25f, false);
  EXPECT_EQ(fuse_gelu(other_half), 0);
  EXPECT_EQ(other_half.nodes.size(), 5u);
  Graph leaked = expanded_gelu(false, 0.5f, true);
  EXPECT_EQ(fuse_gelu(leaked), 0);
  EXPECT_EQ(leaked.nodes.size(), 5u);
}

// GPT-2's gelu_new as the default exporter writes it: h = Mul(x, 0.5), Pow(x, 3), Mul(., 0.044715),
// Add(x, .), Mul(., sqrt(2 / pi)), Tanh, Add(., 1), y = Mul(h, .); operands swapped when
// `swapped`; `cube` the Pow's exponent; when `leak`, the Tanh's output a graph output too.
Graph expanded_tanh_gelu(bool swapped, float cube, bool leak) {
  Graph g;
  const TensorType t{DType::kFloat32, {2, 8}};
  const ValueId x = g.add_value("x", t);
  const ValueId half = scalar(g, "half", 0.5f), three = scalar(g, "three", cube);
  const ValueId c = scalar(g, "c", 0.044715f), root = scalar(g, "root", static_cast<float>(std::sqrt(2.0 / M_PI)));
  const ValueId one = scalar(g, "one", 1.f);
  std::vector<ValueId> v;
  for (const char* name : {"h", "p", "pc", "s", "u", "th", "o", "y"}) v.push_back(g.add_value(name, t));
  auto in = [swapped](ValueId a, ValueId b) { return swapped ? std::vector{b, a} : std::vector{a, b}; };
  g.add_node(Node{"half", "Mul", "", in(x, half), {v[0]}, {}});
  g.add_node(Node{"pow", "Pow", "", {x, three}, {v[1]}, {}});
  g.add_node(Node{"cube_scale", "Mul", "", in(v[1], c), {v[2]}, {}});
  g.add_node(Node{"sum", "Add", "", in(x, v[2]), {v[3]}, {}});
  g.add_node(Node{"scale", "Mul", "", in(v[3], root), {v[4]}, {}});
  g.add_node(Node{"tanh", "Tanh", "", {v[4]}, {v[5]}, {}});
  g.add_node(Node{"plus_one", "Add", "", in(v[5], one), {v[6]}, {}});
  g.add_node(Node{"out", "Mul", "", in(v[0], v[6]), {v[7]}, {}});
  g.inputs = {x};
  g.outputs = {v[7]};
  if (leak) g.outputs.push_back(v[5]);
  g.opsets[""] = 20;
  g.rebuild_uses();
  return g;
}

TEST(GeluFusion, EightNodesOfTheTanhFormBecomeOneGeluInEitherOperandOrder) {
  for (const bool swapped : {false, true}) {
    Graph g = expanded_tanh_gelu(swapped, 3.f, false);
    EXPECT_EQ(fuse_gelu(g), 1) << swapped;
    ASSERT_EQ(g.nodes.size(), 1u);
    const Node& gelu = g.nodes[0];
    EXPECT_EQ(gelu.op_type, "Gelu");
    EXPECT_EQ(gelu.name, "out");
    EXPECT_EQ(gelu.attr_string("approximate", ""), "tanh");
    EXPECT_EQ(gelu.inputs, std::vector<ValueId>{g.inputs[0]});
    EXPECT_EQ(gelu.outputs, std::vector<ValueId>{g.outputs[0]});
    EXPECT_TRUE(g.initializers.empty()) << "the five scalars are read no more";
  }
}

TEST(GeluFusion, LeavesWhatIsNotATanhGelu) {
  Graph square = expanded_tanh_gelu(false, 2.f, false);
  EXPECT_EQ(fuse_gelu(square), 0);
  EXPECT_EQ(square.nodes.size(), 8u);
  Graph leaked = expanded_tanh_gelu(true, 3.f, true);
  EXPECT_EQ(fuse_gelu(leaked), 0);
  EXPECT_EQ(leaked.nodes.size(), 8u);
}

// The opset-17 GPT and ViT samples: every GELU one node, no Erf left, and the constants gone.
TEST(GeluFusion, TheOpset17SamplesImportWithGeluNodes) {
  for (const auto& [name, blocks] : {std::pair{"gpt", 8}, std::pair{"vit", 4}}) {
    ImportOptions o;
    o.batch = 2;
    const Graph g = import_model(std::string("samples/") + name + "/" + name + ".onnx", o);
    const auto ops = op_counts(g);
    EXPECT_EQ(ops.count("Gelu") ? ops.at("Gelu") : 0, blocks) << name;
    EXPECT_EQ(ops.count("Erf"), 0u) << name;
    EXPECT_EQ(g.opset(), 17) << name;
  }
}

// Today's GPT-2 exports (transformers' gelu_new through the default exporter with and without
// its optimizer, and the legacy one): both GELUs one tanh Gelu each, no Pow or Tanh left.
TEST(GeluFusion, TodaysGpt2ExportsImportWithTanhGeluNodes) {
  for (const char* name : {"gpt2", "gpt2_noopt", "gpt2_legacy"}) {
    ImportOptions o;
    o.batch = 2;
    const Graph g = import_model(std::string("samples/exports/") + name + ".onnx", o);
    const auto ops = op_counts(g);
    EXPECT_EQ(ops.count("Gelu") ? ops.at("Gelu") : 0, 2) << name;
    EXPECT_EQ(ops.count("Tanh") + ops.count("Pow"), 0u) << name;
    for (const Node& n : g.nodes) {
      if (n.op_type != "Gelu") continue;
      EXPECT_EQ(n.attr_string("approximate", ""), "tanh") << name;
    }
  }
}

}  // namespace
}  // namespace pt
