#include "core/ir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>

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

// A stored tensor (an initializer left in its external-data file) is read at its first use, once;
// a file changed since import, or a NaN in it, is one line naming the tensor and the file.
TEST(Tensor, LoadsStoredBytesOnFirstRead) {
  const std::string file = ::testing::TempDir() + "pt_stored_" + std::to_string(::getpid()) + ".data";
  const float values[4] = {1.5f, -2.0f, 3.25f, 4.0f};
  std::string bytes(16, '\0');
  std::memcpy(bytes.data(), values, 16);
  std::FILE* f = std::fopen(file.c_str(), "wb");
  std::fwrite("pad", 1, 3, f);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  Tensor t;
  t.type = TensorType{DType::kFloat32, {2, 2}};
  t.stored = std::make_shared<const StoredBytes>(StoredBytes{"m.onnx: initializer 'w'", file, 3, 16});
  EXPECT_FALSE(t.resident());
  EXPECT_TRUE(t.data.empty());
  const Tensor copy = t;  // copies share the range, each reads its own bytes
  const int64_t before = stored_bytes_loaded();
  EXPECT_EQ(t.as<float>()[2], 3.25f);
  EXPECT_TRUE(t.resident());
  EXPECT_EQ(stored_bytes_loaded() - before, 16);
  t.load();
  EXPECT_EQ(stored_bytes_loaded() - before, 16);
  EXPECT_FALSE(copy.resident());

  Tensor skipped = copy;
  skipped.skip_load();
  EXPECT_TRUE(skipped.resident());
  EXPECT_EQ(skipped.data.size(), 16u);
  EXPECT_EQ(stored_bytes_loaded() - before, 16);

  // The message of loading `copy` from `offset` of the file ("" when it loads).
  const auto load_error = [&](int64_t offset) {
    Tensor t = copy;
    t.stored = std::make_shared<const StoredBytes>(StoredBytes{"m.onnx: initializer 'w'", file, offset, 16});
    try {
      t.load();
    } catch (const UserError& e) {
      EXPECT_FALSE(t.resident());
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(load_error(4), "m.onnx: initializer 'w': cannot read 16 bytes from byte 4 of its external data file '" + file +
                               "' (changed or truncated since import); keep the data file beside the model, as it "
                               "was exported");

  const float nan[4] = {0, 0, std::nanf(""), 0};
  std::memcpy(bytes.data(), nan, 16);
  f = std::fopen(file.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  EXPECT_EQ(load_error(0), "m.onnx: initializer 'w': holds NaN (element 2 of float32[2,2]); export the model again "
                           "from finite weights");
  std::remove(file.c_str());
}

TEST(UserError, IsOneLine) {
  UserError e("m.onnx: node 'a' (Foo)", "op not supported\nat all", "see `pipetrain ops`");
  EXPECT_STREQ(e.what(), "m.onnx: node 'a' (Foo): op not supported at all; see `pipetrain ops`");
}

}  // namespace
}  // namespace pt
