// What import makes of the nodes an export without its optimizer writes
// (torch.onnx.export(..., dynamo=True, optimize=False)): sequence ops folded into Split, Concat
// and constants (onnx_import/sequence_fold.h), CastLike rewritten as Cast (cast_like.h), and
// opset-18 axes computed from Constant nodes read as constants (opset_adapt.h). Small graphs
// built here; the numbers are checked against onnxruntime on samples/exports/*_noopt_min.onnx
// (oracle.noopt_forward_onnxruntime).
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "onnx_import/export.h"
#include "onnx_import/import.h"
#include "onnx_import/sequence_fold.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

// A model built node by node: inputs [batch, dims...], int64/float initializers and Constants.
class ModelBuilder {
 public:
  explicit ModelBuilder(int64_t opset) {
    m_.set_ir_version(8);
    m_.add_opset_import()->set_version(opset);
    m_.mutable_graph()->set_name("noopt");
  }

  void input(const std::string& name, int dtype, const std::vector<int64_t>& dims) {
    auto* vi = m_.mutable_graph()->add_input();
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(dtype);
    tt->mutable_shape()->add_dim()->set_dim_param("batch");
    for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
  }

  void output(const std::string& name, int dtype = onnx::TensorProto::FLOAT) {
    auto* vi = m_.mutable_graph()->add_output();
    vi->set_name(name);
    vi->mutable_type()->mutable_tensor_type()->set_elem_type(dtype);
    vi->mutable_type()->mutable_tensor_type()->mutable_shape();  // re-inferred at import
  }

  onnx::NodeProto* node(const std::string& op, const std::vector<std::string>& in,
                        const std::vector<std::string>& out) {
    auto* n = m_.mutable_graph()->add_node();
    n->set_name("n_" + out[0]);
    n->set_op_type(op);
    for (const auto& i : in) n->add_input(i);
    for (const auto& o : out) n->add_output(o);
    return n;
  }

  static void attr(onnx::NodeProto* n, const std::string& name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }

  // A Constant node holding int64 values (dims {} for a scalar).
  void constant(const std::string& name, const std::vector<int64_t>& dims, const std::vector<int64_t>& v) {
    auto* a = node("Constant", {}, {name})->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    fill(a->mutable_t(), dims, v);
  }

  void ints(const std::string& name, const std::vector<int64_t>& dims, const std::vector<int64_t>& v) {
    auto* t = m_.mutable_graph()->add_initializer();
    t->set_name(name);
    fill(t, dims, v);
  }

  void float_constant(const std::string& name, float v) {
    auto* a = node("Constant", {}, {name})->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
    a->mutable_t()->add_float_data(v);
  }

  // Saves the model and imports it at batch 2.
  Graph import(const std::string& file) const {
    const std::string p = path(file);
    save_model(m_, p);
    ImportOptions o;
    o.batch = 2;
    return import_model(p, o);
  }

  // The UserError import gives, or "" when it imports.
  std::string import_error(const std::string& file) const {
    try {
      import(file);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }

  static std::string path(const std::string& file) {
    fs::path dir = fs::temp_directory_path() / "pt_sequence_fold_test";
    fs::create_directories(dir);
    return (dir / file).string();
  }

 private:
  static void fill(onnx::TensorProto* t, const std::vector<int64_t>& dims, const std::vector<int64_t>& v) {
    t->set_data_type(onnx::TensorProto::INT64);
    for (int64_t d : dims) t->add_dims(d);
    for (int64_t x : v) t->add_int64_data(x);
  }

  onnx::ModelProto m_;
};

std::vector<std::string> op_types(const Graph& g) {
  std::vector<std::string> out;
  for (const Node& n : g.nodes) out.push_back(n.op_type);
  return out;
}

std::vector<int64_t> shape_of(const Graph& g, const std::string& value) {
  return g.value(g.find(value)).type.shape;
}

// torch.split(x, 3, dim=1) on x [B, 8] as optimize=False writes it: SplitToSequence with a
// scalar split from a Constant, SequenceAt at Constant positions (one negative).
TEST(SequenceFold, SplitToSequenceWithAScalarSplitBecomesSplit) {
  ModelBuilder b(20);
  b.input("x", onnx::TensorProto::FLOAT, {8});
  b.constant("three", {}, {3});
  b.constant("zero", {}, {0});
  b.constant("last", {}, {-1});
  ModelBuilder::attr(b.node("SplitToSequence", {"x", "three"}, {"seq"}), "axis", 1);
  b.node("SequenceAt", {"seq", "zero"}, {"first"});
  b.node("SequenceAt", {"seq", "last"}, {"third"});
  b.node("Relu", {"first"}, {"y"});
  b.node("Neg", {"third"}, {"z"});
  b.output("y");
  b.output("z");
  Graph g = b.import("split_scalar.onnx");
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Split", "Relu", "Neg"}));
  const Node& split = g.nodes[0];
  EXPECT_EQ(split.attr_int("axis", -1), 1);
  ASSERT_EQ(split.outputs.size(), 3u);
  // Parts of 3, the last smaller: 3 + 3 + 2 = 8.
  const Value& sizes = g.value(split.inputs[1]);
  ASSERT_TRUE(sizes.init);
  EXPECT_EQ(int_values(*sizes.init), (std::vector<int64_t>{3, 3, 2}));
  EXPECT_EQ(g.nodes[1].inputs[0], split.outputs[0]);
  EXPECT_EQ(g.nodes[2].inputs[0], split.outputs[2]);
  EXPECT_EQ(shape_of(g, "y"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(shape_of(g, "z"), (std::vector<int64_t>{2, 2}));
}

// A deep model: each layer's SplitToSequence folds once the shape of its input is known, which
// takes the layers before it folded first (a 1B GPT of 20 layers, as torch 2.15 exports
// q, k, v = qkv.split(d, dim=2), stopped at layer 16 when import gave up after 32 rounds).
TEST(SequenceFold, EveryLayerOfADeepChainFolds) {
  ModelBuilder b(20);
  b.input("x0", onnx::TensorProto::FLOAT, {8});
  b.constant("four", {}, {4});
  b.constant("zero", {}, {0});
  b.constant("one", {}, {1});
  constexpr int kLayers = 48;
  for (int l = 0; l < kLayers; ++l) {
    const std::string x = "x" + std::to_string(l), seq = "seq" + std::to_string(l), at = std::to_string(l);
    ModelBuilder::attr(b.node("SplitToSequence", {x, "four"}, {seq}), "axis", 1);
    b.node("SequenceAt", {seq, "zero"}, {"a" + at});
    b.node("SequenceAt", {seq, "one"}, {"b" + at});
    ModelBuilder::attr(b.node("Concat", {"b" + at, "a" + at}, {"x" + std::to_string(l + 1)}), "axis", 1);
  }
  b.output("x" + std::to_string(kLayers));
  Graph g = b.import("deep_chain.onnx");
  int splits = 0;
  for (const std::string& op : op_types(g)) {
    EXPECT_TRUE(op == "Split" || op == "Concat") << op;
    splits += op == "Split";
  }
  EXPECT_EQ(splits, kLayers);
  EXPECT_EQ(shape_of(g, "x" + std::to_string(kLayers)), (std::vector<int64_t>{2, 8}));
}

// Sizes given as a 1-D tensor; ConcatFromSequence with new_axis (torch.stack of the parts) and
// SequenceLength folded too; a part that is a graph output comes out through an Identity.
TEST(SequenceFold, SizesConcatFromSequenceAndLength) {
  ModelBuilder b(17);
  b.input("x", onnx::TensorProto::FLOAT, {6});
  b.ints("sizes", {2}, {2, 4});
  b.ints("one", {}, {1});
  ModelBuilder::attr(b.node("SplitToSequence", {"x", "sizes"}, {"seq"}), "axis", -1);
  b.node("SequenceAt", {"seq", "one"}, {"wide"});
  auto* cat = b.node("ConcatFromSequence", {"seq"}, {"back"});
  ModelBuilder::attr(cat, "axis", 1);
  b.node("SequenceLength", {"seq"}, {"count"});
  b.node("Cast", {"count"}, {"count_f"})->add_attribute()->CopyFrom([] {
    onnx::AttributeProto a;
    a.set_name("to");
    a.set_type(onnx::AttributeProto::INT);
    a.set_i(onnx::TensorProto::FLOAT);
    return a;
  }());
  b.node("Mul", {"back", "count_f"}, {"y"});
  b.output("y");
  b.output("wide");
  Graph g = b.import("split_sizes.onnx");
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Split", "Identity", "Concat", "Mul"}));
  EXPECT_EQ(int_values(*g.value(g.nodes[0].inputs[1]).init), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(g.nodes[0].attr_int("axis", -1), 1);  // -1 of rank 2
  EXPECT_EQ(shape_of(g, "wide"), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(shape_of(g, "back"), (std::vector<int64_t>{2, 6}));
  // SequenceLength = 2, cast and folded into the Mul's constant.
  const Value& count = g.value(g.nodes[3].inputs[1]);
  ASSERT_TRUE(count.init);
  EXPECT_TRUE(count.constant);
  EXPECT_EQ(count.init->as<float>()[0], 2.0f);
}

// No split: parts of 1, squeezed when keepdims = 0 (iterating over a tensor's rows); the parts
// of a SequenceConstruct are its inputs; stacking them with new_axis gives Unsqueeze + Concat.
TEST(SequenceFold, KeepdimsZeroAndSequenceConstruct) {
  ModelBuilder b(17);
  b.input("x", onnx::TensorProto::FLOAT, {2, 4});
  b.ints("one", {}, {1});
  auto* split = b.node("SplitToSequence", {"x"}, {"rows"});
  ModelBuilder::attr(split, "axis", 1);
  ModelBuilder::attr(split, "keepdims", 0);
  b.node("SequenceAt", {"rows", "one"}, {"row1"});
  b.node("Relu", {"x"}, {"r"});
  b.node("SequenceConstruct", {"r", "x"}, {"pair"});
  auto* stack = b.node("ConcatFromSequence", {"pair"}, {"stacked"});
  ModelBuilder::attr(stack, "axis", 0);
  ModelBuilder::attr(stack, "new_axis", 1);
  b.node("Neg", {"row1"}, {"y"});
  b.output("y");
  b.output("stacked");
  Graph g = b.import("keepdims.onnx");
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Split", "Squeeze", "Squeeze", "Relu", "Unsqueeze",
                                                   "Unsqueeze", "Concat", "Neg"}));
  EXPECT_EQ(int_values(*g.value(g.nodes[0].inputs[1]).init), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(shape_of(g, "y"), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(shape_of(g, "stacked"), (std::vector<int64_t>{2, 2, 2, 4}));
  EXPECT_EQ(g.nodes[4].inputs[0], g.find("r"));
  EXPECT_EQ(g.nodes[5].inputs[0], g.find("x"));
}

// Split sizes computed at run time cannot be folded: one line naming the node.
TEST(SequenceFoldErrors, RunTimeSplitSizesNameTheNode) {
  ModelBuilder b(17);
  b.input("x", onnx::TensorProto::FLOAT, {8});
  b.input("k", onnx::TensorProto::INT64, {});
  b.ints("zero", {}, {0});
  b.node("ReduceSum", {"k"}, {"size"});
  ModelBuilder::attr(b.node("SplitToSequence", {"x", "size"}, {"seq"}), "axis", 1);
  b.node("SequenceAt", {"seq", "zero"}, {"y"});
  b.output("y");
  const std::string p = ModelBuilder::path("runtime_split.onnx");
  EXPECT_EQ(b.import_error("runtime_split.onnx"),
            p + ": node 'n_seq' (SplitToSequence, opset 17): sequence op SplitToSequence cannot be "
                "folded: its split sizes, positions or input shape are computed at run time, or its "
                "sequence is read by an op other than SequenceAt, ConcatFromSequence or "
                "SequenceLength; export with constant split sizes (torch.split with int sizes) and "
                "constant indices");
}

TEST(SequenceFoldErrors, SizesThatDoNotSumAndPositionsOutOfRange) {
  ModelBuilder b(17);
  b.input("x", onnx::TensorProto::FLOAT, {8});
  b.ints("sizes", {2}, {3, 4});
  b.ints("zero", {}, {0});
  ModelBuilder::attr(b.node("SplitToSequence", {"x", "sizes"}, {"seq"}), "axis", 1);
  b.node("SequenceAt", {"seq", "zero"}, {"y"});
  b.output("y");
  const std::string p = ModelBuilder::path("bad_sizes.onnx");
  EXPECT_EQ(b.import_error("bad_sizes.onnx"),
            p + ": node 'n_seq' (SplitToSequence, opset 17): split sizes sum to 7, not to the 8 of "
                "axis 1; check the bound dimensions (--micro-batch, --dim) against the model");

  ModelBuilder c(17);
  c.input("x", onnx::TensorProto::FLOAT, {8});
  c.ints("four", {}, {4});
  c.ints("two", {}, {2});
  ModelBuilder::attr(c.node("SplitToSequence", {"x", "four"}, {"seq"}), "axis", 1);
  c.node("SequenceAt", {"seq", "two"}, {"y"});
  c.output("y");
  const std::string q = ModelBuilder::path("bad_position.onnx");
  EXPECT_EQ(c.import_error("bad_position.onnx"),
            q + ": node 'n_y' (SequenceAt, opset 17): position 2 is out of range for a sequence of "
                "2; fix the index the model uses and export again");
}

// CastLike(Constant 0.25, scores) as optimize=False writes the attention scale: a Cast to the
// dtype of scores, folded into a float constant (not a parameter); CastLike of a tensor computed
// at run time stays as a Cast.
TEST(CastLike, BecomesCastOnceTheTargetDtypeIsKnown) {
  ModelBuilder b(20);
  b.input("x", onnx::TensorProto::FLOAT, {4});
  b.ints("ids", {4}, {0, 1, 2, 3});
  b.float_constant("quarter", 0.25f);
  b.node("CastLike", {"quarter", "x"}, {"scale"});
  b.node("Mul", {"x", "scale"}, {"scaled"});
  b.node("CastLike", {"scaled", "ids"}, {"y"});
  b.output("y", onnx::TensorProto::INT64);
  Graph g = b.import("cast_like.onnx");
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Mul", "Cast"}));
  const Value& scale = g.value(g.nodes[0].inputs[1]);
  ASSERT_TRUE(scale.init);
  EXPECT_FALSE(scale.is_parameter());
  EXPECT_EQ(scale.type.dtype, DType::kFloat32);
  EXPECT_EQ(scale.init->as<float>()[0], 0.25f);
  EXPECT_EQ(g.nodes[1].attr_int("to", 0), static_cast<int64_t>(DType::kInt64));
  EXPECT_EQ(g.nodes[1].inputs.size(), 1u);
  EXPECT_EQ(g.value(g.outputs[0]).type, (TensorType{DType::kInt64, {2, 4}}));
}

// ReduceMean-18's axes as optimize=False writes them: Reshape(Constant [-1, -2], Constant [-1]),
// read as the constant [-1, -2] when the node is adapted to its opset-17 form.
TEST(OptimizeFalse, ReduceAxesComputedFromConstantsAreConstant) {
  ModelBuilder b(20);
  b.input("x", onnx::TensorProto::FLOAT, {3, 4, 5});
  b.constant("axes_raw", {2}, {-1, -2});
  b.constant("flat", {1}, {-1});
  b.node("Reshape", {"axes_raw", "flat"}, {"axes"});
  ModelBuilder::attr(b.node("ReduceMean", {"x", "axes"}, {"y"}), "keepdims", 1);
  b.output("y");
  Graph g = b.import("reduce_axes.onnx");
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"ReduceMean"}));
  EXPECT_EQ(g.nodes[0].attr_ints("axes"), (std::vector<int64_t>{-1, -2}));
  EXPECT_EQ(shape_of(g, "y"), (std::vector<int64_t>{2, 3, 1, 1}));
}

}  // namespace
}  // namespace pt
