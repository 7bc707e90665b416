// What import makes of parameters an exporter merged or folded (onnx_import/module_params.h), on
// small graphs written the way each exporter writes them: the default exporter's FX metadata on
// nodes (merges, a dropped zero bias, a tie folded as a transposed copy), the legacy exporter's
// Identity merges, and files with neither (untied by value, ambiguous ties kept with a warning,
// the user's overrides). The real exports are checked against PyTorch's training in
// oracle.exports_pytorch (samples/exports).
#include <gtest/gtest.h>

#include <cstring>

#include "onnx_import/module_params.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

// One repeated StringStringEntryProto field that the onnx library here predates, as an unknown
// field (NodeProto 9, ValueInfoProto 4), written the way an IR-10 file carries it.
void add_metadata(google::protobuf::Message* m, int field, const std::string& key, const std::string& value) {
  onnx::StringStringEntryProto e;
  e.set_key(key);
  e.set_value(value);
  m->GetReflection()->MutableUnknownFields(m)->AddLengthDelimited(field, e.SerializeAsString());
}

class GraphBuilder {
 public:
  onnx::GraphProto g;

  void init(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
    Tensor t;
    t.type = TensorType{DType::kFloat32, dims};
    t.data.resize(v.size() * sizeof(float));
    std::memcpy(t.data.data(), v.data(), t.data.size());
    tensor_to_proto(t, name, g.add_initializer());
  }

  // A parameter as the default exporter declares it (graph input metadata).
  void declared(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
    init(name, dims, v);
    auto* vi = g.add_input();
    vi->set_name(name);
    add_metadata(vi, 4, "pkg.torch.export.graph_signature.InputSpec.kind", "PARAMETER");
    std::string placeholder = "p_" + name;
    for (char& c : placeholder) c = c == '.' ? '_' : c;
    add_metadata(vi, 4, "pkg.torch.onnx.original_node_name", placeholder);
  }

  onnx::NodeProto* node(const std::string& name, const std::string& op, const std::vector<std::string>& in,
                        const std::string& out) {
    auto* n = g.add_node();
    n->set_name(name);
    n->set_op_type(op);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  }

  // The default exporter's record of the FX node: `%fx = target(args)` in module `scope`.
  static void fx(onnx::NodeProto* n, const std::string& fx, const std::string& target, const std::string& args,
                 const std::string& scope) {
    add_metadata(n, 9, "pkg.torch.onnx.fx_node",
                 "%" + fx + " : [num_users=1] = call_function[target=torch.ops.aten." + target +
                     "](args = (" + args + "), kwargs = {})");
    add_metadata(n, 9, "pkg.torch.onnx.name_scopes", "['', '" + scope + "', '" + fx + "']");
  }

  const onnx::TensorProto* find(const std::string& name) const {
    for (const auto& t : g.initializer())
      if (t.name() == name) return &t;
    return nullptr;
  }

  const onnx::NodeProto& named(const std::string& name) const {
    for (const auto& n : g.node())
      if (n.name() == name) return n;
    ADD_FAILURE() << "no node " << name;
    return g.node(0);
  }
};

std::vector<float> values(const onnx::TensorProto& t) {
  const Tensor x = tensor_from_proto(t, t.name());
  return {x.as<float>(), x.as<float>() + x.type.numel()};
}

const std::vector<float> kOnes = {1, 1, 1, 1};

// Two LayerNorms of a fresh model read one merged weight; each FX node names its own parameter.
TEST(ModuleParams, MergedParametersFromTheDefaultExporterGetOneCopyEach) {
  GraphBuilder b;
  b.declared("a.weight", {4}, kOnes);
  GraphBuilder::fx(b.node("ln_a", "LayerNormalization", {"x", "a.weight"}, "y"), "layer_norm", "layer_norm.default",
                   "%x, [4], %p_a_weight, None, 1e-05", "a");
  GraphBuilder::fx(b.node("ln_b", "LayerNormalization", {"y", "a.weight"}, "z"), "layer_norm_1",
                   "layer_norm.default", "%y, [4], %p_b_weight, None, 1e-05", "b");
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  EXPECT_EQ(b.named("ln_a").input(1), "a.weight");
  EXPECT_EQ(b.named("ln_b").input(1), "b.weight");
  ASSERT_NE(b.find("b.weight"), nullptr);
  EXPECT_EQ(values(*b.find("b.weight")), kOnes);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0].initializer, "a.weight");
  EXPECT_EQ(r.notes[0].action, "untied into b.weight");
  EXPECT_TRUE(r.parameters.count("b.weight"));
  EXPECT_TRUE(r.warnings.empty());
}

// torch.export gives a tied parameter one placeholder: both readers keep the one tensor.
TEST(ModuleParams, ATiedParameterReadByTwoFxNodesStaysOne) {
  GraphBuilder b;
  b.declared("emb.weight", {2, 2}, {0.1f, -0.3f, 0.7f, 0.2f});
  GraphBuilder::fx(b.node("gather", "Gather", {"emb.weight", "ids"}, "h"), "embedding", "embedding.default",
                   "%p_emb_weight, %ids", "emb");
  GraphBuilder::fx(b.node("head", "Gemm", {"h", "emb.weight"}, "logits"), "linear", "linear.default",
                   "%h, %p_emb_weight", "head");
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  EXPECT_EQ(b.named("head").input(1), "emb.weight");
  EXPECT_EQ(b.g.initializer_size(), 1);
  EXPECT_TRUE(r.notes.empty());
}

// The optimizer drops a zero bias of addmm (Gemm without C): it comes back as zeros of [N].
TEST(ModuleParams, AZeroBiasTheExporterDroppedComesBack) {
  GraphBuilder b;
  b.declared("fc.weight", {4, 3}, std::vector<float>(12, 0.5f));
  GraphBuilder::fx(b.node("gemm", "Gemm", {"x", "fc.weight"}, "y"), "addmm", "addmm.default",
                   "%p_fc_bias, %x, %p_fc_weight", "fc");
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  ASSERT_EQ(b.named("gemm").input_size(), 3);
  EXPECT_EQ(b.named("gemm").input(2), "fc.bias");
  ASSERT_NE(b.find("fc.bias"), nullptr);
  EXPECT_EQ(values(*b.find("fc.bias")), std::vector<float>(3, 0.f));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0].action, "restored as zeros");
}

// A linear without a bias input (MatMul) whose FX node read a bias gets an Add after it.
TEST(ModuleParams, ADroppedLinearBiasIsAddedAfterTheMatMul) {
  GraphBuilder b;
  b.init("val_3", {4, 2}, std::vector<float>(8, 0.25f));  // the weight, stored transposed
  GraphBuilder::fx(b.node("mm", "MatMul", {"x", "val_3"}, "y"), "linear", "linear.default",
                   "%x, %p_fc_weight, %p_fc_bias", "fc");
  b.node("relu", "Relu", {"y"}, "z");
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  ASSERT_EQ(b.g.node_size(), 3);
  EXPECT_EQ(b.g.node(0).name(), "mm");
  EXPECT_EQ(b.g.node(1).op_type(), "Add");
  EXPECT_EQ(b.g.node(1).input(1), "fc.bias");
  EXPECT_EQ(b.g.node(1).output(0), "y");
  EXPECT_EQ(b.g.node(2).name(), "relu");
  EXPECT_EQ(values(*b.find("fc.bias")), std::vector<float>(2, 0.f));
  ASSERT_TRUE(r.module_names.count("val_3"));
  EXPECT_EQ(r.module_names.at("val_3").parameter, "fc.weight");
  EXPECT_TRUE(r.module_names.at("val_3").transposed);
}

// The LM head of a tied embedding, folded into a transposed copy: it reads the embedding again.
TEST(ModuleParams, AFoldedTransposedCopyOfATiedWeightReadsTheWeight) {
  GraphBuilder b;
  b.declared("emb.weight", {3, 2}, {1, 2, 3, 4, 5, 6});
  b.init("val_9", {2, 3}, {1, 3, 5, 2, 4, 6});
  GraphBuilder::fx(b.node("gather", "Gather", {"emb.weight", "ids"}, "h"), "embedding", "embedding.default",
                   "%p_emb_weight, %ids", "emb");
  GraphBuilder::fx(b.node("head", "MatMul", {"h", "val_9"}, "logits"), "linear", "linear.default",
                   "%h, %p_emb_weight", "head");
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  EXPECT_EQ(b.find("val_9"), nullptr);  // no node reads it any more
  const onnx::NodeProto& head = b.named("head");
  const onnx::NodeProto& tr = b.named(head.input(1));
  EXPECT_EQ(tr.op_type(), "Transpose");
  EXPECT_EQ(tr.input(0), "emb.weight");
  EXPECT_EQ(b.g.node(1).name(), tr.name());  // placed before the MatMul
  EXPECT_EQ(r.notes[0].action, "reads emb.weight transposed");
}

// A transposed copy whose values differ is the exporter's pre-transposed weight, not a tie.
TEST(ModuleParams, ATransposedWeightOfOtherValuesIsNotATie) {
  GraphBuilder b;
  b.declared("emb.weight", {3, 2}, {1, 2, 3, 4, 5, 6});
  b.init("val_9", {2, 3}, {1, 3, 5, 2, 4, 7});
  GraphBuilder::fx(b.node("head", "MatMul", {"h", "val_9"}, "logits"), "linear", "linear.default",
                   "%h, %p_emb_weight", "head");
  restore_module_parameters(&b.g, {});
  EXPECT_EQ(b.named("head").input(1), "val_9");
}

// The legacy exporter writes `ln2.weight = Identity(ln1.weight)` for a merge.
TEST(ModuleParams, LegacyIdentityMergesAreUntied) {
  GraphBuilder b;
  b.init("ln1.weight", {4}, kOnes);
  b.node("Identity_7", "Identity", {"ln1.weight"}, "ln2.weight");
  b.node("/ln2/LayerNormalization", "LayerNormalization", {"x", "ln2.weight"}, "y");
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  EXPECT_EQ(b.g.node_size(), 1);
  ASSERT_NE(b.find("ln2.weight"), nullptr);
  EXPECT_EQ(values(*b.find("ln2.weight")), kOnes);
  ASSERT_EQ(r.notes.size(), 2u);  // untied; ln1.weight then dropped, as nothing reads it
  EXPECT_EQ(r.notes[0].action, "untied into ln2.weight");
}

// The legacy exporter's transposed Linear weight, named by the MatMul of its module.
TEST(ModuleParams, ALegacyTransposedWeightIsNamedAfterItsModule) {
  GraphBuilder b;
  b.init("onnx::MatMul_12", {4, 2}, std::vector<float>(8, 0.5f));
  b.node("/enc/query/MatMul", "MatMul", {"x", "onnx::MatMul_12"}, "y");
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  ASSERT_TRUE(r.module_names.count("onnx::MatMul_12"));
  EXPECT_EQ(r.module_names.at("onnx::MatMul_12").parameter, "enc.query.weight");
  EXPECT_TRUE(r.module_names.at("onnx::MatMul_12").transposed);
}

// Neither metadata nor Identity merges: two modules read one initializer.
GraphBuilder two_modules(const std::vector<float>& v) {
  GraphBuilder b;
  b.init("w", {4}, v);
  b.node("/enc/l0/ln/LayerNormalization", "LayerNormalization", {"x", "w"}, "y");
  b.node("/enc/l1/ln/LayerNormalization", "LayerNormalization", {"y", "w"}, "z");
  return b;
}

TEST(ModuleParams, AConstantFilledInitializerReadByTwoModulesIsUntied) {
  GraphBuilder b = two_modules(kOnes);
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  EXPECT_EQ(b.named("/enc/l0/ln/LayerNormalization").input(1), "w");
  EXPECT_EQ(b.named("/enc/l1/ln/LayerNormalization").input(1), "enc.l1.ln.weight");
  EXPECT_EQ(values(*b.find("enc.l1.ln.weight")), kOnes);
  EXPECT_TRUE(r.warnings.empty());
}

TEST(ModuleParams, ARandomInitializerReadByTwoModulesIsKeptTiedWithAWarning) {
  GraphBuilder b = two_modules({0.3f, -1.2f, 0.8f, 0.1f});
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  EXPECT_EQ(b.named("/enc/l1/ln/LayerNormalization").input(1), "w");
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0],
            "initializer 'w' is read by 2 modules (enc.l0.ln, enc.l1.ln): kept as one tied parameter; if the "
            "exporter merged separate parameters, list it under parameters.untied (parameters.tied silences this)");
}

TEST(ModuleParams, ParametersTiedKeepsAMerge) {
  GraphBuilder b = two_modules(kOnes);
  const ModuleParameters r = restore_module_parameters(&b.g, {{"w"}, {}});
  EXPECT_EQ(b.named("/enc/l1/ln/LayerNormalization").input(1), "w");
  EXPECT_TRUE(r.notes.empty());
}

TEST(ModuleParams, ParametersUntiedUntiesARandomInitializer) {
  GraphBuilder b = two_modules({0.3f, -1.2f, 0.8f, 0.1f});
  const ModuleParameters r = restore_module_parameters(&b.g, {{}, {"*"}});
  EXPECT_EQ(b.named("/enc/l1/ln/LayerNormalization").input(1), "enc.l1.ln.weight");
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_EQ(r.notes[0].why, "parameters.untied names it");
}

// An embedding table and a projection sharing one random tensor: the classic tie, kept silently.
TEST(ModuleParams, ARandomTableAlsoReadAsAWeightIsATie) {
  GraphBuilder b;
  b.init("emb", {2, 2}, {0.3f, -1.2f, 0.8f, 0.1f});
  b.node("/embed/Gather", "Gather", {"emb", "ids"}, "h");
  b.node("/head/Gemm", "Gemm", {"h", "emb"}, "logits");
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  EXPECT_EQ(b.named("/head/Gemm").input(1), "emb");
  EXPECT_TRUE(r.warnings.empty());
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0].action, "kept tied");
}

// A constant the default exporter's optimizer folded: its value info records what it was folded
// from, and the graph's signature lists the module's parameters.
void folded(GraphBuilder* b, const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v,
            const std::string& from) {
  b->init(name, dims, v);
  auto* vi = b->g.add_value_info();
  vi->set_name(name);
  add_metadata(vi, 4, "pkg.onnxscript.optimizer.folded_from", from);
  add_metadata(&b->g, 16, "pkg.torch.export.ExportedProgram.graph_signature",
               "\n# inputs\np_wpe_weight: PARAMETER target='wpe.weight'\np_cls: PARAMETER target='cls'\n"
               "c_lifted: CONSTANT_TENSOR target='lifted'\n");
}

// GPT-2's position table gathered at positions 0..2 and unsqueezed, [1, 3, 2]: the rows come back
// as the table [3, 2] under the parameter's name, expanded to what the constant was.
TEST(ModuleParams, APositionTableFoldedIntoItsGatheredRowsComesBack) {
  GraphBuilder b;
  const std::vector<float> rows = {0.1f, -0.4f, 0.7f, 0.2f, -0.9f, 0.3f};
  folded(&b, "embedding_1", {1, 3, 2}, rows, "['add', 'arange', 'wpe.weight', 'unsqueeze', 'val_4']");
  b.node("add", "Add", {"tok", "embedding_1"}, "h");
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  ASSERT_NE(b.find("wpe.weight"), nullptr);
  EXPECT_EQ(b.find("embedding_1"), nullptr);
  EXPECT_EQ(values(*b.find("wpe.weight")), rows);
  EXPECT_EQ(std::vector<int64_t>(b.find("wpe.weight")->dims().begin(), b.find("wpe.weight")->dims().end()),
            (std::vector<int64_t>{3, 2}));
  const onnx::NodeProto& e = b.named("embedding_1@restored");
  EXPECT_EQ(e.op_type(), "Expand");
  EXPECT_EQ(e.input(0), "wpe.weight");
  EXPECT_EQ(e.output(0), "embedding_1");
  EXPECT_EQ(b.g.node(0).name(), "embedding_1@restored");  // before its reader
  EXPECT_TRUE(r.parameters.count("wpe.weight"));
  EXPECT_TRUE(r.warnings.empty());
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0].action, "restored from the folded constant embedding_1 as [3,2]");
}

// A class token expanded over a batch of 2: the copies are one parameter [1, 1, 2] again, so its
// gradient is their sum, as in the module.
TEST(ModuleParams, AClassTokenExpandedOverTheBatchIsOneParameter) {
  GraphBuilder b;
  folded(&b, "expand", {2, 1, 2}, {0.5f, -0.25f, 0.5f, -0.25f}, "['cls', 'val_6']");
  b.node("concat", "Concat", {"expand", "patches"}, "h");
  const ModuleParameters r = restore_module_parameters(&b.g, {});
  ASSERT_NE(b.find("cls"), nullptr);
  EXPECT_EQ(values(*b.find("cls")), (std::vector<float>{0.5f, -0.25f}));
  EXPECT_EQ(b.find("cls")->dims_size(), 3);
  EXPECT_EQ(b.named("expand@restored").op_type(), "Expand");
  EXPECT_TRUE(r.warnings.empty());
}

// A fold that computed (a weight times a constant) or repeated one row at two positions cannot be
// trained as the parameter: it stays a constant, with one warning naming both ways out.
TEST(ModuleParams, AFoldImportCannotUndoStaysFrozenWithAWarning) {
  for (const auto& [name, rows] : std::vector<std::pair<std::string, std::vector<float>>>{
           {"mul", {0.1f, -0.4f, 0.7f, 0.2f}}, {"embedding_2", {0.1f, -0.4f, 0.7f, 0.2f, 0.1f, -0.4f}}}) {
    GraphBuilder b;
    folded(&b, name, {static_cast<int64_t>(rows.size() / 2), 2}, rows, "['wpe.weight', 'val_1']");
    b.node("add", "Add", {"tok", name}, "h");
    const ModuleParameters r = restore_module_parameters(&b.g, {});
    EXPECT_NE(b.find(name), nullptr) << name;
    EXPECT_EQ(b.find("wpe.weight"), nullptr) << name;
    EXPECT_FALSE(r.parameters.count(name)) << name;
    ASSERT_EQ(r.warnings.size(), 1u) << name;
    EXPECT_EQ(r.warnings[0], "constant '" + name + "' is folded from parameter wpe.weight and stays frozen: export "
                             "with optimize=False (samples/export_model.py) to train the parameter, or train the "
                             "constant as it is with parameters.trained: [" + name + "]");
    ASSERT_EQ(r.notes.size(), 1u) << name;
    EXPECT_EQ(r.notes[0].action, "folded from wpe.weight, not trained") << name;
  }
}

// parameters.trained: the constant trains as the file holds it, silently.
TEST(ModuleParams, ParametersTrainedTrainsAFoldedConstantAsHeld) {
  GraphBuilder b;
  folded(&b, "mul", {2, 2}, {0.1f, -0.4f, 0.7f, 0.2f}, "['wpe.weight', 'val_1']");
  b.node("add", "Add", {"tok", "mul"}, "h");
  ParameterChoices choices;
  choices.trained = {"mul"};
  const ModuleParameters r = restore_module_parameters(&b.g, choices);
  EXPECT_NE(b.find("mul"), nullptr);
  EXPECT_TRUE(r.parameters.count("mul"));
  EXPECT_TRUE(r.warnings.empty());
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0].action, "trained as the file holds it");
}

// parameters.untied naming a parameter the module itself ties (one placeholder read by two FX
// nodes): each module reads a copy of its own, named after it; the module whose name the
// parameter has keeps it.
TEST(ModuleParams, UntiedOnTheModulesOwnTieGivesEachModuleItsCopy) {
  GraphBuilder b;
  b.declared("emb.weight", {2, 2}, {0.3f, -1.2f, 0.8f, 0.1f});
  GraphBuilder::fx(b.node("gather", "Gather", {"emb.weight", "ids"}, "h"), "embedding", "embedding.default",
                   "%p_emb_weight, %ids", "emb");
  GraphBuilder::fx(b.node("head", "MatMul", {"h", "emb.weight"}, "y"), "linear", "linear.default",
                   "%h, %p_emb_weight", "head");
  ParameterChoices choices;
  choices.untied = {"emb.weight"};
  const ModuleParameters r = restore_module_parameters(&b.g, choices);
  EXPECT_EQ(b.named("gather").input(0), "emb.weight");
  EXPECT_EQ(b.named("head").input(1), "head.weight");
  ASSERT_NE(b.find("head.weight"), nullptr);
  EXPECT_EQ(values(*b.find("head.weight")), values(*b.find("emb.weight")));
  EXPECT_TRUE(r.parameters.count("head.weight"));
  EXPECT_TRUE(r.warnings.empty());
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0].action, "untied into head.weight (emb keeps emb.weight)");
  EXPECT_EQ(r.notes[0].why, "parameters.untied names it");
}

// One module reading its parameter at two nodes (a module called twice) has nothing to untie:
// parameters.untied naming it says so in one line.
TEST(ModuleParams, UntiedOnAModuleCalledTwiceSaysItStaysOne) {
  GraphBuilder b;
  b.declared("fc.weight", {2, 2}, {0.3f, -1.2f, 0.8f, 0.1f});
  GraphBuilder::fx(b.node("first", "MatMul", {"x", "fc.weight"}, "h"), "linear", "linear.default", "%x, %p_fc_weight", "fc");
  GraphBuilder::fx(b.node("second", "MatMul", {"h", "fc.weight"}, "y"), "linear_1", "linear.default", "%h, %p_fc_weight",
                   "fc");
  ParameterChoices choices;
  choices.untied = {"fc.weight"};
  const ModuleParameters r = restore_module_parameters(&b.g, choices);
  EXPECT_EQ(b.named("second").input(1), "fc.weight");
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0], "parameters.untied names 'fc.weight', which one module (fc) reads at several nodes: it "
                           "stays one tensor");
}

}  // namespace
}  // namespace pt
