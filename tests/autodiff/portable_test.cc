// tests/autodiff/portable_test.cc: the shape of lower_to_standard's result, for every case of
// portable_cases.h (every pipetrain-domain op): no pipetrain node or opset import is left, the
// default opset is >= 17, the node's outputs keep their names and types and are produced, and
// the nodes stay in topological order. Whether the lowered graphs compute the right numbers is
// the onnxruntime oracle's job (oracle.portable_ops_onnxruntime).
#include "autodiff/portable.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "core/pipetrain_ops.h"
#include "onnx_import/export.h"
#include "tests/autodiff/portable_cases.h"

namespace pt {
namespace {

// Every value a node reads is a graph input, an initializer or made by an earlier node.
void expect_topological(const Graph& g, const std::string& label) {
  std::set<ValueId> known(g.inputs.begin(), g.inputs.end());
  known.insert(g.initializers.begin(), g.initializers.end());
  for (const Node& n : g.nodes) {
    for (ValueId v : n.inputs)
      EXPECT_TRUE(v == kNoValue || known.count(v))
          << label << ": " << n.label() << " reads " << g.value(v).name << " before it is made";
    for (ValueId v : n.outputs)
      if (v != kNoValue) EXPECT_TRUE(known.insert(v).second) << label << ": " << g.value(v).name;
  }
}

TEST(Portable, EveryCaseLowersToStandardOps) {
  for (const PortableCase& c : portable_cases()) {
    const Graph before = case_graph(c);
    Graph g = before;
    lower_to_standard(g);
    for (const Node& n : g.nodes) EXPECT_NE(n.domain, kPipetrainDomain) << c.name;
    EXPECT_EQ(g.opsets.count(kPipetrainDomain), 0u) << c.name;
    EXPECT_GE(g.opset(), 17) << c.name;
    EXPECT_GE(g.ir_version, 8) << c.name;
    EXPECT_GT(g.nodes.size(), 0u) << c.name;
    ASSERT_EQ(g.outputs.size(), before.outputs.size()) << c.name;
    for (size_t k = 0; k < before.outputs.size(); ++k) {
      const Value& was = before.value(before.outputs[k]);
      const Value& now = g.value(g.outputs[k]);
      EXPECT_EQ(now.name, was.name) << c.name;
      EXPECT_EQ(now.type, was.type) << c.name << " " << was.name;
      EXPECT_GE(now.producer, 0) << c.name << ": nothing makes " << was.name;
    }
    ASSERT_EQ(g.inputs.size(), before.inputs.size()) << c.name;
    for (size_t k = 0; k < before.inputs.size(); ++k)
      EXPECT_EQ(g.value(g.inputs[k]).name, before.value(before.inputs[k]).name) << c.name;
    expect_topological(g, c.name);
  }
}

TEST(Portable, CasesCoverEveryOpOfTheSpec) {
  std::set<std::string> ops;
  for (const PortableCase& c : portable_cases()) ops.insert(c.op);
  // core/pipetrain_ops.h, in its order, less SeededDropout (no portable form; tested below).
  const std::set<std::string> spec = {
      "ReluGrad", "ClipGrad", "ErfGrad", "GeluGrad", "SoftmaxGrad", "LogSoftmaxGrad",
      "LayerNormGrad", "BatchNormGrad", "BatchNormTraining", "ConvGradInput", "ConvGradWeight",
      "MaxPoolGrad", "AveragePoolGrad", "GatherGrad", "SoftmaxCrossEntropy",
      "SoftmaxCrossEntropyGrad", "FusedAttention", "FusedAttentionGrad"};
  EXPECT_EQ(ops, spec);
}

// Standard nodes pass through unchanged; a lower opset is raised.
TEST(Portable, LeavesStandardNodesAndRaisesOpset) {
  Graph g;
  g.opsets = {{"", 13}};
  const ValueId x = g.add_value("x", TensorType{DType::kFloat32, {2, 3}});
  const ValueId y = g.add_value("y", TensorType{DType::kFloat32, {2, 3}});
  g.inputs = {x};
  g.outputs = {y};
  g.add_node(Node{"relu", "Relu", "", {x}, {y}, {}});
  g.rebuild_uses();
  lower_to_standard(g);
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op_type, "Relu");
  EXPECT_EQ(g.nodes[0].inputs, std::vector<ValueId>{x});
  EXPECT_EQ(g.opset(), 17);
}

TEST(Portable, UnknownPipetrainOpNamesTheNode) {
  Graph g;
  const ValueId x = g.add_value("x", TensorType{DType::kFloat32, {2}});
  const ValueId y = g.add_value("y", TensorType{DType::kFloat32, {2}});
  g.inputs = {x};
  g.outputs = {y};
  g.add_node(Node{"odd", "TanhGrad", kPipetrainDomain, {x}, {y}, {}});
  g.rebuild_uses();
  try {
    lower_to_standard(g);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'odd' (TanhGrad)"), std::string::npos) << e.what();
  }
}

// SeededDropout is the one op of the spec without a portable form (no standard op draws its
// mask): the error names the node and says to export with dropout off.
TEST(Portable, SeededDropoutNamesTheNodeAndAsksForDropoutOff) {
  Graph g;
  const ValueId x = g.add_value("x", TensorType{DType::kFloat32, {2, 3}});
  const ValueId key = g.add_value("dropout_key", TensorType{DType::kInt64, {}});
  const ValueId y = g.add_value("y", TensorType{DType::kFloat32, {2, 3}});
  g.inputs = {x, key};
  g.outputs = {y};
  g.add_node(Node{"drop1", "SeededDropout", kPipetrainDomain, {x, key}, {y},
                  {{"ratio", 0.1f}, {"stream", int64_t{5}}}});
  g.rebuild_uses();
  try {
    lower_to_standard(g);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("node 'drop1' (SeededDropout)"), std::string::npos) << m;
    EXPECT_NE(m.find("dropout off"), std::string::npos) << m;
  }
}

TEST(Portable, GeluGradRejectsUnknownApproximation) {
  for (PortableCase c : portable_cases()) {
    if (c.op != "GeluGrad") continue;
    c.attrs["approximate"] = std::string("cubic");
    Graph g = case_graph(c);
    EXPECT_THROW(lower_to_standard(g), UserError);
  }
}

// The model written for an unlowered graph names the pipetrain domain on the node and imports it
// at version 1, even when the graph's opsets do not list it.
TEST(Portable, ExportImportsThePipetrainDomain) {
  Graph g = case_graph(portable_cases().front());
  g.opsets.erase(kPipetrainDomain);
  const onnx::ModelProto m = to_model_proto(g);
  ASSERT_EQ(m.graph().node_size(), 1);
  EXPECT_EQ(m.graph().node(0).domain(), kPipetrainDomain);
  int found = 0;
  for (const auto& o : m.opset_import())
    if (o.domain() == kPipetrainDomain) found += o.version() == 1 ? 1 : 100;
  EXPECT_EQ(found, 1);
}

}  // namespace
}  // namespace pt
