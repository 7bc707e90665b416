// Finite-difference checks of every gradient rule (tests/autodiff/grad_check.h explains the
// tolerance), broadcasting cases included, plus a check that every rule in the table has a case.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "autodiff/grad_context.h"
#include "autodiff/loss.h"
#include "exec/cpu/seeded_uniform.h"
#include "tests/autodiff/grad_check.h"

namespace pt::test {
namespace {

using Shape = std::vector<int64_t>;
using A = std::map<std::string, AttrValue>;

// When set, check() only records which ops a case uses (for the coverage test).
std::set<std::string>* g_collect = nullptr;

void check(GraphMaker& m, const std::string& loss = "") {
  if (g_collect) {
    for (const Node& n : m.g.nodes)
      g_collect->insert(n.domain.empty() ? n.op_type : n.domain + "::" + n.op_type);
    return;
  }
  const CheckResult r = check_gradients(m, loss);
  EXPECT_GT(r.checked, 0);
}

// Element-wise binary ops over broadcasting pairs: same shape, trailing vector, middle ones,
// leading axes missing, scalar.
void BinaryBroadcasting() {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}}, {{2, 3, 4}, {3, 1}}, {{1, 3, 1}, {2, 1, 4}},
      {{2, 3}, {}}};
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    for (const auto& [sa, sb] : pairs) {
      SCOPED_TRACE(std::string(op));
      GraphMaker m;
      const ValueId a = m.input("a", sa);
      const ValueId b = m.input("b", sb, std::string(op) == "Div" ? uniform(0.5f, 2) : Filler{});
      m.output(m.op(op, {a, b}, broadcast_shape(sa, sb)));
      check(m);
    }
  }
}

void BinaryWithParameter() {
  GraphMaker m;
  const ValueId x = m.input("x", {3, 4});
  const ValueId w = m.param("w", {4});
  m.output(m.op("Mul", {x, w}, {3, 4}));
  check(m);
}

void Pow() {
  GraphMaker m;
  const ValueId x = m.input("x", {2, 3}, uniform(0.5f, 2));
  m.output(m.op("Pow", {x, m.floats({}, {3.0f})}, {2, 3}));
  check(m);
}

void Unary() {
  struct U {
    const char* op;
    Filler fill;
    A attrs;
  };
  const std::vector<U> ops = {
      {"Sqrt", uniform(0.5f, 2), {}},         {"Neg", {}, {}},
      {"Reciprocal", uniform(0.5f, 2), {}},  {"Sin", {}, {}},
      {"Cos", {}, {}},
      {"HardSigmoid", uniform(-2.f, 2.f), {{"alpha", 0.2f}, {"beta", 0.5f}}},  // kinks at +-2.5
      {"HardSigmoid", uniform(3.f, 5.f), {}},                                   // clipped
      {"HardSwish", uniform(-2.5f, 2.5f), {}},                                  // kinks at +-3
      {"HardSwish", uniform(3.5f, 6.f), {}},
      {"Relu", uniform(-1, 1, 0.05f), {}},    {"Erf", {}, {}},
      {"Tanh", {}, {}},                       {"Sigmoid", {}, {}},
      {"Identity", {}, {}},                   {"Gelu", uniform(-2, 2), {}},
      {"Gelu", uniform(-2, 2), {{"approximate", std::string("tanh")}}},
      {"Exp", uniform(-1, 1), {}},            {"Abs", uniform(-1, 1, 0.05f), {}},
      {"Trilu", {}, {}},                      {"Trilu", {}, {{"upper", int64_t{0}}}},
  };
  for (const U& u : ops) {
    SCOPED_TRACE(std::string(u.op));
    GraphMaker m;
    const ValueId x = m.input("x", {3, 5}, u.fill);
    m.output(m.op(u.op, {x}, {3, 5}, u.attrs));
    check(m);
  }
}

void ClipWithBoundsAndWithout() {
  for (int bounds = 0; bounds < 3; ++bounds) {
    GraphMaker m;
    const ValueId x = m.input("x", {4, 6}, uniform(-3, 3));
    std::vector<ValueId> in = {x};
    if (bounds >= 1) in.push_back(m.floats({}, {-0.5f}));
    if (bounds >= 2) in.push_back(m.floats({}, {0.5f}));
    // Keep every element 2h away from the kinks at -0.5 and 0.5.
    float* d = m.feeds["x"].as<float>();
    for (int i = 0; i < 24; ++i)
      if (std::fabs(std::fabs(d[i]) - 0.5f) < 0.05f) d[i] += 0.1f;
    m.output(m.op("Clip", in, {4, 6}));
    check(m);
  }
}

void WhereBroadcasting() {
  GraphMaker m;
  const ValueId c = m.bools({3, 1}, {true, false, true});
  const ValueId a = m.input("a", {3, 4});
  const ValueId b = m.input("b", {4});
  m.output(m.op("Where", {c, a, b}, {3, 4}));
  check(m);
}

void CastAndDropoutInference() {
  GraphMaker m;
  const ValueId x = m.input("x", {2, 3});
  const ValueId y = m.op("Cast", {x}, {2, 3}, {{"to", int64_t{1}}});
  const ValueId z = m.op_n("Dropout", {y}, {TensorType{DType::kFloat32, {2, 3}}})[0];
  m.output(z);
  check(m);
}

void SoftmaxAndLogSoftmaxOnAxes() {
  for (const char* op : {"Softmax", "LogSoftmax"})
    for (int64_t axis : {-1, 1}) {
      SCOPED_TRACE(std::string(op) + " axis " + std::to_string(axis));
      GraphMaker m;
      const ValueId x = m.input("x", {2, 3, 4}, uniform(-2, 2));
      m.output(m.op(op, {x}, {2, 3, 4}, {{"axis", axis}}));
      check(m);
    }
}

void LayerNormalization() {
  for (int64_t axis : {-1, 1}) {
    SCOPED_TRACE(axis);
    GraphMaker m;
    const ValueId x = m.input("x", {2, 3, 4}, uniform(-2, 2));
    const Shape ps = axis == -1 ? Shape{4} : Shape{3, 4};
    const ValueId s = m.param("scale", ps, uniform(0.5f, 1.5f));
    const ValueId b = m.param("bias", ps);
    m.output(m.op("LayerNormalization", {x, s, b}, {2, 3, 4}, {{"axis", axis}, {"epsilon", 1e-5f}}));
    check(m);
  }
}

void BatchNormalizationTrainingAndInference() {
  for (int64_t training : {1, 0}) {
    SCOPED_TRACE(training);
    GraphMaker m;
    const ValueId x = m.input("x", {3, 2, 2, 3}, uniform(-2, 2));
    const ValueId s = m.param("scale", {2}, uniform(0.5f, 1.5f));
    const ValueId b = m.param("bias", {2});
    const ValueId mean = m.floats({2}, {0.1f, -0.2f});
    const ValueId var = m.floats({2}, {0.8f, 1.3f});
    std::vector<TensorType> outs = {TensorType{DType::kFloat32, {3, 2, 2, 3}}};
    if (training) {
      outs.push_back(TensorType{DType::kFloat32, {2}});
      outs.push_back(TensorType{DType::kFloat32, {2}});
    }
    m.output(m.op_n("BatchNormalization", {x, s, b, mean, var}, outs,
                    {{"epsilon", 1e-5f}, {"training_mode", training}})[0]);
    check(m);
  }
}

// BatchNormTraining (autodiff/training_mode.h's form of BatchNormalization): Y's gradient; the
// batch statistics carry none.
void BatchNormTraining() {
  GraphMaker m;
  const ValueId x = m.input("x", {3, 2, 2, 3}, uniform(-2, 2));
  const ValueId s = m.param("scale", {2}, uniform(0.5f, 1.5f));
  const ValueId b = m.param("bias", {2});
  const TensorType stat{DType::kFloat32, {2}};
  const auto out = m.op_n("BatchNormTraining", {x, s, b},
                          {TensorType{DType::kFloat32, {3, 2, 2, 3}}, stat, stat},
                          {{"epsilon", 1e-5f}});
  m.g.nodes.back().domain = "pipetrain";
  m.output(out[0]);
  m.output(out[2]);
  check(m);
}

// SeededDropout: the mask is a pure function of (key, stream, index), so f is linear in X.
void SeededDropout() {
  GraphMaker m;
  const ValueId x = m.input("x", {4, 8});
  const ValueId key = m.int_input("dropout_key", {}, {20240607});
  // No mask output: the rule asks for it (GradContext::y) and F then makes it.
  m.output(m.op("SeededDropout", {x, key}, {4, 8}, {{"ratio", 0.3f}, {"stream", int64_t{-77}}},
                "pipetrain"));
  check(m);
}

// FusedAttention: causal, grouped-query heads (4 heads read 2 kv heads), an additive key mask
// and no mask; the LogSumExp output is made on demand (GradContext::y) for the gradient.
void FusedAttention() {
  for (bool masked : {true, false}) {
    GraphMaker m;
    const ValueId q = m.input("q", {1, 4, 5, 3});
    const ValueId k = m.input("k", {1, 2, 5, 3});
    const ValueId v = m.input("v", {1, 2, 5, 2});
    std::vector<ValueId> in = {q, k, v};
    if (masked) in.push_back(m.floats({5}, {0.f, -0.5f, 0.25f, -1.f, 0.5f}));
    m.output(m.op("FusedAttention", in, {1, 4, 5, 2}, {{"scale", 0.7f}, {"causal", int64_t{masked}}},
                  "pipetrain"));
    check(m);
  }
}

// A stochastic-depth branch as training runs it: h + (h @ W) * SeededBernoulli(P) / 0.8, one mask
// value per row. The draw is fixed by the key, so f is smooth in x and W; its gradient flows
// through Mul and Div (SeededBernoulli is not differentiable: partition/cost_model.cc).
void StochasticDepthBranch() {
  GraphMaker m;
  const ValueId x = m.input("x", {6, 8});
  const ValueId w = m.param("w", {8, 8});
  const ValueId key = m.int_input("dropout_key", {}, {20240608});
  const ValueId p = m.floats({6, 1}, std::vector<float>(6, 0.5f));
  const ValueId draw =
      m.op("SeededBernoulli", {p, key}, {6, 1}, {{"stream", int64_t{31}}}, "pipetrain");
  const ValueId scaled = m.op("Div", {draw, m.floats({}, {0.5f})}, {6, 1});
  const ValueId branch = m.op("Mul", {m.op("MatMul", {x, w}, {6, 8}), scaled}, {6, 8});
  m.output(m.op("Add", {x, branch}, {6, 8}));
  check(m);
  // This key keeps some rows and drops others, so both paths are checked.
  const uint64_t base = cpu::seeded_base(20240608, 31);
  int kept = 0;
  for (int i = 0; i < 6; ++i) kept += cpu::seeded_uniform(base, i) < 0.5f;
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 6);
}

void MatMulWeightBatchedAndBroadcast() {
  {
    GraphMaker m;  // activation times a weight (the Linear layer)
    const ValueId x = m.input("x", {2, 3, 4});
    const ValueId w = m.param("w", {4, 5});
    m.output(m.op("MatMul", {x, w}, {2, 3, 5}));
    check(m);
  }
  {
    GraphMaker m;  // attention: both batched, the left one broadcast over a batch axis
    const ValueId a = m.input("a", {2, 1, 3, 4});
    const ValueId b = m.input("b", {3, 4, 2});
    m.output(m.op("MatMul", {a, b}, {2, 3, 3, 2}));
    check(m);
  }
}

void GemmTransposesAlphaBetaBias() {
  for (int64_t ta : {0, 1})
    for (int64_t tb : {0, 1})
      for (const Shape& cs : {Shape{5}, Shape{3, 5}, Shape{1, 5}}) {
        SCOPED_TRACE(std::to_string(ta) + std::to_string(tb));
        GraphMaker m;
        const ValueId a = m.input("a", ta ? Shape{4, 3} : Shape{3, 4});
        const ValueId b = m.param("b", tb ? Shape{5, 4} : Shape{4, 5});
        const ValueId c = m.param("c", cs);
        m.output(m.op("Gemm", {a, b, c}, {3, 5},
                      {{"transA", ta}, {"transB", tb}, {"alpha", 0.7f}, {"beta", 1.3f}}));
        check(m);
      }
}

void ConvStridesPadsDilationsGroups() {
  struct C {
    Shape x, w, y;
    A attrs;
  };
  const std::vector<C> cases = {
      {{2, 3, 5, 5}, {4, 3, 3, 3}, {2, 4, 5, 5}, {{"pads", Shape{1, 1, 1, 1}}}},
      {{1, 2, 6, 7}, {3, 2, 3, 2}, {1, 3, 3, 4},
       {{"strides", Shape{2, 2}}, {"pads", Shape{0, 1, 1, 0}}}},
      {{1, 2, 7, 7}, {2, 2, 3, 3}, {1, 2, 3, 3}, {{"dilations", Shape{2, 2}}}},
      {{1, 4, 5, 5}, {4, 1, 3, 3}, {1, 4, 3, 3},
       {{"group", int64_t{4}}, {"strides", Shape{2, 2}}, {"pads", Shape{1, 1, 1, 1}}}},
      {{1, 4, 4, 4}, {6, 2, 1, 1}, {1, 6, 4, 4}, {{"group", int64_t{2}}}},
  };
  for (const C& c : cases) {
    GraphMaker m;
    const ValueId x = m.input("x", c.x);
    const ValueId w = m.param("w", c.w);
    const ValueId b = m.param("b", {c.w[0]});
    A a = c.attrs;
    a["kernel_shape"] = Shape{c.w[2], c.w[3]};
    m.output(m.op("Conv", {x, w, b}, c.y, a));
    check(m);
  }
}

// Distinct values spaced wider than 2h, so that no window's maximum is a near tie.
Filler spaced(std::vector<float>* pool) {
  return [pool](std::mt19937& rng) {
    const size_t k = rng() % pool->size();
    const float v = (*pool)[k];
    pool->erase(pool->begin() + static_cast<long>(k));
    return v;
  };
}

void Pooling() {
  {
    std::vector<float> pool;
    for (int i = 0; i < 2 * 2 * 5 * 5; ++i) pool.push_back(-2.5f + 0.05f * static_cast<float>(i));
    GraphMaker m;
    const ValueId x = m.input("x", {2, 2, 5, 5}, spaced(&pool));
    m.output(m.op("MaxPool", {x}, {2, 2, 3, 3},
                  {{"kernel_shape", Shape{3, 3}}, {"strides", Shape{2, 2}}, {"pads", Shape{1, 1, 1, 1}}}));
    check(m);
  }
  for (int64_t include : {0, 1}) {
    GraphMaker m;
    const ValueId x = m.input("x", {1, 2, 5, 4});
    m.output(m.op("AveragePool", {x}, {1, 2, 3, 2},
                  {{"kernel_shape", Shape{3, 2}}, {"strides", Shape{2, 2}},
                   {"pads", Shape{1, 0, 1, 0}}, {"count_include_pad", include}}));
    check(m);
  }
  GraphMaker m;
  const ValueId x = m.input("x", {2, 3, 4, 5});
  m.output(m.op("GlobalAveragePool", {x}, {2, 3, 1, 1}));
  check(m);
}

void ReshapesAndTranspose() {
  GraphMaker m;
  const ValueId x = m.input("x", {2, 3, 4});
  const ValueId r = m.op("Reshape", {x, m.ints({6, 4})}, {6, 4});
  const ValueId t = m.op("Transpose", {r}, {4, 6}, {{"perm", Shape{1, 0}}});
  const ValueId u = m.op("Unsqueeze", {t, m.ints({0})}, {1, 4, 6});
  const ValueId s = m.op("Squeeze", {u, m.ints({0})}, {4, 6});
  const ValueId f = m.op("Flatten", {s}, {4, 6}, {{"axis", int64_t{1}}});
  const ValueId t3 = m.op("Transpose", {x}, {4, 2, 3}, {{"perm", Shape{2, 0, 1}}});
  m.output(f);
  m.output(t3);
  check(m);
}

void ConcatSplitSlicePad() {
  GraphMaker m;
  const ValueId a = m.input("a", {2, 3});
  const ValueId b = m.input("b", {2, 5});
  const ValueId c = m.op("Concat", {a, b}, {2, 8}, {{"axis", int64_t{1}}});
  const auto parts = m.op_n("Split", {c, m.ints({3, 4, 1})},
                            {TensorType{DType::kFloat32, {2, 3}}, TensorType{DType::kFloat32, {2, 4}},
                             TensorType{DType::kFloat32, {2, 1}}},
                            {{"axis", int64_t{1}}});
  // parts[2] is dropped: its gradient is zero.
  const ValueId s = m.op("Slice", {parts[1], m.ints({-3}), m.ints({100}), m.ints({1})}, {2, 3});
  const ValueId p = m.op("Pad", {s, m.ints({1, 0, 0, 2})}, {3, 5});
  m.output(parts[0]);
  m.output(p);
  check(m);
}

void GatherEmbeddingExpandReduce() {
  GraphMaker m;
  const ValueId table = m.param("table", {5, 3});
  const ValueId ids = m.int_input("ids", {2, 3}, {4, 1, 4, 0, -1, 2});
  const ValueId e = m.op("Gather", {table, ids}, {2, 3, 3});
  const ValueId x = m.input("x", {3, 1});
  const ValueId ex = m.op("Expand", {x, m.ints({2, 3, 3})}, {2, 3, 3});
  const ValueId sum = m.op("Add", {e, ex}, {2, 3, 3});
  m.output(m.op("ReduceSum", {sum, m.ints({1})}, {2, 1, 3}));
  m.output(m.op("ReduceMean", {sum}, {2, 3}, {{"axes", Shape{-1}}, {"keepdims", int64_t{0}}}));
  check(m);
}

void CrossEntropyLossWithIgnoredTargets() {
  GraphMaker m;
  const ValueId x = m.input("x", {2, 3, 4});
  const ValueId w = m.param("w", {4, 6});
  m.output(m.op("MatMul", {x, w}, {2, 3, 6}));
  add_loss(m.g, LossSpec{});
  m.feeds[kLossTarget].type = TensorType{DType::kInt64, {2, 3}};
  const std::vector<int64_t> t = {0, 5, -100, 3, 3, 1};
  m.feeds[kLossTarget].data.resize(t.size() * sizeof(int64_t));
  std::memcpy(m.feeds[kLossTarget].data.data(), t.data(), t.size() * sizeof(int64_t));
  m.feeds[kLossScale].type = TensorType{DType::kFloat32, {}};
  m.feeds[kLossScale].data.resize(4);
  *m.feeds[kLossScale].as<float>() = 1.0f / 5;
  check(m, kLossOutput);
}

// CumSum in every direction, with the axis a constant input.
void CumSumDirections() {
  for (int64_t exclusive : {0, 1})
    for (int64_t reverse : {0, 1}) {
      SCOPED_TRACE("exclusive " + std::to_string(exclusive) + " reverse " + std::to_string(reverse));
      GraphMaker m;
      const ValueId x = m.input("x", {2, 5, 3});
      m.output(m.op("CumSum", {x, m.ints({-2})}, {2, 5, 3},
                    {{"exclusive", exclusive}, {"reverse", reverse}}));
      check(m);
    }
}

void MseLoss() {
  GraphMaker m;
  const ValueId x = m.input("x", {3, 2});
  const ValueId w = m.param("w", {2, 2});
  m.output(m.op("MatMul", {x, w}, {3, 2}));
  add_loss(m.g, LossSpec{LossSpec::Kind::kMse});
  GraphMaker t;
  t.input("t", {3, 2});
  m.feeds[kLossTarget] = t.feeds["t"];
  m.feeds[kLossScale].type = TensorType{DType::kFloat32, {}};
  m.feeds[kLossScale].data.resize(4);
  *m.feeds[kLossScale].as<float>() = 1.0f / 6;
  check(m, kLossOutput);
}

// Max and Min of two inputs under broadcasting (random values: no ties), and with a parameter.
void MaxMinBroadcasting() {
  for (const char* op : {"Max", "Min"}) {
    SCOPED_TRACE(std::string(op));
    GraphMaker m;
    const ValueId a = m.input("a", {2, 3, 4});
    const ValueId b = m.param("b", {3, 1});
    m.output(m.op(op, {a, b}, {2, 3, 4}));
    check(m);
  }
}

// ReduceMax and ReduceMin over one axis, two axes kept, and every axis (random values: one
// extreme per group); Trilu with k given; Tile.
void ExtremesTriluTile() {
  for (const char* op : {"ReduceMax", "ReduceMin"}) {
    SCOPED_TRACE(std::string(op));
    GraphMaker m;
    const ValueId x = m.input("x", {2, 3, 4});
    const ValueId a = m.op(op, {x}, {2, 1, 4}, {{"axes", Shape{1}}});
    const ValueId b = m.op(op, {x}, {3}, {{"axes", Shape{0, -1}}, {"keepdims", int64_t{0}}});
    const ValueId all = m.op(op, {x}, {1, 1, 1});
    m.output(a);
    m.output(b);
    m.output(all);
    check(m);
  }
  GraphMaker m;
  const ValueId x = m.input("x", {2, 3, 4});
  m.output(m.op("Trilu", {x, m.ints({1})}, {2, 3, 4}));
  m.output(m.op("Trilu", {x, m.ints({-1})}, {2, 3, 4}, {{"upper", int64_t{0}}}));
  m.output(m.op("Tile", {x, m.ints({2, 1, 3})}, {4, 3, 12}));
  check(m);
}

struct Case {
  const char* name;
  void (*run)();
};

const Case kCases[] = {
    {"BinaryBroadcasting", BinaryBroadcasting},
    {"BinaryWithParameter", BinaryWithParameter},
    {"Pow", Pow},
    {"Unary", Unary},
    {"ClipWithBoundsAndWithout", ClipWithBoundsAndWithout},
    {"WhereBroadcasting", WhereBroadcasting},
    {"CastAndDropoutInference", CastAndDropoutInference},
    {"SoftmaxAndLogSoftmaxOnAxes", SoftmaxAndLogSoftmaxOnAxes},
    {"LayerNormalization", LayerNormalization},
    {"BatchNormalizationTrainingAndInference", BatchNormalizationTrainingAndInference},
    {"BatchNormTraining", BatchNormTraining},
    {"SeededDropout", SeededDropout},
    {"FusedAttention", FusedAttention},
    {"StochasticDepthBranch", StochasticDepthBranch},
    {"MatMulWeightBatchedAndBroadcast", MatMulWeightBatchedAndBroadcast},
    {"GemmTransposesAlphaBetaBias", GemmTransposesAlphaBetaBias},
    {"ConvStridesPadsDilationsGroups", ConvStridesPadsDilationsGroups},
    {"Pooling", Pooling},
    {"ReshapesAndTranspose", ReshapesAndTranspose},
    {"ConcatSplitSlicePad", ConcatSplitSlicePad},
    {"GatherEmbeddingExpandReduce", GatherEmbeddingExpandReduce},
    {"CrossEntropyLossWithIgnoredTargets", CrossEntropyLossWithIgnoredTargets},
    {"MseLoss", MseLoss},
    {"CumSumDirections", CumSumDirections},
    {"MaxMinBroadcasting", MaxMinBroadcasting},
    {"ExtremesTriluTile", ExtremesTriluTile},
};

class GradRule : public ::testing::TestWithParam<Case> {};

TEST_P(GradRule, MatchesFiniteDifferences) { GetParam().run(); }

INSTANTIATE_TEST_SUITE_P(Cases, GradRule, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(GradRules, EveryRuleHasACase) {
  std::set<std::string> used;
  g_collect = &used;
  for (const Case& c : kCases) c.run();
  g_collect = nullptr;
  for (const std::string& op : grad_rule_ops())
    EXPECT_TRUE(used.count(op) || op == "com.microsoft::Gelu")  // the same rule as Gelu
        << op << " has no finite-difference case";
}

}  // namespace
}  // namespace pt::test
