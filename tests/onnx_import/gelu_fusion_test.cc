// GELU as opset-17 exports write it (Div, Erf, Add, Mul, Mul) becomes one Gelu node at import
// (onnx_import/gelu_fusion.h), in either operand order, and only where the five are a GELU
// nothing else reads into.
#include "onnx_import/gelu_fusion.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>

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

}  // namespace
}  // namespace pt
