// Tests of evaluate_constant. The oracle is ONNX's own node conformance data (Debian's
// libonnx-testdata): every single-node test whose op folding handles is run, and its outputs
// compared with output_K.pb. Hand tests cover the torch shape pattern, older-opset attribute
// forms and the user errors.
#include "onnx_import/fold.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "core/error.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

// Debian's conformance data, or $PT_NODE_TEST_ROOT (the newer cases tests/oracle/make_node_cases.py
// writes from the onnx package).
const fs::path kNodeTests = std::getenv("PT_NODE_TEST_ROOT") && *std::getenv("PT_NODE_TEST_ROOT")
                                ? fs::path(std::getenv("PT_NODE_TEST_ROOT"))
                                : fs::path("/usr/share/libonnx-testdata/data/node");

// The ops evaluate_constant folds (its registry in fold.cc).
const std::set<std::string> kFoldedOps = {
    "Abs", "Add", "And", "Cast", "CastLike", "Ceil", "Concat", "Constant", "ConstantOfShape",
    "Cos", "CumSum", "Div", "Equal", "Exp", "Expand", "Floor", "Gather", "GatherElements",
    "GatherND", "Greater", "GreaterOrEqual", "Identity", "IsNaN", "Less", "LessOrEqual", "Max",
    "Min", "Mod", "Mul", "Neg", "Not", "Or", "Pow", "Range", "Reciprocal", "ReduceMax",
    "ReduceMin", "ReduceProd", "ReduceSum", "Reshape", "Shape", "Size", "Sin", "Slice", "Sqrt",
    "Squeeze", "Sub", "Tile", "Transpose", "Trilu", "Unsqueeze", "Where", "Xor"};

// Dtypes folding computes on; a conformance case with another may fold to nullopt and is skipped.
const std::set<DType> kFoldedDtypes = {DType::kFloat32, DType::kFloat64, DType::kInt64,
                                       DType::kInt32,   DType::kInt8,    DType::kUInt8,
                                       DType::kBool};

onnx::ModelProto load_model(const fs::path& path) {
  onnx::ModelProto model;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f && model.ParseFromIstream(&f)) << "cannot parse " << path;
  return model;
}

onnx::TensorProto load_tensor(const fs::path& path) {
  onnx::TensorProto t;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f && t.ParseFromIstream(&f)) << "cannot parse " << path;
  return t;
}

int64_t default_opset(const onnx::ModelProto& model) {
  for (const auto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") return o.version();
  return 0;
}

// Conformance directories holding one node of a folded op in the default domain.
std::vector<std::string> discover_cases() {
  std::vector<std::string> names;
  if (!fs::is_directory(kNodeTests)) return names;
  for (const auto& entry : fs::directory_iterator(kNodeTests)) {
    if (!fs::exists(entry.path() / "model.onnx")) continue;
    onnx::ModelProto model = load_model(entry.path() / "model.onnx");
    if (model.graph().node_size() != 1) continue;
    const onnx::NodeProto& n = model.graph().node(0);
    if (n.domain().empty() && kFoldedOps.count(n.op_type())) names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

const std::vector<std::string>& cases() {
  static const std::vector<std::string> all = discover_cases();
  return all;
}

Node node_from_proto(const onnx::NodeProto& n, const std::string& name) {
  Node node;
  node.name = n.name().empty() ? name : n.name();
  node.op_type = n.op_type();
  for (const auto& a : n.attribute()) node.attrs[a.name()] = attr_from_proto(a, node.label());
  for (int i = 0; i < n.input_size(); ++i)
    node.inputs.push_back(n.input(i).empty() ? kNoValue : static_cast<ValueId>(i));
  for (int i = 0; i < n.output_size(); ++i) node.outputs.push_back(100 + i);
  return node;
}

std::string first_unfolded_dtype(const std::vector<int32_t>& dtypes) {
  for (int32_t d : dtypes)
    if (!kFoldedDtypes.count(static_cast<DType>(d))) return dtype_name(static_cast<DType>(d));
  return "";
}

// Floats within 1e-5 relative (NaN matches NaN); everything else bit for bit.
void expect_same(const Tensor& want, const Tensor& got, const std::string& what) {
  ASSERT_EQ(want.type.str(), got.type.str()) << what;
  const int64_t n = want.type.numel();
  auto near = [](double w, double g) {
    return (std::isnan(w) && std::isnan(g)) || w == g ||
           std::abs(w - g) <= 1e-5 * std::max(std::abs(w), std::abs(g));
  };
  if (want.type.dtype == DType::kFloat32) {
    for (int64_t i = 0; i < n; ++i)
      ASSERT_TRUE(near(want.as<float>()[i], got.as<float>()[i]))
          << what << "[" << i << "]: want " << want.as<float>()[i] << ", got " << got.as<float>()[i];
  } else if (want.type.dtype == DType::kFloat64) {
    for (int64_t i = 0; i < n; ++i)
      ASSERT_TRUE(near(want.as<double>()[i], got.as<double>()[i]))
          << what << "[" << i << "]: want " << want.as<double>()[i] << ", got " << got.as<double>()[i];
  } else {
    ASSERT_TRUE(want.data == got.data) << what << ": values differ";
  }
}

// Maps a graph input/output name to its index K (the K of input_K.pb / output_K.pb).
int index_of(const google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>& list,
             const std::string& name) {
  for (int i = 0; i < list.size(); ++i)
    if (list.Get(i).name() == name) return i;
  return -1;
}

class Conformance : public testing::TestWithParam<std::string> {};

TEST_P(Conformance, MatchesOnnxReference) {
  const fs::path dir = kNodeTests / GetParam();
  const onnx::ModelProto model = load_model(dir / "model.onnx");
  const onnx::GraphProto& g = model.graph();
  for (const auto& vi : g.input())
    if (!vi.type().has_tensor_type()) GTEST_SKIP() << "input '" << vi.name() << "' is not a tensor";
  std::vector<int32_t> dtypes;
  for (const auto& vi : g.input()) dtypes.push_back(vi.type().tensor_type().elem_type());
  for (const auto& vi : g.output()) dtypes.push_back(vi.type().tensor_type().elem_type());
  for (const auto& vi : g.input())
    if (vi.type().tensor_type().elem_type() == onnx::TensorProto::STRING)
      GTEST_SKIP() << "string input";
  const onnx::NodeProto& np = g.node(0);
  const Node node = node_from_proto(np, GetParam());
  int sets = 0;
  for (const auto& set : fs::directory_iterator(dir)) {
    if (!set.is_directory()) continue;
    ++sets;
    std::vector<Tensor> values;
    values.reserve(static_cast<size_t>(np.input_size()));
    std::vector<const Tensor*> inputs;
    for (const std::string& name : np.input()) {
      if (name.empty()) {
        inputs.push_back(nullptr);
        continue;
      }
      const int k = index_of(g.input(), name);
      ASSERT_GE(k, 0) << "node input '" << name << "' is not a graph input";
      values.push_back(tensor_from_proto(
          load_tensor(set.path() / ("input_" + std::to_string(k) + ".pb")), name));
      inputs.push_back(&values.back());
    }
    std::optional<std::vector<Tensor>> got = evaluate_constant(node, inputs, default_opset(model));
    if (!got) {
      const std::string dtype = first_unfolded_dtype(dtypes);
      if (!dtype.empty()) GTEST_SKIP() << "dtype " << dtype << " is outside folding's set";
      FAIL() << node.label() << " did not fold (opset " << default_opset(model) << ")";
    }
    ASSERT_EQ(got->size(), static_cast<size_t>(np.output_size()));
    for (int i = 0; i < np.output_size(); ++i) {
      const int k = index_of(g.output(), np.output(i));
      ASSERT_GE(k, 0);
      const fs::path path = set.path() / ("output_" + std::to_string(k) + ".pb");
      if (load_tensor(path).data_type() == onnx::TensorProto::STRING) GTEST_SKIP() << "string output";
      expect_same(tensor_from_proto(load_tensor(path), np.output(i)), (*got)[static_cast<size_t>(i)],
                  set.path().filename().string() + " output " + std::to_string(i));
    }
  }
  EXPECT_GT(sets, 0) << "no test_data_set_* in " << dir;
}

INSTANTIATE_TEST_SUITE_P(Node, Conformance, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Conformance);

TEST(ConformanceData, EnoughCasesFound) {
  ASSERT_GE(cases().size(), 100u) << "libonnx-testdata missing under " << kNodeTests
                                  << "? found " << cases().size() << " folded single-node cases";
}

// ---- Hand tests ----

Tensor ints(std::vector<int64_t> v, std::vector<int64_t> shape) {
  Tensor t;
  t.type = {DType::kInt64, std::move(shape)};
  t.data.resize(v.size() * sizeof(int64_t));
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

Tensor floats(int64_t n, std::vector<int64_t> shape) {
  Tensor t;
  t.type = {DType::kFloat32, std::move(shape)};
  t.data.resize(static_cast<size_t>(n) * sizeof(float));
  for (int64_t i = 0; i < n; ++i) t.as<float>()[i] = static_cast<float>(i);
  return t;
}

std::vector<int64_t> values_of(const Tensor& t) {
  return std::vector<int64_t>(t.as<int64_t>(), t.as<int64_t>() + t.type.numel());
}

Node make_node(const std::string& name, const std::string& op, size_t n_inputs) {
  Node node;
  node.name = name;
  node.op_type = op;
  for (size_t i = 0; i < n_inputs; ++i) node.inputs.push_back(static_cast<ValueId>(i));
  node.outputs = {100};
  return node;
}

Tensor fold1(const Node& node, const std::vector<const Tensor*>& inputs, int64_t opset = 17) {
  std::optional<std::vector<Tensor>> out = evaluate_constant(node, inputs, opset);
  EXPECT_TRUE(out.has_value()) << node.label() << " did not fold";
  return out ? (*out)[0] : Tensor{};
}

// x.view(x.size(0), -1) as torch exports it: Shape -> Gather -> Unsqueeze -> Concat -> Reshape.
TEST(Fold, TorchViewPattern) {
  const Tensor x = floats(24, {2, 3, 4});
  const Tensor shape = fold1(make_node("shape", "Shape", 1), {&x});
  EXPECT_EQ(values_of(shape), (std::vector<int64_t>{2, 3, 4}));
  const Tensor zero = ints({0}, {});
  const Tensor dim0 = fold1(make_node("gather", "Gather", 2), {&shape, &zero});
  EXPECT_EQ(dim0.type.str(), "int64[]");
  EXPECT_EQ(values_of(dim0), std::vector<int64_t>{2});
  const Tensor axes = ints({0}, {1});
  const Tensor dim0_1d = fold1(make_node("unsqueeze", "Unsqueeze", 2), {&dim0, &axes});
  EXPECT_EQ(dim0_1d.type.str(), "int64[1]");
  const Tensor minus_one = ints({-1}, {1});
  Node concat = make_node("concat", "Concat", 2);
  concat.attrs["axis"] = int64_t{0};
  const Tensor target = fold1(concat, {&dim0_1d, &minus_one});
  EXPECT_EQ(values_of(target), (std::vector<int64_t>{2, -1}));
  const Tensor y = fold1(make_node("reshape", "Reshape", 2), {&x, &target});
  EXPECT_EQ(y.type.str(), "float32[2,12]");
  EXPECT_EQ(y.data, x.data);
}

// shape[-2:] as torch exports it: ends = INT64_MAX, clamped to the dim.
TEST(Fold, SliceClampsTorchsOpenEnd) {
  const Tensor shape = ints({8, 16, 32, 64}, {4});
  const Tensor starts = ints({-2}, {1});
  const Tensor ends = ints({INT64_MAX}, {1});
  const Tensor axes = ints({0}, {1});
  const Tensor tail = fold1(make_node("s", "Slice", 4), {&shape, &starts, &ends, &axes});
  EXPECT_EQ(values_of(tail), (std::vector<int64_t>{32, 64}));
  const Tensor back = ints({INT64_MIN}, {1});
  const Tensor minus_one = ints({-1}, {1});
  const Tensor reversed =
      fold1(make_node("s", "Slice", 5), {&shape, &minus_one, &back, &axes, &minus_one});
  EXPECT_EQ(values_of(reversed), (std::vector<int64_t>{64, 32, 16, 8}));
}

TEST(Fold, GatherIndexOutOfRangeNamesTheNode) {
  const Tensor shape = ints({2, 3, 4}, {3});
  const Tensor index = ints({3}, {});
  try {
    evaluate_constant(make_node("dim3", "Gather", 2), {&shape, &index}, 17);
    FAIL() << "no UserError";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "node 'dim3' (Gather): index 3 is out of range for axis 0 of size 3; fix the "
                 "constants that feed this node and export again");
  }
}

TEST(Fold, ReshapeElementCountMismatchIsUserError) {
  const Tensor x = floats(6, {2, 3});
  const Tensor target = ints({4, 2}, {2});
  EXPECT_THROW(evaluate_constant(make_node("r", "Reshape", 2), {&x, &target}, 17), UserError);
}

TEST(Fold, SqueezeAndUnsqueezeTakeAxesAttributeBeforeOpset13) {
  const Tensor x = floats(6, {2, 3});
  Node unsqueeze = make_node("u", "Unsqueeze", 1);
  unsqueeze.attrs["axes"] = std::vector<int64_t>{0, -1};
  const Tensor y = fold1(unsqueeze, {&x}, 11);
  EXPECT_EQ(y.type.str(), "float32[1,2,3,1]");
  Node squeeze = make_node("s", "Squeeze", 1);
  squeeze.attrs["axes"] = std::vector<int64_t>{3};
  EXPECT_EQ(fold1(squeeze, {&y}, 11).type.str(), "float32[1,2,3]");
  EXPECT_EQ(fold1(make_node("s", "Squeeze", 1), {&y}, 11).type.str(), "float32[2,3]");
}

TEST(Fold, IntegerDivTruncatesTowardZero) {
  const Tensor a = ints({-7, 7, -7, 7}, {4});
  const Tensor b = ints({2, 2, -2, -2}, {4});
  EXPECT_EQ(values_of(fold1(make_node("d", "Div", 2), {&a, &b})),
            (std::vector<int64_t>{-3, 3, 3, -3}));
  const Tensor zero = ints({0}, {});
  EXPECT_THROW(evaluate_constant(make_node("d", "Div", 2), {&a, &zero}, 17), UserError);
}

TEST(Fold, ReduceProdOfShapeGivesElementCount) {
  const Tensor shape = ints({2, 3, 4}, {3});
  Node prod = make_node("p", "ReduceProd", 1);
  prod.attrs["keepdims"] = int64_t{0};
  const Tensor n = fold1(prod, {&shape});
  EXPECT_EQ(n.type.str(), "int64[]");
  EXPECT_EQ(values_of(n), std::vector<int64_t>{24});
}

TEST(Fold, UnfoldableGivesNullopt) {
  const Tensor x = floats(6, {2, 3});
  EXPECT_FALSE(evaluate_constant(make_node("m", "MatMul", 2), {&x, &x}, 17));
  Node cast = make_node("c", "Cast", 1);
  cast.attrs["to"] = int64_t{10};  // float16
  EXPECT_FALSE(evaluate_constant(cast, {&x}, 17));
  Tensor nan = floats(1, {});
  nan.as<float>()[0] = NAN;
  cast.attrs["to"] = int64_t{7};  // NaN has no int64 value
  EXPECT_FALSE(evaluate_constant(cast, {&nan}, 17));
  Node custom = make_node("a", "Add", 2);
  custom.domain = "com.example";
  EXPECT_FALSE(evaluate_constant(custom, {&x, &x}, 17));
}

TEST(Fold, ExpandRejectsShapesThatDoNotBroadcast) {
  const Tensor x = floats(3, {3});
  const Tensor target = ints({2, 4}, {2});
  EXPECT_THROW(evaluate_constant(make_node("e", "Expand", 2), {&x, &target}, 17), UserError);
}

// A constant bigger than kMaxFoldBytes stays a node and costs no memory: ConstantOfShape, Expand,
// Tile and Where to 2^40 elements or more, and Shape of an input of 2^45 bytes that has a type and no data.
TEST(Fold, TooLargeToBuildStaysANode) {
  const Tensor huge_shape = ints({1 << 20, 1 << 20}, {2});
  EXPECT_FALSE(evaluate_constant(make_node("c", "ConstantOfShape", 1), {&huge_shape}, 17));
  const Tensor one = floats(1, {1});
  EXPECT_FALSE(evaluate_constant(make_node("e", "Expand", 2), {&one, &huge_shape}, 17));
  const Tensor x = floats(6, {2, 3});
  const Tensor repeats = ints({int64_t{1} << 62, 1 << 20}, {2});
  EXPECT_FALSE(evaluate_constant(make_node("t", "Tile", 2), {&x, &repeats}, 17));
  Tensor cond;
  cond.type = {DType::kBool, {1 << 20, 1}};
  cond.data.resize(1 << 20);
  const Tensor row = floats(1 << 20, {1, 1 << 20});
  EXPECT_FALSE(evaluate_constant(make_node("w", "Where", 3), {&cond, &row, &row}, 17));
  const Tensor fits = ints({1 << 10, 1 << 10}, {2});
  EXPECT_EQ(fold1(make_node("c", "ConstantOfShape", 1), {&fits}).type.str(), "float32[1024,1024]");

  Tensor typed_only;
  typed_only.type = {DType::kFloat32, {1 << 20, 1 << 20, 1 << 3}};
  EXPECT_EQ(values_of(fold1(make_node("s", "Shape", 1), {&typed_only})),
            (std::vector<int64_t>{1 << 20, 1 << 20, 1 << 3}));
  EXPECT_EQ(values_of(fold1(make_node("n", "Size", 1), {&typed_only})),
            std::vector<int64_t>{int64_t{1} << 43});
}

}  // namespace
}  // namespace pt
