// onnx_import/widen_halves.h and what import and export make of it: float16/bfloat16 models
// (samples/half, as torch.onnx.export writes them after .half() and .to(torch.bfloat16)) import
// as float32 with the file's dtypes recorded and their external weights still on disk, each
// widened as it loads.
#include "onnx_import/widen_halves.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/half_floats.h"
#include "onnx_import/import.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

const char* const kFp16 = "samples/half/tiny_fp16.onnx";
const char* const kBf16 = "samples/half/tiny_bf16.onnx";

ImportOptions micro_batch_2() {
  ImportOptions o;
  o.batch = 2;
  return o;
}

Tensor floats(std::vector<int64_t> shape, std::vector<float> v) {
  Tensor t;
  t.type = {DType::kFloat32, std::move(shape)};
  t.data.resize(v.size() * sizeof(float));
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

onnx::AttributeProto* add_attr(onnx::NodeProto* n, const std::string& name) {
  auto* a = n->add_attribute();
  a->set_name(name);
  return a;
}

// Every construct that carries a dtype: Casts to float16 from a float and from an integer, a
// ConstantOfShape value, a RandomNormal dtype, an initializer in int32_data (bfloat16), the graph's
// input and output, a value info, and the module record.
onnx::ModelProto hand_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(out);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  };
  auto* to_half = node("Cast", {"x"}, "x16");
  auto* a = add_attr(to_half, "to");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(10);
  auto* from_int = node("Cast", {"ids"}, "ids16");
  a = add_attr(from_int, "to");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(10);
  auto* fill = node("ConstantOfShape", {"shape"}, "filled");
  a = add_attr(fill, "value");
  a->set_type(onnx::AttributeProto::TENSOR);
  tensor_to_proto(narrowed(floats({1}, {0.5f}), DType::kFloat16), "", a->mutable_t());
  auto* draw = node("RandomNormal", {}, "noise");
  a = add_attr(draw, "dtype");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(16);
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(16);
  w->add_dims(2);
  w->add_int32_data(0x3F80);  // 1
  w->add_int32_data(0xC040);  // -3
  auto* x = g->add_input();
  type_to_value_info({DType::kFloat16, {2}}, "x", x);
  type_to_value_info({DType::kInt64, {2}}, "ids", g->add_input());
  type_to_value_info({DType::kFloat16, {2}}, "x16", g->add_output());
  type_to_value_info({DType::kBFloat16, {2}}, "noise", g->add_value_info());
  auto* p = m.add_metadata_props();
  p->set_key("pipetrain.state_dict");
  p->set_value(R"([{"key": "w", "dtype": "bfloat16", "shape": [2]}, {"key": "n", "dtype": "int64", "shape": []}])");
  return m;
}

TEST(WidenHalves, EveryHalfDtypeBecomesFloat32) {
  onnx::ModelProto m = hand_model();
  const std::map<std::string, DType> file = widen_half_floats(&m);
  EXPECT_EQ(file, (std::map<std::string, DType>{{"w", DType::kBFloat16}}));
  const auto& g = m.graph();
  EXPECT_EQ(g.node(0).attribute(0).i(), 1);  // Cast float -> float16: float32 -> float32
  EXPECT_EQ(g.node(1).attribute(0).i(), 1);  // Cast int64 -> float16: int64 -> float32
  const Tensor value = tensor_from_proto(g.node(2).attribute(0).t(), "value");
  EXPECT_EQ(value.type.str(), "float32[1]");
  EXPECT_EQ(value.as<float>()[0], 0.5f);
  EXPECT_EQ(g.node(3).attribute(0).i(), 1);
  const Tensor w = tensor_from_proto(g.initializer(0), "w");
  EXPECT_EQ(w.type.str(), "float32[2]");
  EXPECT_EQ(w.as<float>()[0], 1.0f);
  EXPECT_EQ(w.as<float>()[1], -3.0f);
  EXPECT_EQ(g.initializer(0).int32_data_size(), 0);
  EXPECT_EQ(g.input(0).type().tensor_type().elem_type(), 1);
  EXPECT_EQ(g.input(1).type().tensor_type().elem_type(), 7);
  EXPECT_EQ(g.output(0).type().tensor_type().elem_type(), 1);
  EXPECT_EQ(g.value_info(0).type().tensor_type().elem_type(), 1);
  EXPECT_EQ(m.metadata_props(0).value(),
            R"([{"dtype":"float32","key":"w","shape":[2]},{"dtype":"int64","key":"n","shape":[]}])");
}

// The fixtures import as float32, the same graph for both half types; their weights are read
// only as a device asks, 2 bytes an element, and widened exactly.
TEST(WidenHalves, HalfFixturesImportAsFloat32) {
  const int64_t before = stored_bytes_loaded();
  const Graph g16 = import_model(kFp16, micro_batch_2());
  const Graph b16 = import_model(kBf16, micro_batch_2());
  EXPECT_EQ(stored_bytes_loaded(), before);
  EXPECT_EQ(graph_text(g16), graph_text(b16));
  EXPECT_EQ(graph_text(g16).find("float16"), std::string::npos);
  int casts = 0;
  for (const Node& n : g16.nodes)
    if (n.op_type == "Cast") casts += n.attr_int("to", 0) == static_cast<int64_t>(DType::kFloat32);
  EXPECT_EQ(casts, 8);  // 4 to float32 as exported, 4 to float16 now to float32
  EXPECT_EQ(g16.file_dtypes.size(), 15u);
  for (const auto& [name, dtype] : g16.file_dtypes) {
    EXPECT_EQ(dtype, DType::kFloat16) << name;
    EXPECT_EQ(g16.value(g16.find(name)).type.dtype, DType::kFloat32) << name;
  }
  EXPECT_EQ(b16.file_dtypes.at("embed.weight"), DType::kBFloat16);

  const Tensor& w = *g16.value(g16.find("val_6")).init;  // qkv's weight, in tiny_fp16.onnx.data
  ASSERT_TRUE(w.stored);
  EXPECT_FALSE(w.resident());
  std::vector<std::byte> file(static_cast<size_t>(w.stored->length));
  read_stored_bytes(*w.stored, file.data());
  std::vector<float> want(static_cast<size_t>(w.type.numel()));
  widen_halves(DType::kFloat16, file.data(), w.type.numel(), want.data());
  EXPECT_EQ(std::memcmp(w.as<float>(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(stored_bytes_loaded() - before, 2 * w.type.numel());
}

}  // namespace
}  // namespace pt
