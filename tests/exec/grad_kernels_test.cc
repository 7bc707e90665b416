// tests/exec/grad_kernels_test.cc: the CPU kernels of the pipetrain-domain ops
// (core/pipetrain_ops.h) and Pad, each run as a one-node graph through StageProgram on the CPU
// backend (so through the registry), against an oracle that does not share its code:
//   - elementwise, softmax, norm, loss, GatherGrad and Pad: a plain double-precision loop here;
//   - ConvGradInput, ConvGradWeight, AveragePoolGrad: the adjoint identity with the forward
//     kernels, <Grad(dY), X> == <dY, Forward(X)> for random X and dY (the forward is linear);
//   - MaxPoolGrad: a loop here, on data with ties and negative values.
// Tolerances are absolute + relative (|have - want| <= abs + rel * |want|), each with its reason.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/pipetrain_ops.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/cpu/vector_clones.h"
#include "exec/stage_program.h"
#include "tests/exec/isa_cap.h"
#include "tests/exec/one_node.h"

namespace pt {
namespace {

using Dims = std::vector<int64_t>;
using testing::Arg;
using testing::build;
using testing::constant;
using testing::fed;
using testing::kOmitted;
using testing::make_tensor;
using testing::omitted;
using testing::OneNode;
using testing::out_f32;
using testing::run;
using testing::uniform;

// ---------------------------------------------------------------------------------------------
// Tensors and one-node graphs

Tensor f32(const Dims& shape, const std::vector<float>& v) {
  Tensor x = make_tensor(DType::kFloat32, shape);
  EXPECT_EQ(static_cast<int64_t>(v.size()), x.type.numel());
  std::memcpy(x.data.data(), v.data(), x.data.size());
  return x;
}

Tensor scalar(float v) { return f32({}, {v}); }

template <class I>
Tensor ints(const Dims& shape, const std::vector<I>& v) {
  Tensor x = make_tensor(dtype_of<I>(), shape);
  EXPECT_EQ(static_cast<int64_t>(v.size()), x.type.numel());
  std::memcpy(x.data.data(), v.data(), x.data.size());
  return x;
}

std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.as<float>(), t.as<float>() + t.type.numel());
}

Tensor abs_of(const Tensor& t) {
  Tensor a = t;
  for (int64_t i = 0; i < a.type.numel(); ++i) a.as<float>()[i] = std::fabs(a.as<float>()[i]);
  return a;
}

double dot(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.type, b.type);
  double s = 0;
  for (int64_t i = 0; i < a.type.numel(); ++i) s += double(a.as<float>()[i]) * b.as<float>()[i];
  return s;
}

Tensor run1(const std::string& op, const std::vector<Arg>& args, const TensorType& out,
            std::map<std::string, AttrValue> attrs = {}, bool onnx = false, int threads = 2) {
  auto r = run(op, args, {out}, std::move(attrs), onnx, threads);
  return r.empty() ? Tensor{} : std::move(r[0]);
}

void expect_close(const Tensor& have, const std::vector<double>& want, double abs_tol,
                  double rel_tol, const std::string& what = "") {
  ASSERT_EQ(have.type.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(have.as<float>()[i], want[i], abs_tol + rel_tol * std::fabs(want[i]))
        << what << " at " << i;
}

// Row-major strides and flat index helpers for the reference loops.
int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Element-wise gradients

constexpr double kPi = 3.14159265358979323846;

// dY and X on [-4, 4], with X holding exact 0, +-1 (Clip's bounds below) a few times.
Tensor saved_x(const Dims& shape, unsigned seed) {
  Tensor x = uniform(shape, seed, -4.f, 4.f);
  float* p = x.as<float>();
  p[0] = 0.f;
  p[1] = -1.f;
  p[2] = 1.f;
  p[5] = 1.f;
  return x;
}

// ReluGrad is a select: exact.
TEST(ReluGrad, MasksWhereOutputIsNotPositive) {
  const Dims shape{3, 37};
  const Tensor dy = uniform(shape, 1);
  Tensor y = saved_x(shape, 2);
  for (int64_t i = 0; i < y.type.numel(); ++i) y.as<float>()[i] = std::max(0.f, y.as<float>()[i]);
  const Tensor dx = run1("ReluGrad", {fed(dy), fed(y)}, out_f32(shape));
  std::vector<double> want(dy.type.numel());
  for (size_t i = 0; i < want.size(); ++i) want[i] = y.as<float>()[i] > 0 ? dy.as<float>()[i] : 0;
  expect_close(dx, want, 0, 0);
}

// ClipGrad is a select with strict bounds (X == min or max gives 0): exact.
void check_clip_grad(const Arg& lo, const Arg& hi, float lo_v, float hi_v) {
  const Dims shape{4, 29};
  const Tensor dy = uniform(shape, 3), x = saved_x(shape, 4);
  const Tensor dx = run1("ClipGrad", {fed(dy), fed(x), lo, hi}, out_f32(shape));
  std::vector<double> want(dy.type.numel());
  for (size_t i = 0; i < want.size(); ++i) {
    const float v = x.as<float>()[i];
    want[i] = lo_v < v && v < hi_v ? dy.as<float>()[i] : 0;
  }
  expect_close(dx, want, 0, 0);
}

TEST(ClipGrad, ConstantBoundsAreStrict) {
  check_clip_grad(constant(scalar(-1.f)), constant(scalar(1.f)), -1.f, 1.f);
}
TEST(ClipGrad, OmittedMinIsNoBound) {
  check_clip_grad(omitted(), constant(scalar(1.f)), -INFINITY, 1.f);
}
TEST(ClipGrad, OmittedMaxIsNoBound) {
  check_clip_grad(constant(scalar(0.f)), omitted(), 0.f, INFINITY);
}
TEST(ClipGrad, BoundsFedAtRunTime) {
  check_clip_grad(fed(scalar(-1.f)), fed(scalar(1.f)), -1.f, 1.f);
}

// exp_poly's relative error is below 2e-7, and rounding X^2 in float shifts the exponent by up
// to 16 * 6e-8 (relative 1e-6 of the result): 3e-6 relative, 1e-7 absolute for values near 0.
TEST(ErfGrad, MatchesDefinition) {
  const Dims shape{5, 41};
  const Tensor dy = uniform(shape, 5), x = saved_x(shape, 6);
  const Tensor dx = run1("ErfGrad", {fed(dy), fed(x)}, out_f32(shape));
  std::vector<double> want(dy.type.numel());
  for (size_t i = 0; i < want.size(); ++i) {
    const double v = x.as<float>()[i];
    want[i] = dy.as<float>()[i] * 2 / std::sqrt(kPi) * std::exp(-v * v);
  }
  expect_close(dx, want, 1e-7, 3e-6);
}

// gelu'(x) in double for approximate "none" and "tanh".
double gelu_grad(double x, bool tanh_form) {
  if (!tanh_form)
    return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-x * x / 2) / std::sqrt(2 * kPi);
  const double k = std::sqrt(2 / kPi), u = k * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

// oneDNN evaluates erf, exp and tanh by float polynomial approximations: a few float ulps of
// gelu' (which is O(1) here), so 2e-6 absolute and relative.
void check_gelu_grad(const std::string& approximate) {
  const Dims shape{2, 3, 33};
  const Tensor dy = uniform(shape, 7), x = saved_x(shape, 8);
  std::map<std::string, AttrValue> attrs;
  if (!approximate.empty()) attrs["approximate"] = approximate;
  const Tensor dx = run1("GeluGrad", {fed(dy), fed(x)}, out_f32(shape), attrs);
  std::vector<double> want(dy.type.numel());
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = dy.as<float>()[i] * gelu_grad(x.as<float>()[i], approximate == "tanh");
  expect_close(dx, want, 2e-6, 2e-6, approximate);
}

TEST(GeluGrad, ErfFormByDefault) { check_gelu_grad(""); }
TEST(GeluGrad, TanhForm) { check_gelu_grad("tanh"); }

// ---------------------------------------------------------------------------------------------
// Softmax gradients

// Shape viewed as (outer, n, inner) around axis.
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
  AxisView(const Dims& shape, int64_t axis) {
    if (axis < 0) axis += static_cast<int64_t>(shape.size());
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
      (d < axis ? outer : d == axis ? n : inner) *= shape[d];
  }
  int64_t at(int64_t o, int64_t k, int64_t i) const { return (o * n + k) * inner + i; }
};

// Y = softmax or log-softmax of X along axis, in double, rounded to float.
Tensor softmax_of(const Tensor& x, int64_t axis, bool log) {
  const AxisView v(x.type.shape, axis);
  Tensor y = x;
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < v.inner; ++i) {
      double m = -INFINITY, s = 0;
      for (int64_t k = 0; k < v.n; ++k) m = std::max(m, double(x.as<float>()[v.at(o, k, i)]));
      for (int64_t k = 0; k < v.n; ++k) s += std::exp(x.as<float>()[v.at(o, k, i)] - m);
      for (int64_t k = 0; k < v.n; ++k) {
        const double z = x.as<float>()[v.at(o, k, i)] - m;
        y.as<float>()[v.at(o, k, i)] = static_cast<float>(log ? z - std::log(s) : std::exp(z) / s);
      }
    }
  return y;
}

// Float sums of n <= 37 products of O(1) values: 1e-6 absolute, 1e-5 relative.
void check_softmax_grad(const Dims& shape, int64_t axis, bool log) {
  const Tensor dy = uniform(shape, 9), y = softmax_of(uniform(shape, 10, -3.f, 3.f), axis, log);
  std::map<std::string, AttrValue> attrs;
  if (axis != -1) attrs["axis"] = axis;
  const Tensor dx =
      run1(log ? "LogSoftmaxGrad" : "SoftmaxGrad", {fed(dy), fed(y)}, out_f32(shape), attrs);
  const AxisView v(shape, axis);
  std::vector<double> want(dy.type.numel());
  const float* d = dy.as<float>();
  const float* p = y.as<float>();
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < v.inner; ++i) {
      double s = 0;
      for (int64_t k = 0; k < v.n; ++k)
        s += log ? d[v.at(o, k, i)] : double(d[v.at(o, k, i)]) * p[v.at(o, k, i)];
      for (int64_t k = 0; k < v.n; ++k) {
        const int64_t at = v.at(o, k, i);
        want[at] = log ? d[at] - std::exp(double(p[at])) * s : p[at] * (d[at] - s);
      }
    }
  expect_close(dx, want, 1e-6, 1e-5);
}

TEST(SoftmaxGrad, LastAxis) { check_softmax_grad({2, 3, 7}, -1, false); }
TEST(SoftmaxGrad, MiddleAxis) { check_softmax_grad({2, 5, 4}, 1, false); }
// Rows longer than the 16 lanes the row loop sums in, with a tail: attention's [B, H, T, T].
TEST(SoftmaxGrad, LongRows) { check_softmax_grad({2, 3, 5, 37}, -1, false); }
TEST(LogSoftmaxGrad, LongRows) { check_softmax_grad({3, 37}, -1, true); }
TEST(LogSoftmaxGrad, LastAxis) { check_softmax_grad({2, 3, 7}, -1, true); }
TEST(LogSoftmaxGrad, MiddleAxis) { check_softmax_grad({2, 5, 4}, 1, true); }

// The row loops on each copy this CPU runs (PT_MAX_CPU_ISA: softmax.cc's lanes are 16 floats in
// one AVX-512 register, two AVX2 or four SSE2 ones), the AVX2 copy giving the widest one's bits:
// Softmax, LogSoftmax and their gradients over rows of 100 (six whole lanes and a tail of 4).
// SoftmaxGrad's bits are the widest copy's only on whole lanes: GCC vectorises the products of
// row_dot's tail at each copy's own width (8 on AVX-512, 4 on AVX2), unfused, and fuses the rest,
// so a tail of 4 is fused on AVX-512 and not on AVX2.
TEST(SoftmaxRows, EveryCopyMatchesAndAvx2GivesTheWidestCopysBits) {
  const Dims shape{3, 5, 100};
  const Tensor x = uniform(shape, 12, -3.f, 3.f), dy = uniform(shape, 13);
  std::vector<Tensor> widest;
  testing::on_every_copy([&](const std::string& isa) {
    check_softmax_grad({2, 3, 5, 37}, -1, false);
    check_softmax_grad({3, 37}, -1, true);
    std::vector<Tensor> outs;
    for (const bool log : {false, true}) {
      const Tensor y = run1(log ? "LogSoftmax" : "Softmax", {fed(x)}, out_f32(shape), {}, true);
      const Tensor want = softmax_of(x, -1, log);
      expect_close(y, std::vector<double>(want.as<float>(), want.as<float>() + want.type.numel()), 1e-6, 1e-5);
      outs.push_back(y);
      outs.push_back(run1(log ? "LogSoftmaxGrad" : "SoftmaxGrad", {fed(dy), fed(y)}, out_f32(shape), {}));
    }
    const Dims whole{3, 5, 96};
    const Tensor y = softmax_of(uniform(whole, 14, -3.f, 3.f), -1, false);
    outs.push_back(run1("SoftmaxGrad", {fed(uniform(whole, 15)), fed(y)}, out_f32(whole), {}));
    if (widest.empty()) {
      widest = outs;
    } else if (isa == "avx2") {
      for (size_t o = 0; o < outs.size(); ++o) {
        if (o == 1) continue;  // SoftmaxGrad: its row tails differ (above)
        EXPECT_EQ(outs[o].data, widest[o].data) << "output " << o;
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// LayerNormGrad

// X, Scale, Mean, InvStdDev, dY of a LayerNormalization over [axis, rank) and the gradients by
// the spec's formulas in double; `keep` says which of (dX, dScale, dBias) are asked for.
void check_layer_norm_grad(const Dims& shape, int64_t axis, std::vector<bool> keep, int threads) {
  const size_t a = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(shape.size()) : axis);
  const Dims scale_shape(shape.begin() + a, shape.end());
  Dims stat_shape(shape.begin(), shape.begin() + a);
  stat_shape.resize(shape.size(), 1);
  const int64_t inner = numel(scale_shape), outer = numel(shape) / inner;
  const Tensor x = uniform(shape, 11, -2.f, 3.f), dy = uniform(shape, 12);
  const Tensor scale = uniform(scale_shape, 13, 0.5f, 1.5f);
  Tensor mean = make_tensor(DType::kFloat32, stat_shape), istd = mean;
  const float* xp = x.as<float>();
  for (int64_t r = 0; r < outer; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < inner; ++j) m += xp[r * inner + j];
    m /= inner;
    for (int64_t j = 0; j < inner; ++j) v += (xp[r * inner + j] - m) * (xp[r * inner + j] - m);
    mean.as<float>()[r] = static_cast<float>(m);
    istd.as<float>()[r] = static_cast<float>(1 / std::sqrt(v / inner + 1e-5));
  }
  std::vector<double> dx(numel(shape)), dscale(inner, 0), dbias(inner, 0);
  for (int64_t r = 0; r < outer; ++r) {
    const double m = mean.as<float>()[r], is = istd.as<float>()[r];
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < inner; ++j) {
      const double g = double(dy.as<float>()[r * inner + j]) * scale.as<float>()[j];
      mg += g / inner;
      mgx += g * (xp[r * inner + j] - m) * is / inner;
    }
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t at = r * inner + j;
      const double xhat = (xp[at] - m) * is, g = double(dy.as<float>()[at]) * scale.as<float>()[j];
      dx[at] = is * (g - mg - xhat * mgx);
      dscale[j] += dy.as<float>()[at] * xhat;
      dbias[j] += dy.as<float>()[at];
    }
  }
  const std::vector<TensorType> outs = {out_f32(shape), keep[1] ? out_f32(scale_shape) : kOmitted,
                                        keep[2] ? out_f32(scale_shape) : kOmitted};
  std::map<std::string, AttrValue> attrs;
  if (axis != -1) attrs["axis"] = axis;
  const auto have = run("LayerNormGrad", {fed(dy), fed(x), fed(scale), fed(mean), fed(istd)}, outs,
                        attrs, false, threads);
  // dX cancels three O(1) terms in float: 1e-5 absolute. dScale and dBias add `outer` float
  // products: 1e-6 * outer absolute, 1e-5 relative.
  ASSERT_EQ(have.size(), 1u + keep[1] + keep[2]);
  expect_close(have[0], dx, 1e-5, 1e-5, "dX");
  size_t k = 1;
  if (keep[1]) expect_close(have[k++], dscale, 1e-6 * outer, 1e-5, "dScale");
  if (keep[2]) expect_close(have[k++], dbias, 1e-6 * outer, 1e-5, "dBias");
}

TEST(LayerNormGrad, LastAxis) { check_layer_norm_grad({2, 3, 8}, -1, {true, true, true}, 2); }
TEST(LayerNormGrad, Axis1Of3D) { check_layer_norm_grad({2, 3, 8}, 1, {true, true, true}, 2); }
TEST(LayerNormGrad, WithoutDScale) { check_layer_norm_grad({4, 21}, -1, {true, false, true}, 2); }
TEST(LayerNormGrad, WithoutDBias) { check_layer_norm_grad({4, 21}, -1, {true, true, false}, 2); }
TEST(LayerNormGrad, OnlyDX) { check_layer_norm_grad({4, 21}, -1, {true, false, false}, 2); }
// 64 x 4 x 130 elements: three row chunks of uneven size, their partial sums folded.
TEST(LayerNormGrad, ParallelChunks) {
  check_layer_norm_grad({64, 4, 130}, -1, {true, true, true}, 3);
}

// ---------------------------------------------------------------------------------------------
// BatchNormGrad

void check_batch_norm_grad(const Dims& shape, std::vector<bool> keep, int threads) {
  const int64_t n = shape[0], c = shape[1], s = numel(shape) / (n * c), count = n * s;
  const float eps = 1e-3f;
  const Tensor x = uniform(shape, 14, -1.f, 2.f), dy = uniform(shape, 15);
  const Tensor scale = uniform({c}, 16, 0.5f, 1.5f);
  auto at = [&](int64_t b, int64_t ch, int64_t i) { return (b * c + ch) * s + i; };
  std::vector<double> dx(numel(shape)), dscale(c), dbias(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    double m = 0, v = 0, sd = 0, sdx = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) m += x.as<float>()[at(b, ch, i)];
    m /= count;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) v += std::pow(x.as<float>()[at(b, ch, i)] - m, 2);
    const double istd = 1 / std::sqrt(v / count + eps);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) {
        sd += dy.as<float>()[at(b, ch, i)];
        sdx += dy.as<float>()[at(b, ch, i)] * (x.as<float>()[at(b, ch, i)] - m) * istd;
      }
    dbias[ch] = sd;
    dscale[ch] = sdx;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) {
        const int64_t k = at(b, ch, i);
        const double xhat = (x.as<float>()[k] - m) * istd;
        dx[k] =
            scale.as<float>()[ch] * istd * (dy.as<float>()[k] - sd / count - xhat * sdx / count);
      }
  }
  const std::vector<TensorType> outs = {out_f32(shape), keep[1] ? out_f32({c}) : kOmitted,
                                        keep[2] ? out_f32({c}) : kOmitted};
  const auto have =
      run("BatchNormGrad", {fed(dy), fed(x), fed(scale)}, outs, {{"epsilon", eps}}, false, threads);
  // The kernel's moments are float (as the forward's are): dX to 1e-5 absolute (O(1) values),
  // the channel sums of `count` float terms to 1e-6 * count absolute and 1e-5 relative.
  ASSERT_EQ(have.size(), 1u + keep[1] + keep[2]);
  expect_close(have[0], dx, 1e-5, 1e-5, "dX");
  size_t k = 1;
  if (keep[1]) expect_close(have[k++], dscale, 1e-6 * count, 1e-5, "dScale");
  if (keep[2]) expect_close(have[k++], dbias, 1e-6 * count, 1e-5, "dBias");
}

TEST(BatchNormGrad, NCHW) { check_batch_norm_grad({3, 4, 5, 7}, {true, true, true}, 2); }
TEST(BatchNormGrad, NC) { check_batch_norm_grad({6, 5}, {true, true, true}, 2); }
TEST(BatchNormGrad, WithoutDScale) { check_batch_norm_grad({2, 3, 17}, {true, false, true}, 2); }
TEST(BatchNormGrad, WithoutDBias) { check_batch_norm_grad({2, 3, 17}, {true, true, false}, 2); }
// 4 x 8 x 33 x 33 elements: channels in parallel, S not a multiple of the 16 lanes.
TEST(BatchNormGrad, ParallelChannels) {
  check_batch_norm_grad({4, 8, 33, 33}, {true, true, true}, 3);
}

// ---------------------------------------------------------------------------------------------
// Conv gradients: the adjoint identity with the forward Conv kernel

struct ConvCase {
  int64_t n, c, m, group;
  Dims in, kernel, strides, dilations, pads;  // spatial; pads = begins then ends
};

Dims conv_out(const ConvCase& p) {
  const size_t r = p.in.size();
  Dims y{p.n, p.m};
  for (size_t i = 0; i < r; ++i) {
    const int64_t dk = (p.kernel[i] - 1) * p.dilations[i] + 1;
    y.push_back((p.in[i] + p.pads[i] + p.pads[i + r] - dk) / p.strides[i] + 1);
  }
  return y;
}

std::map<std::string, AttrValue> conv_attrs(const ConvCase& p) {
  return {{"group", p.group}, {"strides", p.strides}, {"dilations", p.dilations}, {"pads", p.pads}};
}

// <ConvGradInput(dY, W), X> and <ConvGradWeight(dY, X), W> both equal <dY, Conv(X, W)>. Float
// sums reorder freely, so the tolerance is relative to the sum of the absolute values of the
// terms, <|dY|, Conv(|X|, |W|)>: 1e-5 of it is 100x float rounding over these sizes, while a
// misplaced tap or channel breaks the identity by O(1) of it.
void check_conv_adjoint(const ConvCase& p) {
  Dims x_shape{p.n, p.c}, w_shape{p.m, p.c / p.group};
  x_shape.insert(x_shape.end(), p.in.begin(), p.in.end());
  w_shape.insert(w_shape.end(), p.kernel.begin(), p.kernel.end());
  const Dims y_shape = conv_out(p);
  const Tensor x = uniform(x_shape, 21), w = uniform(w_shape, 22), dy = uniform(y_shape, 23);
  const auto attrs = conv_attrs(p);
  const Tensor y = run1("Conv", {fed(x), fed(w)}, out_f32(y_shape), attrs, true);
  const Tensor y_abs =
      run1("Conv", {fed(abs_of(x)), fed(abs_of(w))}, out_f32(y_shape), attrs, true);
  auto gi = attrs, gw = attrs;
  gi["input_shape"] = x_shape;
  gw["weight_shape"] = w_shape;
  const Tensor dx = run1("ConvGradInput", {fed(dy), fed(w)}, out_f32(x_shape), gi);
  const Tensor dw = run1("ConvGradWeight", {fed(dy), fed(x)}, out_f32(w_shape), gw);
  const double want = dot(dy, y), tol = 1e-5 * dot(abs_of(dy), y_abs);
  EXPECT_NEAR(dot(dx, x), want, tol) << "ConvGradInput";
  EXPECT_NEAR(dot(dw, w), want, tol) << "ConvGradWeight";
}

TEST(ConvGrad, Dense3x3) {
  check_conv_adjoint({2, 3, 4, 1, {7, 6}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}});
}
TEST(ConvGrad, StridedAsymmetricPads) {
  check_conv_adjoint({2, 5, 6, 1, {9, 8}, {3, 2}, {2, 3}, {1, 1}, {0, 2, 1, 0}});
}
TEST(ConvGrad, Dilated) {
  check_conv_adjoint({1, 4, 3, 1, {11, 10}, {3, 3}, {1, 2}, {2, 3}, {2, 1, 2, 3}});
}
TEST(ConvGrad, Grouped) {
  check_conv_adjoint({2, 8, 12, 4, {9, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}});
}
TEST(ConvGrad, DepthwiseStrided) {
  check_conv_adjoint({2, 16, 16, 16, {10, 10}, {3, 3}, {2, 2}, {1, 1}, {1, 0, 1, 1}});
}
// Planes smaller than the kernel (MobileNetV2's late 3x3 depthwise convolutions on 2x2 and 1x1
// maps), where oneDNN has no JIT weight gradient and the direct depthwise kernel runs; strided,
// dilated, asymmetric pads and 1-D too.
TEST(ConvGrad, DepthwiseSmallPlanes) {
  check_conv_adjoint({8, 24, 24, 24, {1, 1}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}});
  check_conv_adjoint({3, 40, 40, 40, {2, 2}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}});
  check_conv_adjoint({2, 16, 16, 16, {2, 3}, {3, 3}, {2, 1}, {1, 2}, {1, 2, 0, 1}});
  check_conv_adjoint({2, 8, 8, 8, {3}, {5}, {1}, {1}, {2, 2}});
}
// The direct depthwise kernel's bits: per channel and tap, the products summed over images, then
// the tap's pixel pairs in row-major output order, on each copy this CPU runs: each product fused
// into its sum on AVX-512 and AVX2, rounded apart on the baseline; at 1 and 2 threads (its blocks
// of 16 channels split at 2 on the larger cases), with a last block of 8 (40 channels).
TEST(ConvGrad, DepthwiseSmallPlanesSumInOrder) {
  for (const ConvCase& p : {ConvCase{8, 144, 144, 144, {2, 2}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
                            ConvCase{8, 144, 144, 144, {2, 2}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}},
                            ConvCase{8, 240, 240, 240, {1, 1}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
                            ConvCase{3, 40, 40, 40, {3, 2}, {3, 3}, {2, 1}, {1, 2}, {1, 2, 0, 1}}}) {
    const Dims y_shape = conv_out(p);
    const Dims x_shape{p.n, p.c, p.in[0], p.in[1]}, w_shape{p.c, 1, p.kernel[0], p.kernel[1]};
    const Tensor x = uniform(x_shape, 31), dy = uniform(y_shape, 32);
    auto attrs = conv_attrs(p);
    attrs["weight_shape"] = w_shape;
    const int64_t oh = y_shape[2], ow = y_shape[3], ih = p.in[0], iw = p.in[1];
    testing::on_every_copy([&](const std::string&) {
      const bool fused = cpu::vector_isa() != cpu::VectorIsa::kBaseline;
      std::vector<float> want(static_cast<size_t>(numel(w_shape)));
      for (int64_t c = 0; c < p.c; ++c)
        for (int64_t kh = 0; kh < p.kernel[0]; ++kh)
          for (int64_t kw = 0; kw < p.kernel[1]; ++kw) {
            float acc = 0.f;
            for (int64_t n = 0; n < p.n; ++n)
              for (int64_t o = 0; o < oh * ow; ++o) {
                const int64_t h = (o / ow) * p.strides[0] - p.pads[0] + kh * p.dilations[0];
                const int64_t w = (o % ow) * p.strides[1] - p.pads[1] + kw * p.dilations[1];
                if (h < 0 || h >= ih || w < 0 || w >= iw) continue;
                const float a = dy.as<float>()[(n * p.c + c) * oh * ow + o];
                const float b = x.as<float>()[((n * p.c + c) * ih + h) * iw + w];
                if (fused) {
                  acc = std::fma(a, b, acc);
                } else {
                  const float prod = a * b;
                  acc += prod;
                }
              }
            want[static_cast<size_t>((c * p.kernel[0] + kh) * p.kernel[1] + kw)] = acc;
          }
      for (const int threads : {1, 2}) {
        const Tensor dw = run1("ConvGradWeight", {fed(dy), fed(x)}, out_f32(w_shape), attrs, false, threads);
        ASSERT_EQ(dw.type.numel(), static_cast<int64_t>(want.size()));
        EXPECT_EQ(std::memcmp(dw.as<float>(), want.data(), want.size() * sizeof(float)), 0)
            << p.c << " channels of " << ih << "x" << iw << ", " << threads << " threads";
      }
    });
  }
}
// The input gradient of a depthwise conv on maps of at most 4 pixels, 16 channels or more
// (DepthwiseSmallMaps, as the forward runs there): each entry against its definition in double,
// dX[n, c, i] = sum over the (output, tap) pairs whose window meets pixel i of dY * W, on each
// copy, the AVX2 one giving the widest one's bits; MobileNetV2's 96 channels of 2x2, 144 of 2x2
// to 1x1 at stride 2, 240 of 1x1, and 40 (a last block of 8) of 2x2 under a dilated 2x3 window
// with asymmetric pads.
TEST(ConvGrad, DepthwiseSmallMapsInputOnEveryCopy) {
  for (const ConvCase& p : {ConvCase{8, 96, 96, 96, {2, 2}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
                            ConvCase{8, 144, 144, 144, {2, 2}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}},
                            ConvCase{8, 240, 240, 240, {1, 1}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
                            ConvCase{3, 40, 40, 40, {2, 2}, {2, 3}, {1, 1}, {2, 1}, {1, 2, 0, 1}}}) {
    const Dims y_shape = conv_out(p);
    const Dims x_shape{p.n, p.c, p.in[0], p.in[1]}, w_shape{p.c, 1, p.kernel[0], p.kernel[1]};
    const Tensor w = uniform(w_shape, 41), dy = uniform(y_shape, 42);
    auto attrs = conv_attrs(p);
    attrs["input_shape"] = x_shape;
    const int64_t oh = y_shape[2], ow = y_shape[3], ih = p.in[0], iw = p.in[1];
    std::vector<double> want(static_cast<size_t>(numel(x_shape))), scale(want.size());
    for (int64_t n = 0; n < p.n; ++n)
      for (int64_t c = 0; c < p.c; ++c)
        for (int64_t o = 0; o < oh * ow; ++o)
          for (int64_t kh = 0; kh < p.kernel[0]; ++kh)
            for (int64_t kw = 0; kw < p.kernel[1]; ++kw) {
              const int64_t h = (o / ow) * p.strides[0] - p.pads[0] + kh * p.dilations[0];
              const int64_t v = (o % ow) * p.strides[1] - p.pads[1] + kw * p.dilations[1];
              if (h < 0 || h >= ih || v < 0 || v >= iw) continue;
              const double t = double(dy.as<float>()[(n * p.c + c) * oh * ow + o]) *
                               w.as<float>()[(c * p.kernel[0] + kh) * p.kernel[1] + kw];
              const size_t at = static_cast<size_t>(((n * p.c + c) * ih + h) * iw + v);
              want[at] += t;
              scale[at] += std::abs(t);
            }
    Tensor widest;
    testing::on_every_copy([&](const std::string& isa) {
      const Tensor dx = run1("ConvGradInput", {fed(dy), fed(w)}, out_f32(x_shape), attrs);
      ASSERT_EQ(dx.type.numel(), static_cast<int64_t>(want.size()));
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(dx.as<float>()[i], want[i], 1e-6 * scale[i]) << p.c << " channels, at " << i;
      if (widest.data.empty()) {
        widest = dx;
      } else if (isa == "avx2") {
        EXPECT_EQ(dx.data, widest.data);
      }
    });
  }
}
// The small-map loops on 1 and 3 spatial dims (DepthwiseSmallMaps, DepthwiseConvGradWeight): a
// 1-D conv over 2 pixels and a 3-D one over 1 x 2 x 2 equal the 2-D conv they are (a size-1 dim
// added, or dropped): Y and dX to the bit (the same loop on both sides), dW within float rounding
// (oneDNN has a JIT kernel for the 2-D 1 x 2 plane); 32 channels, two blocks.
TEST(ConvGrad, DepthwiseSmallMapsOfOneAndThreeSpatialDims) {
  // Y, dX and dW of p, on X, W and dY of the same values whatever p's shapes.
  const auto run_all = [](const ConvCase& p) {
    Dims x_shape{p.n, p.c}, w_shape{p.m, 1};
    x_shape.insert(x_shape.end(), p.in.begin(), p.in.end());
    w_shape.insert(w_shape.end(), p.kernel.begin(), p.kernel.end());
    const Tensor x = uniform(x_shape, 51), w = uniform(w_shape, 52), dy = uniform(conv_out(p), 53);
    auto attrs = conv_attrs(p), gi = attrs, gw = attrs;
    gi["input_shape"] = x_shape;
    gw["weight_shape"] = w_shape;
    return std::vector<Tensor>{run1("Conv", {fed(x), fed(w)}, out_f32(conv_out(p)), attrs, true),
                               run1("ConvGradInput", {fed(dy), fed(w)}, out_f32(x_shape), gi),
                               run1("ConvGradWeight", {fed(dy), fed(x)}, out_f32(w_shape), gw)};
  };
  const auto expect_same = [](const std::vector<Tensor>& have, const std::vector<Tensor>& want) {
    EXPECT_EQ(have[0].data, want[0].data) << "Y";
    EXPECT_EQ(have[1].data, want[1].data) << "dX";
    ASSERT_EQ(have[2].type.numel(), want[2].type.numel());
    for (int64_t i = 0; i < want[2].type.numel(); ++i)
      EXPECT_NEAR(have[2].as<float>()[i], want[2].as<float>()[i], 1e-6) << "dW at " << i;
  };
  expect_same(run_all({3, 32, 32, 32, {2}, {3}, {1}, {1}, {1, 1}}),
              run_all({3, 32, 32, 32, {1, 2}, {1, 3}, {1, 1}, {1, 1}, {0, 1, 0, 1}}));
  expect_same(run_all({3, 32, 32, 32, {1, 2, 2}, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1, 0, 1, 1}}),
              run_all({3, 32, 32, 32, {2, 2}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}}));
}
// 2-D, stride 1, no dilation, where oneDNN has no JIT weight gradient (8 channels): the row
// kernel (DepthwiseRowsGradWeight). ConvNeXt's 7x7 over 8x8 maps, and rows wider than its 16
// lanes under asymmetric pads.
// It takes kernel rows four at a time: 7 rows (4 + 3), 9 (4 + 4 + 1), and 32 channels of 14x14 on
// two threads. Output rows of 16 and more take the kernel along them (DepthwiseColsGradWeight),
// up to 8 taps at a time: 21 wide under asymmetric pads (5 taps), 28 (ConvNeXt's 7x7) on two
// threads, 31 with 9 taps (8 + 1).
TEST(ConvGrad, DepthwiseRows) {
  check_conv_adjoint({2, 8, 8, 8, {8, 8}, {7, 7}, {1, 1}, {1, 1}, {3, 3, 3, 3}});
  check_conv_adjoint({2, 8, 8, 8, {12, 12}, {9, 5}, {1, 1}, {1, 1}, {4, 2, 4, 2}});
  check_conv_adjoint({2, 32, 32, 32, {14, 14}, {7, 7}, {1, 1}, {1, 1}, {3, 3, 3, 3}});
  check_conv_adjoint({3, 8, 8, 8, {5, 21}, {3, 5}, {1, 1}, {1, 1}, {0, 3, 2, 1}});
  check_conv_adjoint({2, 24, 24, 24, {20, 28}, {7, 7}, {1, 1}, {1, 1}, {3, 3, 3, 3}});
  check_conv_adjoint({2, 8, 8, 8, {6, 33}, {3, 9}, {1, 1}, {1, 1}, {1, 4, 1, 2}});
}
// An infinite input reaches only the taps that read it: the column kernel's lanes past a row's end
// multiply zeros by zeros, not a zero dY by the input. X[0, 0, 0, 19] of 20-wide rows, 7x7 padded
// by 3: only taps (kh 0-3, kw 3-6) of channel 0 read it.
TEST(ConvGrad, DepthwiseColsKeepAnInfiniteInputToItsTaps) {
  const ConvCase p{1, 8, 8, 8, {8, 20}, {7, 7}, {1, 1}, {1, 1}, {3, 3, 3, 3}};
  Tensor x = uniform({1, 8, 8, 20}, 41);
  x.as<float>()[19] = std::numeric_limits<float>::infinity();
  const Tensor dy = uniform(conv_out(p), 42);
  auto attrs = conv_attrs(p);
  attrs["weight_shape"] = Dims{8, 1, 7, 7};
  const Tensor dw = run1("ConvGradWeight", {fed(dy), fed(x)}, out_f32({8, 1, 7, 7}), attrs);
  for (int64_t c = 0; c < 8; ++c)
    for (int64_t kh = 0; kh < 7; ++kh)
      for (int64_t kw = 0; kw < 7; ++kw) {
        const bool reads = c == 0 && kh <= 3 && kw >= 3;
        EXPECT_EQ(std::isfinite(dw.as<float>()[(c * 7 + kh) * 7 + kw]), !reads) << c << " " << kh << " " << kw;
      }
}
// A 2-D depthwise input gradient of stride 1 runs as the forward convolution of dY with W flipped
// (build_depthwise_grad_input): channels short of a 16-block, asymmetric pads, a kernel wider than
// tall, and pads as large as the kernel (the backward-data kernel then: no flipped pad is negative).
// Where dX's rows are 16 wide or more, the flipped forward is pipetrain's loop (DepthwisePlaneConv).
TEST(ConvGrad, DepthwiseInputAsFlippedForward) {
  check_conv_adjoint({2, 24, 24, 24, {9, 7}, {3, 3}, {1, 1}, {1, 1}, {1, 2, 0, 1}});
  check_conv_adjoint({2, 8, 8, 8, {7, 18}, {3, 5}, {1, 1}, {1, 1}, {0, 1, 2, 3}});
  check_conv_adjoint({3, 8, 8, 8, {6, 10}, {3, 7}, {1, 1}, {1, 1}, {0, 3, 2, 1}});
  check_conv_adjoint({2, 16, 16, 16, {5, 5}, {3, 3}, {1, 1}, {1, 1}, {3, 3, 3, 3}});
}
void check_weight_gradient_on_every_copy(const ConvCase& p) {
  Dims x_shape{p.n, p.c}, w_shape{p.m, p.c / p.group};
  x_shape.insert(x_shape.end(), p.in.begin(), p.in.end());
  w_shape.insert(w_shape.end(), p.kernel.begin(), p.kernel.end());
  const Tensor x = uniform(x_shape, 21), dy = uniform(conv_out(p), 23);
  auto attrs = conv_attrs(p);
  attrs["weight_shape"] = w_shape;
  Tensor widest;
  testing::on_every_copy([&](const std::string& isa) {
    check_conv_adjoint(p);
    const Tensor dw = run1("ConvGradWeight", {fed(dy), fed(x)}, out_f32(w_shape), attrs);
    if (widest.data.empty()) {
      widest = dw;
    } else if (isa == "avx2") {
      EXPECT_EQ(dw.data, widest.data);
    }
  });
}

// The row and column kernels on each copy this CPU runs (PT_MAX_CPU_ISA), the AVX2 one giving the
// widest one's bits.
TEST(ConvGrad, DepthwiseRowsOnEveryCopy) {
  for (const ConvCase& p : {ConvCase{2, 8, 8, 8, {8, 8}, {7, 7}, {1, 1}, {1, 1}, {3, 3, 3, 3}},
                            ConvCase{2, 8, 8, 8, {9, 20}, {7, 7}, {1, 1}, {1, 1}, {3, 3, 3, 3}}})
    check_weight_gradient_on_every_copy(p);
}
// A 1x1 convolution's weight gradient on each copy (check_weight_gradient_on_every_copy), and each
// entry against its definition in double: the sum over images and pixels of dY * X.
void check_pointwise_weight_gradient(const ConvCase& p) {
  check_weight_gradient_on_every_copy(p);
  Dims x_shape{p.n, p.c};
  x_shape.insert(x_shape.end(), p.in.begin(), p.in.end());
  const Dims w_dims = p.in.size() == 1 ? Dims{p.m, p.c, 1} : Dims{p.m, p.c, 1, 1};
  const Tensor x = uniform(x_shape, 31), dy = uniform(conv_out(p), 32);
  auto attrs = conv_attrs(p);
  attrs["weight_shape"] = w_dims;
  const Tensor dw = run1("ConvGradWeight", {fed(dy), fed(x)}, out_f32(w_dims), attrs);
  int64_t hw = 1;
  for (int64_t d : p.in) hw *= d;
  for (int64_t m = 0; m < p.m; ++m)
    for (int64_t c = 0; c < p.c; ++c) {
      double want = 0, scale = 0;
      for (int64_t n = 0; n < p.n; ++n)
        for (int64_t q = 0; q < hw; ++q) {
          const double t = double(dy.as<float>()[(n * p.m + m) * hw + q]) * x.as<float>()[(n * p.c + c) * hw + q];
          want += t;
          scale += std::abs(t);
        }
      EXPECT_NEAR(dw.as<float>()[m * p.c + c], want, 1e-6 * scale) << m << " " << c;
    }
}
// 1x1 convolutions of fewer input channels than 16 on planes of more than 16 pixels (MobileNetV2's
// 8 -> 48 expansions on 16x16 and 8x8): pipetrain's lanes along the plane (PointwiseLanesGradWeight)
// on each copy, with output rows and channels short of a block (7 and 6: blocks of 4 and the
// rest) and planes whose last pixels fill no vector (5x7, a 1-D plane of 20).
TEST(ConvGrad, PointwiseFewChannelsOnEveryCopy) {
  for (const ConvCase& p : {ConvCase{8, 8, 48, 1, {16, 16}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
                            ConvCase{2, 6, 7, 1, {5, 7}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
                            ConvCase{3, 15, 9, 1, {20}, {1}, {1}, {1}, {0, 0}}})
    check_pointwise_weight_gradient(p);
}
// 1x1 convolutions of fewer input channels than 32 on maps of at most 4 pixels (MobileNetV2's
// 16 -> 96 and 24 -> 144 expansions on 2x2): 16 output channels a vector
// (PointwiseSmallMapsGradWeight) on each copy; one pixel with a last block of 8 (40 outputs), a
// 1-D plane of 3 with 7 outputs.
TEST(ConvGrad, PointwiseSmallMapsOnEveryCopy) {
  for (const ConvCase& p : {ConvCase{8, 16, 96, 1, {2, 2}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
                            ConvCase{8, 24, 144, 1, {2, 2}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
                            ConvCase{8, 16, 40, 1, {1, 1}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
                            ConvCase{3, 5, 7, 1, {3}, {1}, {1}, {1}, {0, 0}}})
    check_pointwise_weight_gradient(p);
}
// 1x1 convolutions on planes of at most 16 pixels (MobileNetV2's late expansions and projections):
// the direct pointwise weight gradient from 32 input channels (1x1 and 4x4 planes), below it
// oneDNN's blocked kernels (4x4, 2x3 and a 1-D plane of 5) but on maps of at most 4 pixels. On one pixel the input gradient is one matrix product
// (build_pixel_grad_input): MobileNetV2's last conv, 1280 -> 80.
TEST(ConvGrad, PointwiseSmallPlanes) {
  check_conv_adjoint({8, 40, 24, 1, {1, 1}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}});
  check_conv_adjoint({2, 32, 8, 1, {4, 4}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}});
  check_conv_adjoint({8, 80, 1280, 1, {1, 1}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}});
  check_conv_adjoint({3, 16, 24, 1, {4, 4}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}});
  check_conv_adjoint({2, 5, 7, 1, {2, 3}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}});
  check_conv_adjoint({2, 6, 3, 1, {5}, {1}, {1}, {1}, {0, 0}});
}
TEST(ConvGrad, Pointwise) {
  check_conv_adjoint({2, 24, 16, 1, {6, 5}, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}});
}
TEST(ConvGrad, OneDimensional) { check_conv_adjoint({3, 4, 5, 1, {17}, {5}, {2}, {1}, {2, 1}}); }
TEST(ConvGrad, WideChannels) {
  check_conv_adjoint({2, 32, 64, 1, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}});
}

// ---------------------------------------------------------------------------------------------
// Pooling gradients

struct PoolCase {
  int64_t n, c;
  Dims in, kernel, strides, pads, dilations;
  bool ceil_mode = false;
};

Dims pool_out(const PoolCase& p) {
  const size_t r = p.in.size();
  Dims y{p.n, p.c};
  for (size_t i = 0; i < r; ++i) {
    const int64_t d = p.dilations.empty() ? 1 : p.dilations[i];
    const int64_t span = p.in[i] + p.pads[i] + p.pads[i + r] - ((p.kernel[i] - 1) * d + 1);
    int64_t o = (p.ceil_mode ? (span + p.strides[i] - 1) / p.strides[i] : span / p.strides[i]) + 1;
    if (p.ceil_mode && (o - 1) * p.strides[i] >= p.in[i] + p.pads[i]) --o;  // starts in padding
    y.push_back(o);
  }
  return y;
}

std::map<std::string, AttrValue> pool_attrs(const PoolCase& p) {
  std::map<std::string, AttrValue> a = {{"kernel_shape", p.kernel},
                                        {"strides", p.strides},
                                        {"pads", p.pads},
                                        {"ceil_mode", int64_t{p.ceil_mode}}};
  if (!p.dilations.empty()) a["dilations"] = p.dilations;
  return a;
}

Dims pool_x_shape(const PoolCase& p) {
  Dims x{p.n, p.c};
  x.insert(x.end(), p.in.begin(), p.in.end());
  return x;
}

// <AveragePoolGrad(dY), X> == <dY, AveragePool(X)>, tolerance as for Conv.
void check_average_pool_adjoint(const PoolCase& p, bool include_pad) {
  const Dims x_shape = pool_x_shape(p), y_shape = pool_out(p);
  const Tensor x = uniform(x_shape, 31), dy = uniform(y_shape, 32);
  auto attrs = pool_attrs(p);
  attrs["count_include_pad"] = int64_t{include_pad};
  const Tensor y = run1("AveragePool", {fed(x)}, out_f32(y_shape), attrs, true);
  const Tensor y_abs = run1("AveragePool", {fed(abs_of(x))}, out_f32(y_shape), attrs, true);
  attrs["input_shape"] = x_shape;
  const Tensor dx = run1("AveragePoolGrad", {fed(dy)}, out_f32(x_shape), attrs);
  EXPECT_NEAR(dot(dx, x), dot(dy, y), 1e-5 * dot(abs_of(dy), y_abs));
}

const PoolCase kPadded{2, 3, {7, 8}, {3, 3}, {2, 2}, {1, 0, 1, 2}, {}};
const PoolCase kCeil{2, 3, {8, 7}, {3, 2}, {2, 2}, {0, 1, 0, 0}, {}, true};

TEST(AveragePoolGrad, ExcludePad) { check_average_pool_adjoint(kPadded, false); }
TEST(AveragePoolGrad, IncludePad) { check_average_pool_adjoint(kPadded, true); }
TEST(AveragePoolGrad, CeilModeExcludePad) { check_average_pool_adjoint(kCeil, false); }
TEST(AveragePoolGrad, OneDimensional) {
  check_average_pool_adjoint({2, 4, {13}, {4}, {3}, {2, 1}, {}}, true);
}

// MaxPoolGrad by its definition, up to 2 spatial dims (1-D as height 1): each dY element goes to
// the first maximum of its window in row-major order, padding excluded.
std::vector<double> max_pool_grad_loop(const PoolCase& p, const Tensor& x, const Tensor& dy) {
  const bool one_d = p.in.size() == 1;
  const int64_t h = one_d ? 1 : p.in[0], w = p.in.back();
  const Dims y = pool_out(p);
  const int64_t oh = one_d ? 1 : y[2], ow = y.back();
  auto dim = [&](const Dims& v, int axis, int64_t one) {
    return one_d && axis == 0 ? one : v[one_d ? 0 : axis];
  };
  const int64_t kh = dim(p.kernel, 0, 1), kw = dim(p.kernel, 1, 1);
  const int64_t sh = dim(p.strides, 0, 1), sw = dim(p.strides, 1, 1);
  const Dims dil = p.dilations.empty() ? Dims(p.in.size(), 1) : p.dilations;
  const int64_t dh = dim(dil, 0, 1), dw = dim(dil, 1, 1);
  const int64_t ph = one_d ? 0 : p.pads[0], pw = one_d ? p.pads[0] : p.pads[1];
  std::vector<double> dx(numel(pool_x_shape(p)), 0.0);
  for (int64_t plane = 0; plane < p.n * p.c; ++plane)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        int64_t best = -1;
        for (int64_t a = 0; a < kh; ++a)
          for (int64_t b = 0; b < kw; ++b) {
            const int64_t r = i * sh - ph + a * dh, c = j * sw - pw + b * dw;
            if (r < 0 || r >= h || c < 0 || c >= w) continue;
            const int64_t at = (plane * h + r) * w + c;
            if (best < 0 || x.as<float>()[at] > x.as<float>()[best]) best = at;
          }
        if (best >= 0) dx[best] += dy.as<float>()[(plane * oh + i) * ow + j];
      }
  return dx;
}

// X from {-3, -2, -1}: ties in every window, and padding (were it taken as 0) would win. The
// kernel adds dY elements to a cell in the same order as the loop: 1e-6 absolute covers float
// against double sums of a few O(1) values.
void check_max_pool_grad(const PoolCase& p) {
  const Dims x_shape = pool_x_shape(p), y_shape = pool_out(p);
  Tensor x = uniform(x_shape, 41, 0.f, 3.f);
  for (int64_t i = 0; i < x.type.numel(); ++i)
    x.as<float>()[i] = -1.f - std::floor(x.as<float>()[i]);
  const Tensor dy = uniform(y_shape, 42);
  const Tensor dx = run1("MaxPoolGrad", {fed(dy), fed(x)}, out_f32(x_shape), pool_attrs(p));
  expect_close(dx, max_pool_grad_loop(p, x, dy), 1e-6, 0);
}

TEST(MaxPoolGrad, PaddedStrided) { check_max_pool_grad(kPadded); }
TEST(MaxPoolGrad, CeilMode) { check_max_pool_grad(kCeil); }
TEST(MaxPoolGrad, OverlappingDilated) {
  check_max_pool_grad({1, 2, {9, 9}, {3, 2}, {1, 1}, {1, 1, 1, 0}, {2, 3}});
}
TEST(MaxPoolGrad, OneDimensional) { check_max_pool_grad({2, 3, {11}, {3}, {2}, {1, 1}, {}}); }
// 8 x 16 planes of 16 x 16: planes in parallel.
TEST(MaxPoolGrad, ParallelPlanes) {
  check_max_pool_grad({8, 16, {16, 16}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {}});
}

// ---------------------------------------------------------------------------------------------
// GatherGrad

// data_shape [outer..., n, inner...] with the indices at `axis`; dY rows added in index order
// in float, exactly as the kernel promises: compared exactly.
template <class I>
void check_gather_grad(const Dims& data, int64_t axis, const Dims& idx_shape,
                       const std::vector<I>& idx, int threads) {
  const size_t a = static_cast<size_t>(axis);
  Dims y_shape(data.begin(), data.begin() + axis);
  y_shape.insert(y_shape.end(), idx_shape.begin(), idx_shape.end());
  y_shape.insert(y_shape.end(), data.begin() + axis + 1, data.end());
  const int64_t outer = numel(Dims(data.begin(), data.begin() + axis)), n = data[a];
  const int64_t inner = numel(Dims(data.begin() + axis + 1, data.end()));
  const int64_t count = static_cast<int64_t>(idx.size());
  const Tensor dy = uniform(y_shape, 51);
  std::vector<float> want(numel(data), 0.f);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < count; ++i) {
      const int64_t k = idx[i] < 0 ? idx[i] + n : idx[i];
      for (int64_t j = 0; j < inner; ++j)
        want[(o * n + k) * inner + j] += dy.as<float>()[(o * count + i) * inner + j];
    }
  const Tensor dd = run1("GatherGrad", {fed(dy), fed(ints<I>(idx_shape, idx))}, out_f32(data),
                         {{"axis", axis}, {"data_shape", data}}, false, threads);
  EXPECT_EQ(values(dd), want);
}

TEST(GatherGrad, RepeatedAndNegativeIndicesAxis1) {
  check_gather_grad<int64_t>({5, 4, 3}, 1, {3, 2}, {0, -1, 2, 0, -4, 3}, 2);
}
TEST(GatherGrad, Int32IndicesAxis0) {
  check_gather_grad<int32_t>({6, 5}, 0, {4}, {5, -1, 0, 2}, 2);
}
// An embedding table [300, 130], 200 token ids with repeats: column blocks in parallel.
TEST(GatherGrad, EmbeddingParallel) {
  std::vector<int64_t> idx(200);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>((i * 37) % 50) - 20;
  check_gather_grad<int64_t>({300, 130}, 0, {8, 25}, idx, 3);
}

TEST(GatherGrad, IndexOutOfRangeIsAUserError) {
  const Tensor dy = uniform({2, 3}, 52);
  EXPECT_THROW(run1("GatherGrad", {fed(dy), fed(ints<int64_t>({2}, {1, 4}))}, out_f32({4, 3}),
                    {{"data_shape", Dims{4, 3}}}),
               UserError);
}

// ---------------------------------------------------------------------------------------------
// SoftmaxCrossEntropy and its gradient

// Logits [..., C] on [-3, 3] with 60 added to the first row (a naive exp overflows there);
// targets given per row. Loss and dLogits by the definitions, in double.
void check_softmax_cross_entropy(const Dims& shape, const std::vector<int64_t>& target,
                                 int64_t ignore_index, int threads) {
  const int64_t c = shape.back(), rows = numel(shape) / c;
  Tensor x = uniform(shape, 61, -3.f, 3.f);
  for (int64_t j = 0; j < c; ++j) x.as<float>()[j] += 60.f;
  const float scale = 0.25f, dloss = 1.5f;
  double loss = 0;
  std::vector<double> dx(numel(shape), 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    if (target[t] == ignore_index) continue;
    const float* row = x.as<float>() + t * c;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < c; ++j) m = std::max(m, double(row[j]));
    for (int64_t j = 0; j < c; ++j) s += std::exp(row[j] - m);
    loss += m + std::log(s) - row[target[t]];
    for (int64_t j = 0; j < c; ++j)
      dx[t * c + j] = dloss * scale * (std::exp(row[j] - m) / s - (j == target[t] ? 1 : 0));
  }
  const Dims t_shape(shape.begin(), shape.end() - 1);
  std::map<std::string, AttrValue> attrs;
  if (ignore_index != -100) attrs["ignore_index"] = ignore_index;
  const Tensor have_loss =
      run1("SoftmaxCrossEntropy", {fed(x), fed(ints<int64_t>(t_shape, target)), fed(scalar(scale))},
           out_f32({}), attrs, false, threads);
  // exp_poly's 2e-7 relative error and float logits: 1e-6 relative on a sum of O(1) terms.
  expect_close(have_loss, {scale * loss}, 1e-6, 1e-6, "Loss");
  const Tensor have_dx =
      run1("SoftmaxCrossEntropyGrad",
           {fed(scalar(dloss)), fed(x), fed(ints<int64_t>(t_shape, target)), fed(scalar(scale))},
           out_f32(shape), attrs, false, threads);
  // Probabilities to exp_poly's accuracy, times dLoss * Scale < 1: 1e-7 absolute, 1e-6 relative.
  expect_close(have_dx, dx, 1e-7, 1e-6, "dLogits");
}

TEST(SoftmaxCrossEntropy, BatchByClasses) {
  check_softmax_cross_entropy({5, 7}, {3, -100, 0, 6, -100}, -100, 2);
}
TEST(SoftmaxCrossEntropy, BatchSequenceVocabulary) {
  check_softmax_cross_entropy({2, 3, 19}, {4, 18, -100, 0, -100, 7}, -100, 2);
}
TEST(SoftmaxCrossEntropy, IgnoreIndexInsideTheClasses) {
  check_softmax_cross_entropy({4, 6}, {2, 1, 2, 5}, 2, 2);
}
// 64 rows of 1000 classes on 3 threads: rows in parallel, the loss summed in row order.
TEST(SoftmaxCrossEntropy, ParallelRows) {
  std::vector<int64_t> target(64);
  for (size_t t = 0; t < target.size(); ++t)
    target[t] = t % 9 == 4 ? -100 : static_cast<int64_t>(t * 97 % 1000);
  check_softmax_cross_entropy({8, 8, 1000}, target, -100, 3);
}

TEST(SoftmaxCrossEntropy, TargetOutOfRangeIsAUserError) {
  EXPECT_THROW(run1("SoftmaxCrossEntropy",
                    {fed(uniform({2, 3}, 62)), fed(ints<int64_t>({2}, {0, 3})), fed(scalar(1.f))},
                    out_f32({})),
               UserError);
}

// ---------------------------------------------------------------------------------------------
// Pad (constant mode)

// out[i] = in[i - begin] inside the input, else the constant: by coordinates, exactly.
template <class T>
std::vector<T> pad_loop(const Tensor& x, const Dims& out, const Dims& begin, T value) {
  const Dims& in = x.type.shape;
  std::vector<T> y(numel(out));
  for (int64_t flat = 0; flat < numel(out); ++flat) {
    int64_t rest = flat, src = 0, stride = 1;
    bool inside = true;
    for (size_t d = out.size(); d-- > 0;) {
      const int64_t i = rest % out[d] - begin[d];
      rest /= out[d];
      inside = inside && i >= 0 && i < in[d];
      src += i * stride;
      stride *= in[d];
    }
    y[flat] = inside ? x.as<T>()[src] : value;
  }
  return y;
}

TEST(Pad, AsymmetricPadsAndConstantValue) {
  const Tensor x = uniform({2, 3, 4}, 71);
  const Dims pads{0, 1, -1, 1, 0, 2}, out{3, 4, 5};  // begins (0, 1, -1), ends (1, 0, 2)
  const Tensor y = run1("Pad", {fed(x), constant(ints<int64_t>({6}, pads)), constant(scalar(1.5f))},
                        out_f32(out), {}, true);
  EXPECT_EQ(values(y), pad_loop<float>(x, out, {0, 1, -1}, 1.5f));
}

TEST(Pad, ZeroByDefaultAndCropping) {
  const Tensor x = uniform({4, 6}, 72);
  const Dims pads{-1, 2, 1, -3}, out{4, 5};
  const Tensor y =
      run1("Pad", {fed(x), constant(ints<int64_t>({4}, pads))}, out_f32(out), {}, true);
  EXPECT_EQ(values(y), pad_loop<float>(x, out, {-1, 2}, 0.f));
}

// int64 data, the constant fed at run time, and opset 18's axes (negative) naming the dims.
TEST(Pad, Int64WithAxesAndRunTimeValue) {
  const Tensor x = ints<int64_t>({2, 3, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  const Dims out{2, 5, 3};
  const Tensor y = run1("Pad",
                        {fed(x), constant(ints<int64_t>({4}, {2, 0, 0, 1})),
                         fed(ints<int64_t>({}, {-9})), constant(ints<int64_t>({2}, {1, -1}))},
                        {DType::kInt64, out}, {}, true);
  const std::vector<int64_t> want = pad_loop<int64_t>(x, out, {0, 2, 0}, -9);
  EXPECT_EQ(std::vector<int64_t>(y.as<int64_t>(), y.as<int64_t>() + y.type.numel()), want);
}

// 16 x 64 x 64 rows padded by one on each side: rows in parallel.
TEST(Pad, ParallelRows) {
  const Tensor x = uniform({16, 64, 64}, 73);
  const Dims out{16, 66, 66};
  const Tensor y = run1("Pad", {fed(x), constant(ints<int64_t>({6}, {0, 1, 1, 0, 1, 1}))},
                        out_f32(out), {}, true, 3);
  EXPECT_EQ(values(y), pad_loop<float>(x, out, {0, 1, 1}, 0.f));
}

// ---------------------------------------------------------------------------------------------
// Every factory declines float64 (nullptr, not a crash) where it accepts the same float32 node.

Tensor as_float64(const Tensor& t) {
  if (t.type.dtype != DType::kFloat32) return t;
  Tensor d = make_tensor(DType::kFloat64, t.type.shape);
  for (int64_t i = 0; i < t.type.numel(); ++i) d.as<double>()[i] = t.as<float>()[i];
  return d;
}

struct FactoryCase {
  std::string op;
  std::vector<Arg> args;
  std::vector<TensorType> outs;
  std::map<std::string, AttrValue> attrs;
  bool onnx = false;
};

// Whether the registered factory makes a kernel for the case, with float32 or float64 tensors.
bool factory_accepts(const FactoryCase& c, bool float64) {
  std::vector<Arg> args = c.args;
  std::vector<TensorType> outs = c.outs;
  if (float64) {
    for (Arg& a : args) a.data = as_float64(a.data);
    for (TensorType& t : outs)
      if (t.dtype == DType::kFloat32) t.dtype = DType::kFloat64;
  }
  const OneNode one = build(c.op, args, outs, c.attrs, c.onnx);
  const Node& node = one.graph.nodes[0];
  CpuBackend backend(2);
  KernelSpec spec{one.graph, node, {}, {}, backend.cpu_context()};
  for (ValueId v : node.inputs)
    spec.inputs.push_back(v == kNoValue ? TensorType{} : one.graph.value(v).type);
  for (ValueId v : node.outputs)
    spec.outputs.push_back(v == kNoValue ? TensorType{} : one.graph.value(v).type);
  const KernelFactory f =
      cpu_kernel_factory(c.onnx ? c.op : std::string(kPipetrainDomain) + "::" + c.op);
  EXPECT_NE(f, nullptr) << c.op;
  return f && f(spec) != nullptr;
}

TEST(GradFactories, DeclineFloat64) {
  const Tensor a = uniform({2, 3, 4, 4}, 81), vec = uniform({4}, 82);
  const TensorType t4 = out_f32({2, 3, 4, 4});
  const Dims x{2, 4, 6, 6}, w{6, 2, 3, 3}, y{2, 6, 4, 4};
  const std::map<std::string, AttrValue> pool = {{"kernel_shape", Dims{3, 3}}};
  const std::vector<FactoryCase> cases = {
      {"ReluGrad", {fed(a), fed(a)}, {t4}, {}},
      {"ClipGrad", {fed(a), fed(a), constant(scalar(0.f)), omitted()}, {t4}, {}},
      {"ErfGrad", {fed(a), fed(a)}, {t4}, {}},
      {"GeluGrad", {fed(a), fed(a)}, {t4}, {}},
      {"SoftmaxGrad", {fed(a), fed(a)}, {t4}, {}},
      {"LogSoftmaxGrad", {fed(a), fed(a)}, {t4}, {{"axis", int64_t{1}}}},
      {"LayerNormGrad",
       {fed(a), fed(a), fed(vec), fed(uniform({2, 3, 4, 1}, 83)), fed(uniform({2, 3, 4, 1}, 84))},
       {t4, out_f32({4}), out_f32({4})},
       {}},
      {"BatchNormGrad", {fed(a), fed(a), fed(uniform({3}, 85))}, {t4, out_f32({3}), kOmitted}, {}},
      {"ConvGradInput",
       {fed(uniform(y, 86)), fed(uniform(w, 87))},
       {out_f32(x)},
       {{"group", int64_t{2}}, {"input_shape", x}}},
      {"ConvGradWeight",
       {fed(uniform(y, 86)), fed(uniform(x, 88))},
       {out_f32(w)},
       {{"group", int64_t{2}}, {"weight_shape", w}}},
      {"MaxPoolGrad", {fed(uniform({2, 4, 4, 4}, 89)), fed(uniform(x, 88))}, {out_f32(x)}, pool},
      {"AveragePoolGrad",
       {fed(uniform({2, 4, 4, 4}, 89))},
       {out_f32(x)},
       {{"kernel_shape", Dims{3, 3}}, {"input_shape", x}}},
      {"GatherGrad",
       {fed(uniform({2, 5}, 90)), fed(ints<int64_t>({2}, {0, 1}))},
       {out_f32({3, 5})},
       {{"data_shape", Dims{3, 5}}}},
      {"SoftmaxCrossEntropy",
       {fed(uniform({3, 5}, 91)), fed(ints<int64_t>({3}, {0, 1, 2})), fed(scalar(1.f))},
       {out_f32({})},
       {}},
      {"SoftmaxCrossEntropyGrad",
       {fed(scalar(1.f)), fed(uniform({3, 5}, 91)), fed(ints<int64_t>({3}, {0, 1, 2})),
        fed(scalar(1.f))},
       {out_f32({3, 5})},
       {}},
      {"Pad", {fed(vec), constant(ints<int64_t>({2}, {1, 1}))}, {out_f32({6})}, {}, true},
  };
  for (const FactoryCase& c : cases) {
    EXPECT_TRUE(factory_accepts(c, false)) << c.op << " declines float32";
    EXPECT_FALSE(factory_accepts(c, true)) << c.op << " accepts float64";
  }
}

// Edge-mode Pad is declined rather than run as constant.
TEST(GradFactories, PadDeclinesOtherModes) {
  const FactoryCase c{"Pad",
                      {fed(uniform({4}, 92)), constant(ints<int64_t>({2}, {1, 1}))},
                      {out_f32({6})},
                      {{"mode", std::string("edge")}},
                      true};
  EXPECT_FALSE(factory_accepts(c, false));
}

}  // namespace
}  // namespace pt
