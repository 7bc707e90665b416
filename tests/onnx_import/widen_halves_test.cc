// onnx_import/widen_halves.h and what import and export make of it: float16/bfloat16 models
// (samples/half, as torch.onnx.export writes them after .half() and .to(torch.bfloat16)) import
// as float32 with the file's dtypes recorded and their external weights still on disk, each
// widened as it loads; the trained model goes back in the file's dtype into the file's graph, or
// in float32 into the widened graph; the state_dict likewise.
#include "onnx_import/widen_halves.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/half_floats.h"
#include "onnx_import/export.h"
#include "onnx_import/import.h"
#include "onnx_import/load.h"
#include "onnx_import/module_state.h"
#include "onnx_import/proto_convert.h"
#include "onnx_import/state_dict.h"

namespace pt {
namespace {

const char* const kFp16 = "samples/half/tiny_fp16.onnx";
const char* const kBf16 = "samples/half/tiny_bf16.onnx";

ImportOptions micro_batch_2() {
  ImportOptions o;
  o.batch = 2;
  return o;
}

// A scratch file's path.
std::string scratch(const std::string& name) { return ::testing::TempDir() + "pt_widen_halves_" + name; }

// A float32 vector of these values.
Tensor floats(const std::vector<float>& v) {
  Tensor t = scalar_tensor(0.0f);
  t.type.shape = {static_cast<int64_t>(v.size())};
  const auto* bytes = reinterpret_cast<const std::byte*>(v.data());
  t.data.assign(bytes, bytes + v.size() * sizeof(float));
  return t;
}

onnx::AttributeProto int_attr(const std::string& name, int64_t v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}

// Node k of g: `op` over `in` with attribute `a`, its output named "v<k>".
void add_node(onnx::GraphProto* g, const std::string& op, const std::vector<std::string>& in,
              const onnx::AttributeProto& a) {
  const std::string k = std::to_string(g->node_size());
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(op + k);
  for (const std::string& i : in) n->add_input(i);
  n->add_output(std::string("v").append(k));
  *n->add_attribute() = a;
}

// Every construct that carries a dtype: Casts to float16 from a float and from an integer, a
// ConstantOfShape value, a RandomNormal dtype, an initializer in int32_data (bfloat16), the graph's
// input and output, a value info, and the module record.
onnx::ModelProto hand_model() {
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_node(g, "Cast", {"x"}, int_attr("to", 10));
  add_node(g, "Cast", {"ids"}, int_attr("to", 10));
  onnx::AttributeProto value;
  value.set_name("value");
  value.set_type(onnx::AttributeProto::TENSOR);
  tensor_to_proto(narrowed(floats({0.5f}), DType::kFloat16), "", value.mutable_t());
  add_node(g, "ConstantOfShape", {"shape"}, value);
  add_node(g, "RandomNormal", {}, int_attr("dtype", 16));
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(16);
  w->add_dims(2);
  w->add_int32_data(0x3F80);  // 1
  w->add_int32_data(0xC040);  // -3
  type_to_value_info({DType::kFloat16, {2}}, "x", g->add_input());
  type_to_value_info({DType::kInt64, {2}}, "ids", g->add_input());
  type_to_value_info({DType::kFloat16, {2}}, "v0", g->add_output());
  type_to_value_info({DType::kBFloat16, {2}}, "v3", g->add_value_info());
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

// The trained model in the file's dtype: the source graph, Casts to float16 included, each
// trained weight rounded as torch rounds it; with float32, the widened graph and the weights as
// trained. The file keeps its weights in external data, and so do both trained models (read
// back in here), the data file beside each.
TEST(WidenHalves, TrainedModelInFileDtypeOrFloat32) {
  const Graph g = import_model(kFp16, micro_batch_2());
  const Tensor& start = *g.value(g.find("val_6")).init;
  Tensor trained = start;
  trained.load();
  for (int64_t i = 0; i < trained.type.numel(); ++i) trained.as<float>()[i] += 1e-3f * static_cast<float>(i);
  const std::map<std::string, const Tensor*> weights = {{"val_6", &trained}};

  const std::string half = scratch("half.onnx"), full = scratch("full.onnx");
  save_model_with_weights(kFp16, weights, half);
  save_model_with_weights(kFp16, weights, full, {}, true);
  const onnx::ModelProto source = read_model(kFp16);
  EXPECT_TRUE(std::filesystem::exists(half + ".data"));
  EXPECT_TRUE(std::filesystem::exists(full + ".data"));
  const onnx::ModelProto h = read_model(half), f = read_model(full);
  ASSERT_EQ(h.graph().node_size(), source.graph().node_size());
  for (int i = 0; i < source.graph().node_size(); ++i) {
    EXPECT_EQ(h.graph().node(i).SerializeAsString(), source.graph().node(i).SerializeAsString());
    if (source.graph().node(i).op_type() == "Cast") {
      EXPECT_EQ(f.graph().node(i).attribute(0).i(), 1);
    }
  }
  for (int i = 0; i < source.graph().initializer_size(); ++i) {
    const onnx::TensorProto& s = source.graph().initializer(i);
    const Tensor in_half = tensor_from_proto(h.graph().initializer(i), "h"), in_full = tensor_from_proto(f.graph().initializer(i), "f");
    EXPECT_EQ(in_half.type.dtype, static_cast<DType>(s.data_type())) << s.name();
    EXPECT_EQ(in_full.type.dtype, is_half(static_cast<DType>(s.data_type())) ? DType::kFloat32 : static_cast<DType>(s.data_type()));
    const Tensor want = s.name() == "val_6" ? narrowed(trained, DType::kFloat16) : tensor_from_proto(s, "s");
    EXPECT_EQ(in_half.data, want.data) << s.name();
    EXPECT_EQ(in_full.data, s.name() == "val_6" ? trained.data : widened(want).data) << s.name();
  }
  EXPECT_EQ(h.graph().output(0).type().tensor_type().elem_type(), 10);
  EXPECT_EQ(f.graph().output(0).type().tensor_type().elem_type(), 1);
}

// The fixture with a record (samples/export_model.py's) of two of its float16 parameters: the
// state_dict holds the trained one rounded to float16 and the frozen one as the file holds it;
// with float32, both in float32 although the record says float16.
TEST(WidenHalves, StateDictInFileDtypeOrFloat32) {
  onnx::ModelProto m = read_model(kFp16);
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"pipetrain.format", "1"},
        {"pipetrain.state_dict", R"([{"key": "norm1.weight", "dtype": "float16", "shape": [8]},
                                     {"key": "norm2.weight", "dtype": "float16", "shape": [8]}])"},
        {"pipetrain.initializers", R"({"norm1.weight": [{"key": "norm1.weight"}], "norm2.weight": [{"key": "norm2.weight"}]})"}}) {
    auto* p = m.add_metadata_props();
    p->set_key(key);
    p->set_value(value);
  }
  const std::string path = scratch("recorded.onnx");
  save_model(m, path);
  const Tensor norm1 = floats({1.00048828f, 2.5f, 0, 0, 0, 0, 0, 0});  // 1 + 2^-11 ties to 1 in float16
  TrainedState t;
  t.tensors = {{"norm1.weight", &norm1}};
  t.file_dtypes = import_model(path, micro_batch_2()).file_dtypes;
  const std::optional<ModuleState> module = read_module_state(path);
  const StateDict in_file = trained_state_dict(path, module, t, {});
  ASSERT_EQ(in_file.tensors.size(), 2u);
  EXPECT_EQ(in_file.tensors[0].type.dtype, DType::kFloat16);
  EXPECT_EQ(in_file.tensors[0].bytes().data, narrowed(norm1, DType::kFloat16).data);
  EXPECT_EQ(widened(in_file.tensors[0].bytes()).as<float>()[0], 1.0f);
  const Tensor norm2 = tensor_from_proto(m.graph().initializer(4), "norm2.weight");
  EXPECT_EQ(m.graph().initializer(4).name(), "norm2.weight");
  EXPECT_EQ(in_file.tensors[1].bytes().data, norm2.data);
  t.float32 = true;
  const StateDict full = trained_state_dict(path, module, t, {});
  EXPECT_EQ(full.tensors[0].type.dtype, DType::kFloat32);
  EXPECT_EQ(full.tensors[0].bytes().data, norm1.data);
  EXPECT_EQ(full.tensors[1].type.dtype, DType::kFloat32);
  EXPECT_EQ(full.tensors[1].bytes().data, widened(norm2).data);
}

}  // namespace
}  // namespace pt
