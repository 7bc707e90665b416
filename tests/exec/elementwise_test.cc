// Element-wise CPU kernels: ONNX's node conformance cases for every op of the family, then hand
// cases for what those do not cover (mask broadcasting, Gelu, run-time Clip bounds, Cast rules,
// declined specs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <utility>

#include "core/error.h"
#include "exec/cpu/cpu_kernels.h"
#include "tests/exec/node_case.h"

namespace pt::testing {
namespace {

// ---- conformance ----------------------------------------------------------------------------

struct OpCases {
  const char* prefix;  // case names are `prefix` or `prefix_...`
  KernelFactory factory;
  int min_passed;  // so the suite cannot pass by skipping everything
};

const std::vector<OpCases>& op_cases() {
  static const std::vector<OpCases> ops = {
      {"test_add", cpu::make_add, 3},         {"test_sub", cpu::make_sub, 4},
      {"test_mul", cpu::make_mul, 4},         {"test_div", cpu::make_div, 4},
      {"test_pow", cpu::make_pow, 10},        {"test_equal", cpu::make_equal, 2},
      {"test_where", cpu::make_where, 2},     {"test_sqrt", cpu::make_sqrt, 2},
      {"test_neg", cpu::make_neg, 2},         {"test_relu", cpu::make_relu, 1},
      {"test_erf", cpu::make_erf, 1},         {"test_tanh", cpu::make_tanh, 2},
      {"test_sigmoid", cpu::make_sigmoid, 2}, {"test_clip", cpu::make_clip, 11},
      {"test_cast", cpu::make_cast, 2},       {"test_dropout", cpu::make_dropout, 4},
  };
  return ops;
}

std::vector<NodeCase> all_cases() {
  std::vector<NodeCase> out;
  for (const OpCases& op : op_cases())
    for (const NodeCase& c : testing::op_cases(op.prefix, op.factory)) out.push_back(c);
  return out;
}

class Conformance : public ::testing::TestWithParam<NodeCase> {};

TEST_P(Conformance, MatchesReference) {
  const NodeCaseResult r = run_node_case(GetParam().name, GetParam().factory);
  if (r.kind == NodeCaseResult::kSkipped) GTEST_SKIP() << r.message;
  EXPECT_EQ(r.kind, NodeCaseResult::kPassed) << r.message;
}

INSTANTIATE_TEST_SUITE_P(Node, Conformance, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Conformance, EnoughCasesPassPerOp) {
  for (const OpCases& op : op_cases())
    EXPECT_GE(count_passed(testing::op_cases(op.prefix, op.factory)), op.min_passed) << op.prefix;
}

// ---- hand cases -----------------------------------------------------------------------------

// An input of a hand-built node: its type, its data, and whether the kernel sees it as constant.
struct Operand {
  TensorType type;
  std::vector<std::byte> data;
  bool constant = false;
};

template <class T>
Operand operand(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values,
                bool constant = false) {
  Operand o{{dtype, std::move(shape)}, std::vector<std::byte>(values.size() * sizeof(T)), constant};
  if (!values.empty()) std::memcpy(o.data.data(), values.data(), o.data.size());
  return o;
}

// One node `op` over `inputs` (an empty Operand is an omitted input) with outputs of `outputs`.
class HandNode {
 public:
  HandNode(const std::string& op, std::vector<Operand> inputs, std::vector<TensorType> outputs,
           std::map<std::string, AttrValue> attrs = {})
      : inputs_(std::move(inputs)), outputs_(std::move(outputs)) {
    Node node;
    node.op_type = op;
    node.attrs = std::move(attrs);
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const Operand& in = inputs_[i];
      const std::string name = "in" + std::to_string(i);
      if (in.type.dtype == DType::kUndefined)
        node.inputs.push_back(kNoValue);
      else if (in.constant)
        node.inputs.push_back(graph_.add_initializer(name, {in.type, in.data}, true));
      else
        node.inputs.push_back(graph_.add_value(name, in.type));
    }
    for (size_t k = 0; k < outputs_.size(); ++k)
      node.outputs.push_back(graph_.add_value("out" + std::to_string(k), outputs_[k]));
    graph_.add_node(std::move(node));
  }

  // The factory's kernel run once; output k's data, or nullopt when the factory declines.
  std::optional<std::vector<std::vector<std::byte>>> run(KernelFactory factory) {
    CpuContext ctx{&engine_, &stream_, 2};
    std::vector<TensorType> in_types;
    for (const Operand& in : inputs_) in_types.push_back(in.type);
    const KernelSpec spec{graph_, graph_.nodes[0], in_types, outputs_, &ctx};
    const std::unique_ptr<Kernel> kernel = factory(spec);
    if (!kernel) return std::nullopt;
    std::vector<Buffer> ins, outs;
    for (size_t i = 0; i < inputs_.size(); ++i)
      ins.push_back(inputs_[i].type.dtype == DType::kUndefined
                        ? Buffer{}
                        : Buffer{inputs_[i].data.data(), &in_types[i]});
    std::vector<std::vector<std::byte>> data(outputs_.size());
    for (size_t k = 0; k < outputs_.size(); ++k) {
      data[k].assign(static_cast<size_t>(outputs_[k].bytes()), std::byte{0xAB});
      outs.push_back({data[k].data(), &outputs_[k]});
    }
    std::vector<std::byte> scratch(kernel->scratch_bytes());
    kernel->run(ins, outs, scratch.data());
    stream_.wait();
    return data;
  }

 private:
  Graph graph_;
  std::vector<Operand> inputs_;
  std::vector<TensorType> outputs_;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
};

template <class T>
std::vector<T> values_of(const std::vector<std::byte>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  if (!bytes.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

// Runs `factory` on the node and returns output 0 as T; fails the test when declined.
template <class T>
std::vector<T> run_output(HandNode& node, KernelFactory factory) {
  const auto out = node.run(factory);
  if (!out) {
    ADD_FAILURE() << "factory declined the node";
    return {};
  }
  return values_of<T>((*out)[0]);
}

std::vector<float> ramp(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = scale * static_cast<float>(i % 97) + offset;
  return v;
}

constexpr int64_t kB = 2, kH = 3, kS = 5;
constexpr DType kF32 = DType::kFloat32;

// Attention-style mask: scores [B,H,S,S] combined with a causal mask [1,1,S,S], the mask as
// either operand. The output at (b,h,i,j) pairs scores[b,h,i,j] with mask[i,j].
TEST(Broadcast, MaskOverScoresInEveryBinaryOpAndOrder) {
  const std::vector<float> scores = ramp(kB * kH * kS * kS, 0.25f, -3.f);
  std::vector<float> mask(kS * kS);
  for (int64_t i = 0; i < kS; ++i)
    for (int64_t j = 0; j < kS; ++j) mask[static_cast<size_t>(i * kS + j)] = j <= i ? 2.f : -4.f;
  const TensorType big{kF32, {kB, kH, kS, kS}};
  struct Op {
    const char* name;
    KernelFactory factory;
    float (*ref)(float, float);
  };
  const Op ops[] = {{"Add", cpu::make_add, [](float a, float b) { return a + b; }},
                    {"Sub", cpu::make_sub, [](float a, float b) { return a - b; }},
                    {"Mul", cpu::make_mul, [](float a, float b) { return a * b; }},
                    {"Div", cpu::make_div, [](float a, float b) { return a / b; }}};
  for (const Op& op : ops) {
    for (const bool mask_first : {false, true}) {
      HandNode node(
          op.name,
          mask_first
              ? std::vector{operand(kF32, {1, 1, kS, kS}, mask), operand(kF32, big.shape, scores)}
              : std::vector{operand(kF32, big.shape, scores), operand(kF32, {1, 1, kS, kS}, mask)},
          {big});
      const std::vector<float> y = run_output<float>(node, op.factory);
      ASSERT_EQ(y.size(), scores.size());
      for (size_t i = 0; i < y.size(); ++i) {
        const float s = scores[i], m = mask[i % (kS * kS)];
        ASSERT_FLOAT_EQ(y[i], mask_first ? op.ref(m, s) : op.ref(s, m))
            << op.name << " at " << i << ", mask first: " << mask_first;
      }
    }
  }
}

// [B,1,S,1] + [H,1,S]: both operands broadcast, so neither is the output's shape (the plain
// loop, also for fp32).
template <class T>
void expect_both_operands_broadcast(DType dtype) {
  std::vector<T> a(kB * kS), b(kH * kS);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<T>(i * 100);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<T>(i);
  HandNode node("Add", {operand(dtype, {kB, 1, kS, 1}, a), operand(dtype, {kH, 1, kS}, b)},
                {{dtype, {kB, kH, kS, kS}}});
  const std::vector<T> y = run_output<T>(node, cpu::make_add);
  ASSERT_EQ(y.size(), static_cast<size_t>(kB * kH * kS * kS));
  for (int64_t n = 0; n < kB; ++n)
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t i = 0; i < kS; ++i)
        for (int64_t j = 0; j < kS; ++j)
          EXPECT_EQ(y[static_cast<size_t>(((n * kH + h) * kS + i) * kS + j)],
                    a[n * kS + i] + b[h * kS + j]);
}

TEST(Broadcast, BothOperandsBroadcast) {
  expect_both_operands_broadcast<int64_t>(DType::kInt64);
  expect_both_operands_broadcast<float>(kF32);
}

// Where(mask [1,1,S,S], scores [B,H,S,S], -1e9 []) as exported attention masking, fp32 and int64.
TEST(Broadcast, WhereMaskOverScores) {
  const std::vector<float> scores = ramp(kB * kH * kS * kS, 0.5f, -1.f);
  std::vector<uint8_t> cond(kS * kS);
  for (int64_t i = 0; i < kS * kS; ++i) cond[static_cast<size_t>(i)] = (i % kS) <= (i / kS);
  HandNode node(
      "Where",
      {operand(DType::kBool, {1, 1, kS, kS}, cond), operand(kF32, {kB, kH, kS, kS}, scores),
       operand(kF32, {}, std::vector<float>{-1e9f})},
      {{kF32, {kB, kH, kS, kS}}});
  const std::vector<float> y = run_output<float>(node, cpu::make_where);
  ASSERT_EQ(y.size(), scores.size());
  for (size_t i = 0; i < y.size(); ++i)
    EXPECT_EQ(y[i], cond[i % (kS * kS)] ? scores[i] : -1e9f) << i;

  HandNode ints("Where",
                {operand(DType::kBool, {1, 1, kS, kS}, cond),
                 operand(DType::kInt64, {}, std::vector<int64_t>{7}),
                 operand(DType::kInt64, {kB, 1, 1, 1}, std::vector<int64_t>{-1, -2})},
                {{DType::kInt64, {kB, 1, kS, kS}}});
  const std::vector<int64_t> z = run_output<int64_t>(ints, cpu::make_where);
  ASSERT_EQ(z.size(), static_cast<size_t>(kB * kS * kS));
  for (size_t i = 0; i < z.size(); ++i)
    EXPECT_EQ(z[i], cond[i % (kS * kS)] ? 7 : (i < kS * kS ? -1 : -2)) << i;
}

// Large enough to run the loops on several threads and across chunk boundaries.
TEST(Broadcast, LargeRowBroadcastMatchesReference) {
  const int64_t rows = 64, cols = 4099;
  const std::vector<float> x = ramp(rows * cols, 0.125f, -5.f), bias = ramp(cols, 1.f, 0.f);
  HandNode node("Sub", {operand(kF32, {cols}, bias), operand(kF32, {rows, cols}, x)},
                {{kF32, {rows, cols}}});
  const std::vector<float> y = run_output<float>(node, cpu::make_sub);
  ASSERT_EQ(y.size(), x.size());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], bias[i % cols] - x[i]) << i;
  HandNode div("Div",
               {operand(kF32, {rows, 1}, ramp(rows, 1.f, 1.f)), operand(kF32, {rows, cols}, x)},
               {{kF32, {rows, cols}}});
  const std::vector<float> q = run_output<float>(div, cpu::make_div);
  for (size_t i = 0; i < q.size(); ++i)
    ASSERT_FLOAT_EQ(q[i], (static_cast<float>(i / cols % 97) + 1.f) / x[i]) << i;
}

TEST(Gelu, BothFormsMatchTheirFormulas) {
  const std::vector<float> x = ramp(97, 0.125f, -6.f);
  for (const std::string form : {"none", "tanh"}) {
    HandNode node("Gelu", {operand(kF32, {97}, x)}, {{kF32, {97}}}, {{"approximate", form}});
    const std::vector<float> y = run_output<float>(node, cpu::make_gelu);
    ASSERT_EQ(y.size(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = x[i];
      const double want =
          form == "none"
              ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))
              : 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      EXPECT_NEAR(y[i], want, 1e-6 + 1e-4 * std::fabs(want)) << form << " x=" << v;
    }
  }
  HandNode bad("Gelu", {operand(kF32, {2}, std::vector<float>{1, 2})}, {{kF32, {2}}},
               {{"approximate", std::string("sigmoid")}});
  EXPECT_FALSE(bad.run(cpu::make_gelu));
}

// Erf's vectorised approximation stays within 2e-7 of std::erf over the whole float range used.
TEST(Erf, WithinTwoTenMillionthsOfStdErf) {
  const int n = 4801;
  const std::vector<float> x = ramp(n, 0.0025f, -6.f);
  HandNode node("Erf", {operand(kF32, {n}, x)}, {{kF32, {n}}});
  const std::vector<float> y = run_output<float>(node, cpu::make_erf);
  ASSERT_EQ(y.size(), x.size());
  double worst = 0;
  for (int i = 0; i < n; ++i) worst = std::max(worst, std::fabs(y[i] - std::erf(double(x[i]))));
  EXPECT_LT(worst, 2e-7);
}

// Pow with a constant scalar exponent (x^2 as exported) keeps std::pow's rules on negative bases.
TEST(Pow, ConstantExponentOnNegativeBases) {
  const std::vector<float> x = {-3.f, -0.5f, 0.f, 0.5f, 2.f};
  for (const float e : {2.f, 3.f, 0.5f, -1.f}) {
    HandNode node("Pow", {operand(kF32, {5}, x), operand(kF32, {}, std::vector<float>{e}, true)},
                  {{kF32, {5}}});
    const std::vector<float> y = run_output<float>(node, cpu::make_pow);
    ASSERT_EQ(y.size(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = std::pow(x[i], e);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(y[i])) << x[i] << "^" << e << " = " << y[i];
      else if (std::isinf(want))
        EXPECT_EQ(y[i], want) << x[i] << "^" << e;
      else
        EXPECT_NEAR(y[i], want, 1e-6 + 1e-5 * std::fabs(want)) << x[i] << "^" << e;
    }
  }
}

// Clip bounds given as run-time inputs (not constant) are read when the kernel runs.
TEST(Clip, RuntimeBoundsAreReadInRun) {
  const std::vector<float> x = {-5.f, -1.f, 0.f, 1.f, 5.f};
  HandNode node("Clip",
                {operand(kF32, {5}, x), operand(kF32, {}, std::vector<float>{-2.f}), Operand{}},
                {{kF32, {5}}});
  EXPECT_EQ(run_output<float>(node, cpu::make_clip),
            (std::vector<float>{-2.f, -1.f, 0.f, 1.f, 5.f}));
  HandNode ints("Clip",
                {operand(DType::kInt64, {5}, std::vector<int64_t>{-5, -1, 0, 1, 5}), Operand{},
                 operand(DType::kInt64, {}, std::vector<int64_t>{0})},
                {{DType::kInt64, {5}}});
  EXPECT_EQ(run_output<int64_t>(ints, cpu::make_clip), (std::vector<int64_t>{-5, -1, 0, 0, 0}));
}

TEST(Cast, FloatToIntTruncatesAndToBoolIsNonZero) {
  const std::vector<float> x = {-2.7f, -0.5f, 0.f, 0.25f, 3.9f};
  HandNode to_int("Cast", {operand(kF32, {5}, x)}, {{DType::kInt64, {5}}});
  EXPECT_EQ(run_output<int64_t>(to_int, cpu::make_cast), (std::vector<int64_t>{-2, 0, 0, 0, 3}));
  HandNode to_bool("Cast", {operand(kF32, {5}, x)}, {{DType::kBool, {5}}});
  EXPECT_EQ(run_output<uint8_t>(to_bool, cpu::make_cast), (std::vector<uint8_t>{1, 1, 0, 1, 1}));
  HandNode from_bool("Cast", {operand(DType::kBool, {3}, std::vector<uint8_t>{1, 0, 1})},
                     {{DType::kInt32, {3}}});
  EXPECT_EQ(run_output<int32_t>(from_bool, cpu::make_cast), (std::vector<int32_t>{1, 0, 1}));
  HandNode to_half("Cast", {operand(kF32, {5}, x)}, {{DType::kFloat16, {5}}});
  EXPECT_FALSE(to_half.run(cpu::make_cast));
}

// Inference Dropout copies and sets the mask; constant training_mode = true with ratio > 0 is
// declined until training dropout exists.
TEST(Dropout, InferenceCopiesAndTrainingIsDeclined) {
  const std::vector<float> x = {1.f, -2.f, 3.f};
  HandNode infer("Dropout",
                 {operand(kF32, {3}, x), operand(kF32, {}, std::vector<float>{0.3f}, true),
                  operand(DType::kBool, {}, std::vector<uint8_t>{0}, true)},
                 {{kF32, {3}}, {DType::kBool, {3}}});
  const auto out = infer.run(cpu::make_dropout);
  ASSERT_TRUE(out);
  EXPECT_EQ(values_of<float>((*out)[0]), x);
  EXPECT_EQ(values_of<uint8_t>((*out)[1]), (std::vector<uint8_t>{1, 1, 1}));
  HandNode train("Dropout",
                 {operand(kF32, {3}, x), operand(kF32, {}, std::vector<float>{0.3f}, true),
                  operand(DType::kBool, {}, std::vector<uint8_t>{1}, true)},
                 {{kF32, {3}}});
  EXPECT_FALSE(train.run(cpu::make_dropout));
  HandNode unknown(
      "Dropout",
      {operand(kF32, {3}, x), Operand{}, operand(DType::kBool, {}, std::vector<uint8_t>{1})},
      {{kF32, {3}}});
  EXPECT_FALSE(unknown.run(cpu::make_dropout));
}

TEST(Declines, MismatchedTypesAndShapes) {
  HandNode mixed("Add",
                 {operand(kF32, {2}, std::vector<float>{1, 2}),
                  operand(DType::kInt64, {2}, std::vector<int64_t>{1, 2})},
                 {{kF32, {2}}});
  EXPECT_FALSE(mixed.run(cpu::make_add));
  HandNode bad_shape("Mul",
                     {operand(kF32, {3}, std::vector<float>{1, 2, 3}),
                      operand(kF32, {2}, std::vector<float>{1, 2})},
                     {{kF32, {3}}});
  EXPECT_FALSE(bad_shape.run(cpu::make_mul));
  HandNode rank7("Add",
                 {operand(kF32, {1, 1, 1, 1, 1, 1, 2}, std::vector<float>{1, 2}),
                  operand(kF32, {}, std::vector<float>{1})},
                 {{kF32, {1, 1, 1, 1, 1, 1, 2}}});
  EXPECT_FALSE(rank7.run(cpu::make_add));
}

// ---- small Relu and Clip against oneDNN's eltwise ----------------------------------------------

constexpr int64_t kLarge = 1 << 15;  // oneDNN's eltwise primitive from here on
constexpr int64_t kSmall = 1001;     // a loop of pipetrain's own, with a tail past 16 lanes

// Every pair of edge values (NaN of either sign, zeros of either sign, infinities, the bounds
// below and values next to them) as (a[i], b[i]) over the first 13 x 13 elements, then ramps.
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kEdges[] = {kNaN, -kNaN, 0.f, -0.f, kInf, -kInf, -1.f, 6.f, 1e-30f, -1e-30f, 5.999f, -2.5f, 3.f};
constexpr int64_t kEdgeCount = sizeof(kEdges) / sizeof(kEdges[0]);

std::vector<float> edge_values(int64_t n, bool major) {
  std::vector<float> v = ramp(n, major ? 0.125f : -0.0625f, major ? -4.f : 2.f);
  for (int64_t i = 0; i < kEdgeCount * kEdgeCount && i < n; ++i)
    v[static_cast<size_t>(i)] = kEdges[major ? i / kEdgeCount : i % kEdgeCount];
  return v;
}

// The first kSmall elements of `large` (oneDNN's) and `small` (the loop's) bit for bit.
void expect_same_bits(const std::vector<float>& small, const std::vector<float>& large, const std::string& what) {
  ASSERT_EQ(small.size(), static_cast<size_t>(kSmall)) << what;
  ASSERT_EQ(large.size(), static_cast<size_t>(kLarge)) << what;
  for (size_t i = 0; i < small.size(); ++i) {
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &small[i], 4);
    std::memcpy(&b, &large[i], 4);
    if (a != b) {
      ADD_FAILURE() << what << " element " << i << ": loop " << small[i] << " (0x" << std::hex << a
                    << "), oneDNN " << large[i] << " (0x" << b << ")" << std::dec;
      return;
    }
  }
}

// Output 0 of `op` over x (and dY first when `grad`) of n elements, with Clip's bounds as
// constants (an omitted one when nullopt).
std::vector<float> run_eltwise(const std::string& op, KernelFactory factory, int64_t n, bool grad,
                               std::optional<float> lo = std::nullopt, std::optional<float> hi = std::nullopt,
                               bool bounds = false) {
  std::vector<Operand> in;
  if (grad) in.push_back(operand(kF32, {n}, edge_values(n, true)));
  in.push_back(operand(kF32, {n}, edge_values(n, !grad)));
  if (bounds) {
    in.push_back(lo ? operand(kF32, {}, std::vector<float>{*lo}, true) : Operand{});
    if (hi) in.push_back(operand(kF32, {}, std::vector<float>{*hi}, true));
  }
  HandNode node(op, std::move(in), {{kF32, {n}}});
  return run_output<float>(node, factory);
}

// Small fp32 Relus and Clips with constant bounds, and their gradients, run a loop of their own
// (elementwise_ops.cc, elementwise_grad.cc); large ones oneDNN's eltwise primitive. The bits are
// the same on NaNs, signed zeros, infinities and values on the bounds.
TEST(SmallEltwise, ReluAndClipGiveOneDnnsBits) {
  expect_same_bits(run_eltwise("Relu", cpu::make_relu, kSmall, false),
                   run_eltwise("Relu", cpu::make_relu, kLarge, false), "Relu");
  const std::vector<std::pair<std::optional<float>, std::optional<float>>> bounds = {
      {-1.f, 6.f}, {0.f, std::nullopt}, {std::nullopt, 6.f}, {3.f, 3.f}};
  for (const auto& [lo, hi] : bounds) {
    const std::string what = "Clip(" + (lo ? std::to_string(*lo) : "-") + ", " + (hi ? std::to_string(*hi) : "-") + ")";
    expect_same_bits(run_eltwise("Clip", cpu::make_clip, kSmall, false, lo, hi, true),
                     run_eltwise("Clip", cpu::make_clip, kLarge, false, lo, hi, true), what);
  }
}

TEST(SmallEltwise, ReluGradAndClipGradGiveOneDnnsBits) {
  expect_same_bits(run_eltwise("ReluGrad", cpu::make_relu_grad, kSmall, true),
                   run_eltwise("ReluGrad", cpu::make_relu_grad, kLarge, true), "ReluGrad");
  const std::vector<std::pair<std::optional<float>, std::optional<float>>> bounds = {
      {-1.f, 6.f}, {0.f, std::nullopt}, {std::nullopt, 6.f}};
  for (const auto& [lo, hi] : bounds) {
    const std::string what = "ClipGrad(" + (lo ? std::to_string(*lo) : "-") + ", " + (hi ? std::to_string(*hi) : "-") + ")";
    expect_same_bits(run_eltwise("ClipGrad", cpu::make_clip_grad, kSmall, true, lo, hi, true),
                     run_eltwise("ClipGrad", cpu::make_clip_grad, kLarge, true, lo, hi, true), what);
  }
}

// Empty tensors are valid ONNX: the kernels accept them and write nothing.
TEST(EmptyTensors, AreAcceptedAndWriteNothing) {
  const TensorType empty{kF32, {0, 3}};
  HandNode add("Add",
               {operand(kF32, {0, 3}, std::vector<float>{}),
                operand(kF32, {3}, std::vector<float>{1, 2, 3})},
               {empty});
  EXPECT_TRUE(add.run(cpu::make_add));
  HandNode relu("Relu", {operand(kF32, {0, 3}, std::vector<float>{})}, {empty});
  EXPECT_TRUE(relu.run(cpu::make_relu));
}

}  // namespace
}  // namespace pt::testing
