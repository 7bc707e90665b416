// tests/exec/attention_test.cc: FusedAttention and FusedAttentionGrad (core/pipetrain_ops.h) on
// the CPU backend, each run as a one-node graph through StageProgram, against the unfused math
// in double here: s = scale Q K^T + mask, P = softmax(s), Y = P V, and its gradients
// (dV = P^T dY, dP = dY V^T, dS = P (dP - rowsum(dP P)), dQ = scale dS K, dK = scale dS^T Q).
// Causal, additive and boolean masks, grouped-query heads, lengths 1 to 1024 (tiles of 32
// queries and 64 keys, so most lengths end in a partial tile), and bit-identical results on 1,
// 2 and 3 threads; on each copy of the vector loops this CPU runs (PT_MAX_CPU_ISA), the AVX2 one
// giving the AVX-512 one's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/exec/isa_cap.h"
#include "tests/exec/one_node.h"

namespace pt {
namespace {

using Dims = std::vector<int64_t>;
using testing::fed;
using testing::kOmitted;
using testing::make_tensor;
using testing::omitted;
using testing::out_f32;
using testing::run;
using testing::uniform;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Case {
  int64_t b = 1, h = 2, hkv = 2, s = 5, t = 5, d = 8, dv = 8;
  bool causal = false;
  enum class Mask { kNone, kFloat, kBool } mask = Mask::kNone;
  Dims mask_shape;  // broadcastable to [b, h, s, t]
  float scale = 0.35f;
};

struct Inputs {
  Tensor q, k, v, mask, dy;
};

Inputs make_inputs(const Case& c, unsigned seed) {
  Inputs in;
  in.q = uniform({c.b, c.h, c.s, c.d}, seed, -2.f, 2.f);
  in.k = uniform({c.b, c.hkv, c.t, c.d}, seed + 1, -2.f, 2.f);
  in.v = uniform({c.b, c.hkv, c.t, c.dv}, seed + 2);
  in.dy = uniform({c.b, c.h, c.s, c.dv}, seed + 3);
  if (c.mask == Case::Mask::kFloat) {
    in.mask = uniform(c.mask_shape, seed + 4, -3.f, 1.f);
    auto* m = reinterpret_cast<float*>(in.mask.data.data());
    for (int64_t x = 1; x < in.mask.type.numel(); x += 3) m[x] = -kInf;  // some keys removed
  } else if (c.mask == Case::Mask::kBool) {
    in.mask = make_tensor(DType::kBool, c.mask_shape);
    std::mt19937 gen(seed + 4);
    auto* m = reinterpret_cast<bool*>(in.mask.data.data());
    for (int64_t x = 0; x < in.mask.type.numel(); ++x) m[x] = gen() % 4 != 0;
  }
  return in;
}

const float* f(const Tensor& t) { return reinterpret_cast<const float*>(t.data.data()); }

// The mask's element at (b, h, i, j), broadcast (right-aligned), as an additive double.
double mask_at(const Case& c, const Tensor& mask, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (c.mask == Case::Mask::kNone) return 0;
  const int64_t full[4] = {b, h, i, j};
  int64_t off = 0;
  const size_t rank = c.mask_shape.size();
  for (size_t r = 0; r < rank; ++r) {
    const int64_t idx = c.mask_shape[r] == 1 ? 0 : full[4 - rank + r];
    off = off * c.mask_shape[r] + idx;
  }
  if (c.mask == Case::Mask::kBool) return reinterpret_cast<const bool*>(mask.data.data())[off] ? 0 : -INFINITY;
  return f(mask)[off];
}

// The unfused attention and its gradients in double.
struct Reference {
  std::vector<double> y, lse, dq, dk, dv;
};

Reference reference(const Case& c, const Inputs& in) {
  Reference r;
  r.y.assign(c.b * c.h * c.s * c.dv, 0);
  r.lse.assign(c.b * c.h * c.s, 0);
  r.dq.assign(c.b * c.h * c.s * c.d, 0);
  r.dk.assign(c.b * c.hkv * c.t * c.d, 0);
  r.dv.assign(c.b * c.hkv * c.t * c.dv, 0);
  const int64_t g = c.h / c.hkv;
  std::vector<double> p(c.t), dp(c.t);
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.h; ++h) {
      const int64_t kvh = b * c.hkv + h / g, bh = b * c.h + h;
      const float* q = f(in.q) + bh * c.s * c.d;
      const float* k = f(in.k) + kvh * c.t * c.d;
      const float* v = f(in.v) + kvh * c.t * c.dv;
      const float* dy = f(in.dy) + bh * c.s * c.dv;
      for (int64_t i = 0; i < c.s; ++i) {
        double m = -INFINITY;
        for (int64_t j = 0; j < c.t; ++j) {
          double s = 0;
          for (int64_t x = 0; x < c.d; ++x) s += double(q[i * c.d + x]) * k[j * c.d + x];
          s = s * c.scale + mask_at(c, in.mask, b, h, i, j);
          if (c.causal && j > i) s = -INFINITY;
          p[j] = s;
          m = std::max(m, s);
        }
        double sum = 0;
        for (int64_t j = 0; j < c.t; ++j) sum += p[j] = std::exp(p[j] - m);
        for (int64_t j = 0; j < c.t; ++j) p[j] /= sum;
        r.lse[bh * c.s + i] = m + std::log(sum);
        double delta = 0;
        for (int64_t j = 0; j < c.t; ++j) {
          dp[j] = 0;
          for (int64_t x = 0; x < c.dv; ++x) {
            r.y[(bh * c.s + i) * c.dv + x] += p[j] * v[j * c.dv + x];
            dp[j] += double(dy[i * c.dv + x]) * v[j * c.dv + x];
          }
          delta += p[j] * dp[j];
        }
        for (int64_t j = 0; j < c.t; ++j) {
          const double ds = p[j] * (dp[j] - delta) * c.scale;
          for (int64_t x = 0; x < c.d; ++x) {
            r.dq[(bh * c.s + i) * c.d + x] += ds * k[j * c.d + x];
            r.dk[(kvh * c.t + j) * c.d + x] += ds * q[i * c.d + x];
          }
          for (int64_t x = 0; x < c.dv; ++x) r.dv[(kvh * c.t + j) * c.dv + x] += p[j] * dy[i * c.dv + x];
        }
      }
    }
  return r;
}

std::map<std::string, AttrValue> attrs(const Case& c) {
  return {{"scale", AttrValue(c.scale)}, {"causal", AttrValue(int64_t{c.causal ? 1 : 0})}};
}

std::vector<Tensor> forward(const Case& c, const Inputs& in, int threads) {
  std::vector<testing::Arg> args = {fed(in.q), fed(in.k), fed(in.v)};
  if (c.mask != Case::Mask::kNone) args.push_back(fed(in.mask));
  return run("FusedAttention", args, {out_f32({c.b, c.h, c.s, c.dv}), out_f32({c.b, c.h, c.s})}, attrs(c), false,
             threads);
}

std::vector<Tensor> backward(const Case& c, const Inputs& in, const Tensor& y, const Tensor& lse, int threads) {
  std::vector<testing::Arg> args = {fed(in.dy), fed(in.q), fed(in.k), fed(in.v), fed(y), fed(lse)};
  if (c.mask != Case::Mask::kNone) args.push_back(fed(in.mask));
  return run("FusedAttentionGrad", args, {in.q.type, in.k.type, in.v.type}, attrs(c), false, threads);
}

// max |have - want| / max(1, max |want|)
double error(const Tensor& have, const std::vector<double>& want) {
  double worst = 0, top = 1;
  for (double w : want) top = std::max(top, std::fabs(w));
  for (size_t x = 0; x < want.size(); ++x) {
    const double h = f(have)[x];
    if (!std::isfinite(h)) return INFINITY;
    worst = std::max(worst, std::fabs(h - want[x]));
  }
  return worst / top;
}

void expect_matches(const Case& c, unsigned seed = 7) {
  const Inputs in = make_inputs(c, seed);
  const Reference want = reference(c, in);
  const auto fw = forward(c, in, 2);
  // float32 sums over up to 1024 keys and dot products of up to 64 terms; the gradients sum
  // products of those (dQ, dK: scale * ds k over every key), hence their looser bound.
  EXPECT_LE(error(fw[0], want.y), 1e-5) << "Y";
  EXPECT_LE(error(fw[1], want.lse), 1e-5) << "LogSumExp";
  const auto bw = backward(c, in, fw[0], fw[1], 2);
  EXPECT_LE(error(bw[0], want.dq), 1e-4) << "dQ";
  EXPECT_LE(error(bw[1], want.dk), 1e-4) << "dK";
  EXPECT_LE(error(bw[2], want.dv), 1e-5) << "dV";
}

TEST(FusedAttention, NonCausal) { expect_matches({}); }

TEST(FusedAttention, Causal) {
  Case c;
  c.causal = true;
  expect_matches(c);
}

TEST(FusedAttention, CausalWithMoreQueriesThanKeysAndTheOtherWay) {
  Case c;
  c.causal = true;
  c.s = 70;
  c.t = 40;
  expect_matches(c);
  c.s = 40;
  c.t = 131;
  expect_matches(c);
}

TEST(FusedAttention, AdditiveMaskBroadcastOverHeads) {
  Case c;
  c.s = 37;
  c.t = 70;
  c.mask = Case::Mask::kFloat;
  c.mask_shape = {1, 1, 37, 70};
  expect_matches(c);
  c.mask_shape = {70};  // a key padding mask, broadcast over queries too
  c.causal = true;
  expect_matches(c);
}

TEST(FusedAttention, BooleanMaskPerHead) {
  Case c;
  c.b = 2;
  c.s = 33;
  c.t = 65;
  c.mask = Case::Mask::kBool;
  c.mask_shape = {2, 2, 33, 65};
  expect_matches(c);
}

TEST(FusedAttention, GroupedQueryHeads) {
  Case c;
  c.h = 6;
  c.hkv = 2;
  c.s = c.t = 100;
  c.dv = 12;
  c.causal = true;
  expect_matches(c);
  c.hkv = 1;
  c.causal = false;
  expect_matches(c);
}

TEST(FusedAttention, ContextLengths) {
  for (int64_t n : {1, 2, 31, 32, 33, 63, 64, 65, 127, 200, 1024}) {
    SCOPED_TRACE(n);
    Case c;
    c.h = 1;
    c.hkv = 1;
    c.s = c.t = n;
    c.d = c.dv = 16;
    c.causal = true;
    expect_matches(c, static_cast<unsigned>(n));
  }
}

// Head widths of whole and partial 16-float lanes, and past the 64 columns a product makes at once.
TEST(FusedAttention, HeadWidths) {
  for (const auto& [d, dv] : {std::pair<int64_t, int64_t>{64, 64}, {80, 72}, {128, 128}, {40, 136}}) {
    SCOPED_TRACE(std::to_string(d) + " " + std::to_string(dv));
    Case c;
    c.s = c.t = 150;
    c.d = d;
    c.dv = dv;
    c.causal = true;
    expect_matches(c, static_cast<unsigned>(d + dv));
  }
}

// Bits that do not depend on the thread count: no sum is split between threads.
TEST(FusedAttention, BitIdenticalAcrossThreadCounts) {
  Case c;
  c.b = 2;
  c.h = 4;
  c.hkv = 2;
  c.s = c.t = 150;
  c.causal = true;
  c.mask = Case::Mask::kFloat;
  c.mask_shape = {2, 1, 1, 150};
  const Inputs in = make_inputs(c, 3);
  const auto fw1 = forward(c, in, 1);
  const auto bw1 = backward(c, in, fw1[0], fw1[1], 1);
  for (int threads : {2, 3}) {
    const auto fw = forward(c, in, threads);
    const auto bw = backward(c, in, fw[0], fw[1], threads);
    for (size_t o = 0; o < 2; ++o) EXPECT_EQ(fw[o].data, fw1[o].data) << "forward output " << o << ", " << threads;
    for (size_t o = 0; o < 3; ++o) EXPECT_EQ(bw[o].data, bw1[o].data) << "gradient " << o << ", " << threads;
  }
}

// Each copy of the vector loops this CPU runs (vector_clones.h's on_vector_isa: AVX-512, AVX2,
// baseline; PT_MAX_CPU_ISA caps the choice) matches the math, and the AVX2 copy, whose register
// blocks are narrower but whose every sum runs in the same order with the same FMAs, gives the
// widest copy's bits. Head widths of partial lanes and past 64 columns, a causal additive mask,
// grouped heads, a partial last tile.
TEST(FusedAttention, EveryCopyMatchesAndAvx2GivesTheWidestCopysBits) {
  Case c;
  c.b = 2;
  c.h = 4;
  c.hkv = 2;
  c.s = c.t = 150;
  c.d = 40;
  c.dv = 72;
  c.causal = true;
  c.mask = Case::Mask::kFloat;
  c.mask_shape = {2, 1, 1, 150};
  const Inputs in = make_inputs(c, 11);
  const Reference want = reference(c, in);
  std::vector<Tensor> widest;  // forward outputs, then gradients, of the first copy
  testing::on_every_copy([&](const std::string& isa) {
    auto outs = forward(c, in, 2);
    EXPECT_LE(error(outs[0], want.y), 1e-5) << "Y";
    EXPECT_LE(error(outs[1], want.lse), 1e-5) << "LogSumExp";
    for (Tensor& g : backward(c, in, outs[0], outs[1], 2)) outs.push_back(std::move(g));
    EXPECT_LE(error(outs[2], want.dq), 1e-4) << "dQ";
    EXPECT_LE(error(outs[3], want.dk), 1e-4) << "dK";
    EXPECT_LE(error(outs[4], want.dv), 1e-5) << "dV";
    if (widest.empty()) {
      widest = outs;
    } else if (isa == "avx2") {
      for (size_t o = 0; o < outs.size(); ++o) EXPECT_EQ(outs[o].data, widest[o].data) << "output " << o;
    }
  });
}

// What the unfused Softmax gives a row whose every element is -inf: the same value everywhere
// (exp of NaN clamps), so the fused op's fully masked row is the mean of V over every key.
TEST(FusedAttention, FullyMaskedRowIsWhatTheUnfusedSoftmaxGives) {
  Tensor x = make_tensor(DType::kFloat32, {2, 5});
  auto* xs = reinterpret_cast<float*>(x.data.data());
  for (int k = 0; k < 5; ++k) xs[k] = -kInf, xs[5 + k] = float(k);
  const auto sm = run("Softmax", {fed(x)}, {out_f32({2, 5})}, {}, true);
  for (int k = 0; k < 5; ++k) EXPECT_FLOAT_EQ(f(sm[0])[k], 0.2f);

  Case c;
  c.h = c.hkv = 1;
  c.s = 3;
  c.t = 5;
  c.causal = true;
  c.mask = Case::Mask::kBool;
  c.mask_shape = {3, 5};
  Inputs in = make_inputs(c, 5);
  auto* m = reinterpret_cast<bool*>(in.mask.data.data());
  for (int64_t x = 0; x < 15; ++x) m[x] = x >= 5;  // row 0 sees nothing
  const auto fw = forward(c, in, 2);
  for (int64_t x = 0; x < c.dv; ++x) {
    double mean = 0;
    for (int64_t j = 0; j < c.t; ++j) mean += f(in.v)[j * c.dv + x] / c.t;
    EXPECT_NEAR(f(fw[0])[x], mean, 1e-6);
  }
  EXPECT_EQ(f(fw[1])[0], -kInf);
  const auto bw = backward(c, in, fw[0], fw[1], 2);
  for (const Tensor& grad : bw)
    for (int64_t x = 0; x < grad.type.numel(); ++x) ASSERT_TRUE(std::isfinite(f(grad)[x]));
  for (int64_t x = 0; x < c.d; ++x) EXPECT_EQ(f(bw[0])[x], 0.f);  // row 0's dQ
}

}  // namespace
}  // namespace pt
