// tests/exec/training_kernels_test.cc: the CPU kernels of the training forward ops
// (core/pipetrain_ops.h, made by autodiff/training_mode.h), each run as a one-node graph through
// StageProgram on the CPU backend (tests/exec/one_node.h), twice, as a training loop would:
//   - BatchNormTraining against a double-precision loop here, and bit for bit against
//     BatchNormalization with training_mode=1 (the op it replaces; BatchNormGrad assumes its
//     moments);
//   - SeededDropout: Y = X * mask / (1 - ratio) exactly, the kept fraction within 5 standard
//     deviations of 1 - ratio, and the mask a pure function of (key, stream, index): the same
//     for the same pair at any thread count, different for another key or stream; over many
//     masks (1000 keys) the kept fraction is 1 - ratio within 1%;
//   - SeededBernoulli: Y[i] = u(i) < P[i] exactly (the spec's generator), 0 or 1, P = 0 and 1
//     drawing all zeros and all ones; over many masks (stochastic depth's [N, 1, 1, 1] draws,
//     and whole-tensor ones) the fraction of ones is P within 1%; the same at any thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/pipetrain_ops.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/cpu/seeded_uniform.h"
#include "exec/stage_program.h"
#include "tests/exec/one_node.h"

namespace pt {
namespace {

using Dims = std::vector<int64_t>;
using Attrs = std::map<std::string, AttrValue>;

using testing::make_tensor;
using testing::uniform;

Tensor key_tensor(int64_t key) {
  Tensor t = make_tensor(DType::kInt64, {});
  *t.as<int64_t>() = key;
  return t;
}

// Runs one node (inputs fed, or initializers where `constant` says) twice and returns the
// outputs of the second run (tests/exec/one_node.h).
std::vector<Tensor> run_node(const std::string& op, const std::string& domain,
                             const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                             const std::vector<TensorType>& outs, const Attrs& attrs,
                             int threads = 2) {
  std::vector<testing::Arg> args;
  for (size_t i = 0; i < inputs.size(); ++i)
    args.push_back(constant[i] ? testing::constant(inputs[i]) : testing::fed(inputs[i]));
  return testing::run(op, args, outs, attrs, domain.empty(), threads);
}

// ---- BatchNormTraining ----------------------------------------------------------------------

TEST(BatchNormTraining, MatchesDoubleLoopAndReturnsUnbiasedVariance) {
  for (const Dims& xs : {Dims{4, 3, 5, 5}, Dims{6, 4}, Dims{2, 3}, Dims{8, 16, 16, 16}}) {
    SCOPED_TRACE(shape_str(xs));
    const int64_t n = xs[0], c = xs[1];
    const int64_t s = TensorType{DType::kFloat32, xs}.numel() / (n * c);
    const Tensor x = uniform(xs, 1, -2, 3), scale = uniform({c}, 2, 0.5f, 1.5f), b = uniform({c}, 3);
    const TensorType stat{DType::kFloat32, {c}};
    const float eps = 1e-3f;
    const auto out = run_node("BatchNormTraining", kPipetrainDomain, {x, scale, b},
                              {false, false, false}, {x.type, stat, stat}, {{"epsilon", eps}});
    for (int64_t ch = 0; ch < c; ++ch) {
      double sum = 0, dev = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < s; ++j) sum += x.as<float>()[(i * c + ch) * s + j];
      const double r = double(n * s), mean = sum / r;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < s; ++j) {
          const double d = x.as<float>()[(i * c + ch) * s + j] - mean;
          dev += d * d;
        }
      EXPECT_NEAR(out[1].as<float>()[ch], mean, 1e-5 * (1 + std::fabs(mean)));
      EXPECT_NEAR(out[2].as<float>()[ch], dev / (r - 1), 1e-5 * (dev / (r - 1)));
      const double a = scale.as<float>()[ch] / std::sqrt(dev / r + eps);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < s; ++j) {
          const int64_t at = (i * c + ch) * s + j;
          const double want = (x.as<float>()[at] - mean) * a + b.as<float>()[ch];
          ASSERT_NEAR(out[0].as<float>()[at], want, 1e-5 * (1 + std::fabs(want))) << at;
        }
    }
  }
}

TEST(BatchNormTraining, YIsBitIdenticalToBatchNormalizationTrainingMode) {
  const Dims xs = {8, 16, 16, 16};
  const Tensor x = uniform(xs, 4, -2, 3), scale = uniform({16}, 5, 0.5f, 1.5f);
  const Tensor b = uniform({16}, 6), mean = uniform({16}, 7), var = uniform({16}, 8, 0.5f, 2);
  const TensorType stat{DType::kFloat32, {16}};
  const auto train = run_node("BatchNormTraining", kPipetrainDomain, {x, scale, b},
                              {false, true, true}, {x.type, stat, stat}, {{"epsilon", 1e-5f}});
  const auto onnx = run_node("BatchNormalization", "", {x, scale, b, mean, var},
                             {false, true, true, true, true}, {x.type},
                             {{"epsilon", 1e-5f}, {"training_mode", int64_t{1}}});
  EXPECT_EQ(0, std::memcmp(train[0].data.data(), onnx[0].data.data(), train[0].data.size()));
}

TEST(BatchNormTraining, StatisticsAreOptionalAndOneValuePerChannelIsRefused) {
  const Tensor x = uniform({3, 2}, 9), p = uniform({2}, 10);
  const auto y = run_node("BatchNormTraining", kPipetrainDomain, {x, p, p}, {false, false, false},
                          {x.type}, {});
  EXPECT_EQ(y[0].type, x.type);
  const Tensor one = uniform({1, 2}, 11);
  CpuBackend backend(1);
  Graph g;
  const ValueId v = g.add_value("x", one.type);
  const ValueId w = g.add_initializer("p", p, true);
  const ValueId out = g.add_value("y", one.type);
  g.inputs = {v};
  g.outputs = {out};
  g.add_node(Node{"bn", "BatchNormTraining", kPipetrainDomain, {v, w, w}, {out}, {}});
  g.rebuild_uses();
  EXPECT_THROW(StageProgram(g, backend), UserError);
}

// ---- SeededDropout --------------------------------------------------------------------------

struct Dropped {
  Tensor y, mask;
};

Dropped dropout(const Tensor& x, int64_t key, int64_t stream, float ratio, int threads = 2) {
  const auto out = run_node("SeededDropout", kPipetrainDomain, {x, key_tensor(key)}, {false, false},
                            {x.type, TensorType{DType::kBool, x.type.shape}},
                            {{"ratio", ratio}, {"stream", stream}}, threads);
  return {out[0], out[1]};
}

int64_t kept(const Tensor& mask) {
  int64_t k = 0;
  for (int64_t i = 0; i < mask.type.numel(); ++i) k += mask.as<bool>()[i];
  return k;
}

int64_t differing(const Tensor& a, const Tensor& b) {
  int64_t d = 0;
  for (int64_t i = 0; i < a.type.numel(); ++i) d += a.as<bool>()[i] != b.as<bool>()[i];
  return d;
}

TEST(SeededDropout, KeepsOneMinusRatioAndScalesTheKept) {
  const Tensor x = uniform({64, 1024}, 12, 0.5f, 1.5f);  // no zeros: Y == 0 means dropped
  const double n = double(x.type.numel());
  for (float ratio : {0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE(ratio);
    const Dropped d = dropout(x, 42, 7, ratio);
    const double p = 1.0 - ratio, sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(double(kept(d.mask)), n * p, 5 * sd);
    const float scale = 1.0f / (1.0f - ratio);
    for (int64_t i = 0; i < x.type.numel(); ++i) {
      const float want = d.mask.as<bool>()[i] ? x.as<float>()[i] * scale : 0.0f;
      ASSERT_EQ(d.y.as<float>()[i], want) << i;
    }
  }
  EXPECT_EQ(kept(dropout(x, 42, 7, 0.0f).mask), x.type.numel());
}

TEST(SeededDropout, MaskIsAPureFunctionOfKeyStreamAndIndex) {
  const Tensor x = uniform({256, 512}, 13);  // above the parallel threshold
  const Dropped a = dropout(x, 1234, 99, 0.5f, 4);
  const Dropped again = dropout(x, 1234, 99, 0.5f, 1);
  EXPECT_EQ(differing(a.mask, again.mask), 0);
  EXPECT_EQ(0, std::memcmp(a.y.data.data(), again.y.data.data(), a.y.data.size()));
  // Element i depends on nothing else: a smaller tensor draws the leading part of the mask.
  const Dropped head = dropout(uniform({3, 7}, 14), 1234, 99, 0.5f);
  for (int64_t i = 0; i < 21; ++i) EXPECT_EQ(head.mask.as<bool>()[i], a.mask.as<bool>()[i]) << i;
  // Another key or stream: about half the elements differ (independent masks at ratio 0.5).
  const double n = double(x.type.numel());
  for (const Dropped& other : {dropout(x, 1235, 99, 0.5f), dropout(x, 1234, 100, 0.5f)})
    EXPECT_NEAR(double(differing(a.mask, other.mask)), n / 2, 5 * std::sqrt(n / 4));
  // The kernel draws exactly the spec's generator.
  const uint64_t base = cpu::seeded_base(1234, 99);
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{100000}})
    EXPECT_EQ(a.mask.as<bool>()[i], cpu::seeded_uniform(base, i) >= 0.5f) << i;
}

// Many masks, as training draws them (one key per step and micro-batch): the kept fraction over
// all of them is 1 - ratio within 1% (relative). 1000 masks of 1024 elements: at ratio 0.9 the
// standard deviation of the fraction is 3e-4, a third of the 1% band.
TEST(SeededDropout, KeptFractionOverManyMasksIsOneMinusRatioWithinOnePercent) {
  const Tensor x = uniform({4, 256}, 15, 0.5f, 1.5f);
  for (float ratio : {0.1f, 0.2f, 0.5f, 0.9f}) {
    SCOPED_TRACE(ratio);
    int64_t k = 0, n = 0;
    for (int64_t key = 0; key < 1000; ++key) {
      k += kept(dropout(x, key * 7919 + 3, 11, ratio, 1).mask);
      n += x.type.numel();
    }
    const double want = 1.0 - ratio;
    EXPECT_NEAR(double(k) / double(n), want, 0.01 * want);
  }
}

// ---- SeededBernoulli ------------------------------------------------------------------------

Tensor bernoulli(const Tensor& p, int64_t key, int64_t stream, int threads = 2) {
  return run_node("SeededBernoulli", kPipetrainDomain, {p, key_tensor(key)}, {true, false},
                  {p.type}, {{"stream", stream}}, threads)[0];
}

Tensor filled(const Dims& shape, float v) {
  Tensor t = make_tensor(DType::kFloat32, shape);
  for (int64_t i = 0; i < t.type.numel(); ++i) t.as<float>()[i] = v;
  return t;
}

double ones_fraction(const Tensor& y) {
  double s = 0;
  for (int64_t i = 0; i < y.type.numel(); ++i) s += y.as<float>()[i];
  return s / double(y.type.numel());
}

TEST(SeededBernoulli, DrawsTheSpecsGeneratorAtAnyThreadCount) {
  const Tensor p = uniform({256, 512}, 16, 0.0f, 1.0f);  // a probability per element
  const Tensor y = bernoulli(p, 777, -5, 4);
  EXPECT_EQ(0, std::memcmp(y.data.data(), bernoulli(p, 777, -5, 1).data.data(), y.data.size()));
  const uint64_t base = cpu::seeded_base(777, -5);
  for (int64_t i = 0; i < p.type.numel(); ++i)
    ASSERT_EQ(y.as<float>()[i], cpu::seeded_uniform(base, i) < p.as<float>()[i] ? 1.0f : 0.0f) << i;
  EXPECT_EQ(ones_fraction(bernoulli(filled({64}, 0.0f), 1, 2)), 0.0);
  EXPECT_EQ(ones_fraction(bernoulli(filled({64}, 1.0f), 1, 2)), 1.0);
  const double n = double(p.type.numel());
  EXPECT_NEAR(double(n) * ones_fraction(bernoulli(filled({256, 512}, 0.5f), 778, -5)), n / 2,
              5 * std::sqrt(n / 4));
}

// Stochastic depth draws one value per sample ([N, 1, 1, 1]); over many steps the kept share is
// the survival probability within 1%, and so for whole-tensor masks.
TEST(SeededBernoulli, OnesFractionOverManyMasksIsPWithinOnePercent) {
  for (float survival : {0.8f, 0.5f, 0.1f}) {
    SCOPED_TRACE(survival);
    double per_sample = 0, whole = 0;
    const int masks = 20000;
    for (int key = 0; key < masks; ++key) {
      per_sample += ones_fraction(bernoulli(filled({8, 1, 1, 1}, survival), key, 3, 1));
      if (key < 1000) whole += ones_fraction(bernoulli(filled({4, 256}, survival), key, 4, 1));
    }
    EXPECT_NEAR(per_sample / masks, survival, 0.01 * survival);
    EXPECT_NEAR(whole / 1000, survival, 0.01 * survival);
  }
}

}  // namespace
}  // namespace pt
