#include "onnx_import/import.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "onnx_import/export.h"
#include "onnx_import/load.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> sample_models() {
  std::vector<std::string> out;
  for (const char* name : {"mlp", "gpt", "bert", "vit", "resnet", "mobilenet"})
    out.push_back("samples/" + std::string(name) + "/" + name + ".onnx");
  return out;
}

std::string import_error(const std::string& path, const ImportOptions& o = {}) {
  try {
    import_model(path, o);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / "pt_import_test";
  fs::create_directories(dir);
  return dir / name;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

TEST(Import, EverySampleHasConcreteShapes) {
  for (const std::string& path : sample_models()) {
    for (int64_t batch : {1, 3}) {
      ImportOptions o;
      o.batch = batch;
      Graph g = import_model(path, o);
      ASSERT_FALSE(g.nodes.empty()) << path;
      for (const Value& v : g.values) {
        EXPECT_NE(v.type.dtype, DType::kUndefined) << path << " " << v.name;
        for (int64_t d : v.type.shape) EXPECT_GE(d, 0) << path << " " << v.name;
      }
      for (ValueId in : g.inputs) EXPECT_EQ(g.value(in).type.shape[0], batch) << path;
      for (ValueId out : g.outputs) EXPECT_EQ(g.value(out).type.shape[0], batch) << path;
      // Folding leaves no shape computation behind.
      for (const Node& n : g.nodes) {
        EXPECT_NE(n.op_type, "Shape") << path;
        EXPECT_NE(n.op_type, "Constant") << path;
      }
      EXPECT_GT(g.parameter_count(), 0) << path;
    }
  }
}

TEST(Import, FoldedConstantsAreNotParameters) {
  Graph g = import_model("samples/gpt/gpt.onnx");
  for (const Value& v : g.values) {
    if (v.constant) {
      EXPECT_FALSE(v.is_parameter()) << v.name;
    }
  }
}

TEST(Import, ExternalDataMatchesEmbedded) {
  Graph ext = import_model("samples/synthetic/tiny_ext.onnx");
  Graph emb = import_model("samples/synthetic/tiny.onnx");
  ASSERT_EQ(ext.nodes.size(), emb.nodes.size());
  EXPECT_EQ(ext.parameter_count(), emb.parameter_count());
  EXPECT_GT(ext.parameter_count(), 0);
}

TEST(Import, RoundTripThroughExport) {
  Graph g = import_model("samples/mlp/mlp.onnx");
  fs::path p = scratch("mlp_roundtrip.onnx");
  save_model(to_model_proto(g), p.string());
  Graph back = import_model(p.string());
  EXPECT_EQ(back.nodes.size(), g.nodes.size());
  EXPECT_EQ(back.parameter_count(), g.parameter_count());
}

TEST(ImportErrors, MissingFile) {
  EXPECT_EQ(import_error("no/such/model.onnx"),
            "no/such/model.onnx: no such file; check the path to the model");
}

// A name or glob of parameters.tied / untied / trained that matches no initializer is one line
// (a misspelt name used to be a silent no-op); a glob that matches some, or a name import made
// (a parameter given back), is taken.
TEST(ImportErrors, AParameterChoiceThatMatchesNothing) {
  ImportOptions o;
  o.parameters.untied = {"lm_head.wieght"};
  EXPECT_EQ(import_error("samples/exports/gpt2.onnx", o),
            "samples/exports/gpt2.onnx: parameters.untied 'lm_head.wieght': matches no initializer of the model; "
            "`pipetrain inspect` lists them (and what import untied, restored or folded)");
  o.parameters.untied = {};
  o.parameters.trained = {"no_such_constant"};
  EXPECT_NE(import_error("samples/exports/gpt2.onnx", o).find("parameters.trained 'no_such_constant'"), std::string::npos);
  o.parameters.trained = {};
  o.parameters.tied = {"*.ln_1.*", "model.transformer.wpe.weight"};
  EXPECT_EQ(import_error("samples/exports/gpt2.onnx", o), "");
}

TEST(ImportErrors, GarbageFile) {
  fs::path p = scratch("garbage.onnx");
  write_bytes(p, std::string("\xff\xfe this is not a protobuf \x01\x02\x03", 30));
  EXPECT_EQ(import_error(p.string()),
            p.string() + ": is not an ONNX model (protobuf parsing failed: garbage or truncated); "
                         "export the model again with torch.onnx.export");
}

TEST(ImportErrors, TruncatedFile) {
  std::ifstream in("samples/mlp/mlp.onnx", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  fs::path p = scratch("truncated.onnx");
  write_bytes(p, bytes.substr(0, bytes.size() / 2));
  const std::string err = import_error(p.string());
  EXPECT_EQ(err.rfind(p.string() + ": ", 0), 0u) << err;
  EXPECT_NE(err.find("export"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos);
}

TEST(ImportErrors, MissingExternalData) {
  fs::path dir = scratch("ext_missing");
  fs::create_directories(dir);
  fs::copy_file("samples/synthetic/tiny_ext.onnx", dir / "tiny_ext.onnx",
                fs::copy_options::overwrite_existing);
  const std::string err = import_error((dir / "tiny_ext.onnx").string());
  EXPECT_NE(err.find("external data file"), std::string::npos) << err;
  EXPECT_NE(err.find("is missing; keep the data file beside the model"), std::string::npos) << err;
}

// External data fields a broken or hostile file may hold (found by tests/fuzz/fuzz_model.cc's
// kind of input): a path out of the model's folder, a device, offsets that are not numbers or run
// past the file. Each is one line naming the tensor; nothing is read from outside the folder.
TEST(ImportErrors, ExternalDataOutsideTheFolderOrNotANumber) {
  fs::path dir = scratch("ext_fields");
  fs::create_directories(dir);
  fs::copy_file("samples/synthetic/tiny_ext.onnx.data", dir / "tiny_ext.onnx.data", fs::copy_options::overwrite_existing);
  onnx::ModelProto m;
  {
    std::ifstream in("samples/synthetic/tiny_ext.onnx", std::ios::binary);
    ASSERT_TRUE(m.ParseFromIstream(&in));
  }
  onnx::TensorProto* t = nullptr;
  for (auto& init : *m.mutable_graph()->mutable_initializer())
    if (init.data_location() == onnx::TensorProto::EXTERNAL) t = &init;
  ASSERT_NE(t, nullptr);
  auto error_with = [&](const std::string& key, const std::string& value) {
    onnx::ModelProto copy = m;
    for (auto& init : *copy.mutable_graph()->mutable_initializer())
      if (init.name() == t->name())
        for (auto& kv : *init.mutable_external_data())
          if (kv.key() == key) kv.set_value(value);
    const fs::path p = dir / "edited.onnx";
    std::ofstream out(p, std::ios::binary);
    copy.SerializeToOstream(&out);
    out.close();
    return import_error(p.string());
  };
  const std::string where = (dir / "edited.onnx").string() + ": tensor '" + t->name() + "': ";
  EXPECT_EQ(error_with("location", "/etc/passwd"),
            where + "names external data '/etc/passwd', outside the model's folder; keep the data file beside "
                    "the model, as it was exported");
  EXPECT_EQ(error_with("location", "../ext_fields/tiny_ext.onnx.data"),
            where + "names external data '../ext_fields/tiny_ext.onnx.data', outside the model's folder; keep the "
                    "data file beside the model, as it was exported");
  EXPECT_EQ(error_with("location", "."), where + "names external data '" + (dir / ".").string() +
                                              "', which is not a regular file; keep the data file beside the "
                                              "model, as it was exported");
  EXPECT_EQ(error_with("offset", "12abc"),
            where + "has external data offset '12abc', not a count of bytes; export the model again");
  EXPECT_EQ(error_with("offset", "99999999999999999999"),
            where + "has external data offset '99999999999999999999', not a count of bytes; export the model again");
  const std::string past = error_with("offset", "9223372036854775000");
  EXPECT_NE(past.find("bytes from byte 9223372036854775000 of"), std::string::npos) << past;
}

onnx::ModelProto tiny_model(const std::string& op, const std::string& domain, int64_t opset) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* o = m.add_opset_import();
  o->set_version(opset);
  if (!domain.empty()) {
    auto* d = m.add_opset_import();
    d->set_domain(domain);
    d->set_version(1);
  }
  auto* g = m.mutable_graph();
  g->set_name("tiny");
  auto* n = g->add_node();
  n->set_name("the_node");
  n->set_op_type(op);
  n->set_domain(domain);
  n->add_input("x");
  n->add_output("y");
  for (auto* vi : {g->add_input(), g->add_output()}) {
    vi->set_name(vi == &g->input(0) ? "x" : "y");
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    tt->mutable_shape()->add_dim()->set_dim_param("batch");
    tt->mutable_shape()->add_dim()->set_dim_value(4);
  }
  return m;
}

TEST(ImportErrors, UnknownOpNamesNodeAndOpset) {
  fs::path p = scratch("unknown_op.onnx");
  save_model(tiny_model("Cosh", "", 17), p.string());
  EXPECT_EQ(import_error(p.string()),
            p.string() + ": node 'the_node' (Cosh, opset 17): op Cosh is not supported; "
                         "`pipetrain ops` lists the supported ops; replace it in the exported model");
  save_model(tiny_model("Frobnicate", "com.example", 17), p.string());
  EXPECT_NE(import_error(p.string()).find("op com.example::Frobnicate is not supported"),
            std::string::npos);
}

TEST(Import, NewerIrVersionWithASupportedOpsetIsTaken) {
  fs::path p = scratch("ir10.onnx");
  onnx::ModelProto m = tiny_model("Relu", "", 17);
  m.set_ir_version(10);
  save_model(m, p.string());
  ImportOptions o;
  o.batch = 3;
  Graph g = import_model(p.string(), o);
  EXPECT_EQ(g.value(g.outputs[0]).type.shape, (std::vector<int64_t>{3, 4}));
}

// Opset-18+ forms come in as their opset-17 equivalents: ReduceMean-18's axes input becomes the
// attribute (a misread would reduce every axis), Split-18's num_outputs splits unevenly.
TEST(Import, Opset20FormsReadAsTheirOpset17Equivalents) {
  fs::path p = scratch("opset20.onnx");
  onnx::ModelProto m = tiny_model("ReduceMean", "", 20);
  m.set_ir_version(10);
  auto* g = m.mutable_graph();
  g->mutable_node(0)->add_input("axes");
  auto* axes = g->add_initializer();
  axes->set_name("axes");
  axes->set_data_type(onnx::TensorProto::INT64);
  axes->add_dims(1);
  axes->add_int64_data(1);
  save_model(m, p.string());
  ImportOptions o;
  o.batch = 3;
  Graph r = import_model(p.string(), o);
  EXPECT_EQ(r.value(r.outputs[0]).type.shape, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(r.nodes[0].attr_ints("axes"), (std::vector<int64_t>{1}));
  EXPECT_EQ(r.source_opset, 20);
  EXPECT_EQ(r.opset(), 17);

  onnx::ModelProto s = tiny_model("Split", "", 20);
  auto* n = s.mutable_graph()->mutable_node(0);
  n->add_output("z");
  auto* num = n->add_attribute();
  num->set_name("num_outputs");
  num->set_type(onnx::AttributeProto::INT);
  num->set_i(2);
  auto* axis = n->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(1);
  auto* shape = s.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  shape->mutable_dim(1)->set_dim_value(5);  // 5 = 3 + 2
  auto* z = s.mutable_graph()->add_output();
  *z = s.graph().output(0);
  z->set_name("z");
  save_model(s, p.string());
  Graph split = import_model(p.string(), o);
  EXPECT_EQ(split.value(split.outputs[0]).type.shape, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(split.value(split.outputs[1]).type.shape, (std::vector<int64_t>{3, 2}));
}

// What has no opset-17 form is refused in one line naming node, op and opset.
TEST(ImportErrors, NewerFormsWithoutAnEquivalentNameTheNode) {
  fs::path p = scratch("wrap.onnx");
  onnx::ModelProto m = tiny_model("Pad", "", 19);
  auto* n = m.mutable_graph()->mutable_node(0);
  n->add_input("pads");
  auto* mode = n->add_attribute();
  mode->set_name("mode");
  mode->set_type(onnx::AttributeProto::STRING);
  mode->set_s("wrap");
  auto* pads = m.mutable_graph()->add_initializer();
  pads->set_name("pads");
  pads->set_data_type(onnx::TensorProto::INT64);
  pads->add_dims(4);
  for (int i = 0; i < 4; ++i) pads->add_int64_data(1);
  save_model(m, p.string());
  EXPECT_EQ(import_error(p.string()),
            p.string() + ": node 'the_node' (Pad, opset 19): mode 'wrap' is not supported (constant, "
                         "reflect and edge are); pad in another mode, or before export");

  onnx::ModelProto f8 = tiny_model("Relu", "", 20);
  f8.set_ir_version(10);
  auto* w = f8.mutable_graph()->add_initializer();
  w->set_name("scale");
  w->set_data_type(17);  // FLOAT8E4M3FN
  w->add_dims(1);
  w->set_raw_data(std::string(1, '\0'));
  save_model(f8, p.string());
  EXPECT_EQ(import_error(p.string()),
            p.string() + ": initializer 'scale': has data type 17 (float8, 4-bit or newer), which "
                         "pipetrain does not take; export in float32 (or float16/bfloat16), without quantization");
}

// A file without parameter marks (the legacy exporter) trains every float initializer a gradient
// reaches, but for what it shows to be a buffer: an additive attention mask, a rotary table.
TEST(Import, AdditiveMasksAndRotaryTablesAreBuffers) {
  fs::path p = scratch("buffers.onnx");
  onnx::ModelProto m = tiny_model("MatMul", "", 17);
  auto* g = m.mutable_graph();
  auto* shape = g->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  shape->add_dim()->set_dim_value(4);  // x: [batch, 4, 4]
  *g->mutable_output(0)->mutable_type() = g->input(0).type();
  auto* mm = g->mutable_node(0);
  mm->set_input(0, "x");
  mm->add_input("w");
  mm->set_output(0, "scores");
  auto add = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
    auto* n = g->add_node();
    n->set_name(out);
    n->set_op_type(op);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
  };
  add("Add", {"scores", "causal_mask"}, "masked");
  add("Mul", {"masked", "rotary.inv_freq"}, "y");
  auto init = [&](const std::string& name, std::vector<int64_t> dims) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    int64_t n = 1;
    for (int64_t d : dims) t->add_dims(d), n *= d;
    for (int64_t i = 0; i < n; ++i) t->add_float_data(0.5f);
  };
  init("w", {4, 4});
  init("causal_mask", {1, 4, 4});
  init("rotary.inv_freq", {4});
  save_model(m, p.string());
  ImportOptions o;
  o.batch = 2;
  Graph r = import_model(p.string(), o);
  EXPECT_TRUE(r.value(r.find("w")).is_parameter());
  EXPECT_FALSE(r.value(r.find("causal_mask")).is_parameter());
  EXPECT_FALSE(r.value(r.find("rotary.inv_freq")).is_parameter());
  EXPECT_EQ(r.buffers.at("causal_mask"),
            "an additive attention mask: square in its last two dims and only added to scores");
  EXPECT_EQ(r.buffers.at("rotary.inv_freq"), "a rotary table (PyTorch's rotary modules keep it as a buffer)");
  EXPECT_EQ(r.buffers.count("w"), 0u);
}

// pipetrain's own inference (onnx_import/infer.h) names the node whose shapes contradict its op.
TEST(ImportErrors, ShapesThatContradictTheOpNameTheNode) {
  fs::path p = scratch("bad_matmul.onnx");
  onnx::ModelProto m = tiny_model("MatMul", "", 17);
  m.mutable_graph()->mutable_node(0)->add_input("w");
  auto* w = m.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(3);
  w->add_dims(2);
  for (int i = 0; i < 6; ++i) w->add_float_data(1.f);
  save_model(m, p.string());
  ImportOptions o;
  o.batch = 2;
  EXPECT_EQ(import_error(p.string(), o),
            p.string() + ": node 'the_node' (MatMul, opset 17): inner dims differ: [2,4] @ [3,2]; check "
                         "the bound dimensions (--micro-batch, --dim) against the model");
}

// A global pool of a [N, C] input is refused in one line (its inference copied [N, C, ...]'s first
// two dims: a rank-1 input read past its shape, the model fuzzer's find).
TEST(ImportErrors, AGlobalPoolNeedsSpatialDims) {
  fs::path p = scratch("global_pool.onnx");
  save_model(tiny_model("GlobalAveragePool", "", 17), p.string());
  ImportOptions o;
  o.batch = 2;
  EXPECT_EQ(import_error(p.string(), o),
            p.string() + ": node 'the_node' (GlobalAveragePool, opset 17): takes an input [N, C, D1, ...] of "
                         "rank 3 or more, not [2,4]; check the bound dimensions (--micro-batch, --dim) against "
                         "the model");
}

TEST(ImportErrors, FusedAttentionWithAnExternalCacheIsRefused) {
  fs::path p = scratch("attention.onnx");
  onnx::ModelProto m = tiny_model("Attention", "", 24);
  m.set_ir_version(10);
  auto* n = m.mutable_graph()->mutable_node(0);
  n->clear_input();
  for (const char* in : {"x", "x", "x", "", "", "", "x"}) n->add_input(in);  // q k v nonpad_kv_seqlen
  save_model(m, p.string());
  EXPECT_EQ(import_error(p.string()),
            p.string() + ": node 'the_node' (Attention, opset 24): input 6 (nonpad_kv_seqlen, the lengths "
                         "of an external KV cache) is not supported; export without a static KV cache");
  n->mutable_input()->RemoveLast();
  n->add_input("");
  n->mutable_input(4)->assign("x");  // past_key without past_value
  save_model(m, p.string());
  EXPECT_EQ(import_error(p.string()),
            p.string() + ": node 'the_node' (Attention, opset 24): past_key and past_value must be given "
                         "together; export the model again");
}

TEST(ImportErrors, RotaryEmbeddingSaysWhy) {
  fs::path p = scratch("rotary.onnx");
  save_model(tiny_model("RotaryEmbedding", "", 23), p.string());
  EXPECT_EQ(import_error(p.string()),
            p.string() + ": node 'the_node' (RotaryEmbedding, opset 23): op RotaryEmbedding (opset 23) "
                         "is not rewritten yet: PyTorch writes rotary embeddings as plain ops at every "
                         "opset; export with torch.onnx.export, which writes them so, or compute them "
                         "with Mul, Slice, Neg and Concat");
}

TEST(ImportErrors, OpsetOutOfRange) {
  fs::path p = scratch("old_opset.onnx");
  save_model(tiny_model("Relu", "", 11), p.string());
  EXPECT_EQ(import_error(p.string()),
            p.string() + ": opset 11 is outside the supported range 13..28; "
                         "export again with torch.onnx.export(..., opset_version=20)");
  save_model(tiny_model("Relu", "", 29), p.string());
  EXPECT_EQ(import_error(p.string()),
            p.string() + ": opset 29 is outside the supported range 13..28; "
                         "export again with torch.onnx.export(..., opset_version=20)");
}

TEST(ImportErrors, SymbolicDimNeedsBinding) {
  fs::path p = scratch("symbolic.onnx");
  onnx::ModelProto m = tiny_model("Relu", "", 17);
  for (auto* vi : {m.mutable_graph()->mutable_input(0), m.mutable_graph()->mutable_output(0)})
    vi->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("width");
  save_model(m, p.string());
  EXPECT_EQ(import_error(p.string()),
            p.string() + ": input 'x' axis 1: dimension 'width' is symbolic; "
                         "bind it with --dim width=VALUE (or dims: in the config)");
  ImportOptions o;
  o.dims["width"] = 7;
  Graph g = import_model(p.string(), o);
  EXPECT_EQ(g.value(g.outputs[0]).type.shape, (std::vector<int64_t>{1, 7}));
}

}  // namespace
}  // namespace pt
