#include "core/ir.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace pt {
namespace {

TEST(TensorType, BytesAndText) {
  TensorType t{DType::kFloat32, {8, 128, 256}};
  EXPECT_EQ(t.numel(), 8 * 128 * 256);
  EXPECT_EQ(t.bytes(), 4 * 8 * 128 * 256);
  EXPECT_EQ(t.str(), "float32[8,128,256]");
  TensorType scalar{DType::kInt64, {}};
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.str(), "int64[]");
}

TEST(Graph, UsesFollowNodes) {
  Graph g;
  ValueId x = g.add_value("x", {DType::kFloat32, {2, 3}});
  Tensor w;
  w.type = {DType::kFloat32, {3, 4}};
  w.data.resize(static_cast<size_t>(w.type.bytes()));
  ValueId wv = g.add_initializer("w", w);
  ValueId y = g.add_value("y", {DType::kFloat32, {2, 4}});
  ValueId z = g.add_value("z", {DType::kFloat32, {2, 4}});
  g.add_node(Node{"mm", "MatMul", "", {x, wv}, {y}, {}});
  g.add_node(Node{"r", "Relu", "", {y}, {z}, {}});
  g.inputs = {x};
  g.outputs = {z};
  g.rebuild_uses();
  EXPECT_EQ(g.value(y).producer, 0);
  EXPECT_EQ(g.value(y).consumers, std::vector<int>{1});
  EXPECT_EQ(g.value(x).producer, -1);
  EXPECT_EQ(g.find("w"), wv);
  EXPECT_EQ(g.find("nope"), kNoValue);
  EXPECT_EQ(g.parameter_count(), 12);
  EXPECT_EQ(g.parameter_bytes(), 48);
}

TEST(UserError, IsOneLine) {
  UserError e("m.onnx: node 'a' (Foo)", "op not supported\nat all", "see `pipetrain ops`");
  EXPECT_STREQ(e.what(), "m.onnx: node 'a' (Foo): op not supported at all; see `pipetrain ops`");
}

}  // namespace
}  // namespace pt
