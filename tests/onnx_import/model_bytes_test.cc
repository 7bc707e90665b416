// tests/onnx_import/model_bytes_test.cc: a model whose weights are inside the .onnx is parsed
// without them, each weight's range in the file kept in their place, and imported as stored
// tensors that read the same values.
#include "onnx_import/model_bytes.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/ir.h"
#include "onnx_import/import.h"
#include "onnx_import/load.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

void add_tensor(onnx::GraphProto* g, const std::string& name, int dtype, int64_t n, bool raw) {
  onnx::TensorProto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(dtype);
  t->add_dims(n);
  const size_t elem = dtype_size(static_cast<DType>(dtype));
  std::string bytes(static_cast<size_t>(n) * elem, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 7 + name.size()) % 251);
  if (raw) {
    t->set_raw_data(bytes);
  } else {
    for (int64_t i = 0; i < n; ++i) t->add_float_data(static_cast<float>(i) * 0.5f);
  }
}

// Y = X @ W + b ... as initializers of every kind the walk tells apart.
onnx::ModelProto model_with_inline_weights() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("g");
  add_tensor(g, "w", 1, 4096, true);      // float32, 16 KiB inline: left in the file
  add_tensor(g, "eps", 1, 1, true);       // float32, 4 bytes: kept (folds read such)
  add_tensor(g, "idx", 7, 1024, true);    // int64, 8 KiB: kept (shapes and indices)
  add_tensor(g, "typed", 1, 2048, false); // float_data, not raw_data: kept
  add_tensor(g, "h", 10, 4096, true);     // float16, 8 KiB: left
  onnx::NodeProto* n = g->add_node();
  n->set_op_type("Identity");
  *n->add_input() = std::string("w");
  *n->add_output() = std::string("y");
  g->add_output()->set_name("y");
  return m;
}

TEST(ModelBytes, LeavesFloatWeightsInTheFileAndSaysWhere) {
  const onnx::ModelProto m = model_with_inline_weights();
  const std::string file = m.SerializeAsString();
  onnx::ModelProto parsed;
  std::vector<InlineBytes> left;
  ASSERT_TRUE(parse_model_bytes(file, true, &parsed, &left));
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].initializer, 0);
  EXPECT_EQ(left[1].initializer, 4);
  for (const InlineBytes& b : left) {
    const onnx::TensorProto& src = m.graph().initializer(b.initializer);
    EXPECT_EQ(file.substr(static_cast<size_t>(b.offset), static_cast<size_t>(b.length)), src.raw_data());
    EXPECT_FALSE(parsed.graph().initializer(b.initializer).has_raw_data());
  }
  // Everything else is the model as protobuf parses it.
  onnx::ModelProto want = m;
  for (const InlineBytes& b : left) want.mutable_graph()->mutable_initializer(b.initializer)->clear_raw_data();
  EXPECT_EQ(parsed.SerializeAsString(), want.SerializeAsString());

  ASSERT_TRUE(parse_model_bytes(file, false, &parsed, &left));
  EXPECT_TRUE(left.empty());
  EXPECT_EQ(parsed.SerializeAsString(), file);
}

TEST(ModelBytes, GarbageIsNotAModel) {
  onnx::ModelProto parsed;
  std::vector<InlineBytes> left;
  const std::string file = model_with_inline_weights().SerializeAsString();
  EXPECT_FALSE(parse_model_bytes(file.substr(0, file.size() - 100), true, &parsed, &left));
  EXPECT_FALSE(parse_model_bytes(std::string(64, '\xff'), true, &parsed, &left));
  EXPECT_TRUE(left.empty());
}

// Import of the MLP sample (weights inline): its parameters are stored tensors read from the
// .onnx's own ranges when first used, equal to what a whole read gives.
TEST(ModelBytes, ImportReadsInlineWeightsWhenUsed) {
  const std::string path = "samples/mlp/mlp.onnx";
  const onnx::ModelProto whole = read_model(path, ExternalData::kInline);
  const onnx::ModelProto lean = read_model(path, ExternalData::kLeaveFloats);
  int located = 0;
  for (int i = 0; i < lean.graph().initializer_size(); ++i) {
    const onnx::TensorProto& t = lean.graph().initializer(i);
    if (t.data_location() != onnx::TensorProto::EXTERNAL) continue;
    ++located;
    EXPECT_FALSE(in_data_file(t)) << t.name();
    const Tensor stored = stored_tensor(t, t.name());
    EXPECT_FALSE(stored.resident());
    const Tensor read = tensor_from_proto(whole.graph().initializer(i), t.name());
    stored.load();
    EXPECT_TRUE(stored.data == read.data) << t.name();
  }
  EXPECT_GT(located, 0);
  EXPECT_LT(lean.ByteSizeLong(), whole.ByteSizeLong() / 4);

  const int64_t before = stored_bytes_loaded();
  const Graph g = import_model(path);
  int64_t params = 0;
  for (const Value& v : g.values)
    if (v.is_parameter() && v.init->stored && !v.init->resident()) params += v.init->stored->length;
  EXPECT_GT(params, 0);
  EXPECT_LT(stored_bytes_loaded() - before, params);  // import read what it folded, not the weights
}

}  // namespace
}  // namespace pt
