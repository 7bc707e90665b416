// exec/cpu/elementwise_grad.cc: the backward half of the element-wise family, pipetrain-domain
// ops (core/pipetrain_ops.h has their math): ReluGrad and ClipGrad on oneDNN's eltwise backward
// (small ones on a loop of its bits), ErfGrad, GeluGrad (and ClipGrad with a bound known only at
// run time) as loops (softmax.cc has SoftmaxGrad and LogSoftmaxGrad). dY, the saved tensor (X or
// Y) and dX share one float32 shape.
#include <oneapi/dnnl/dnnl.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dnnl_kernel.h"
#include "exec/cpu/dnnl_util.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"
#include "exec/cpu/vector_clones.h"

namespace pt::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements below which a loop stays on one thread

// (dY, saved, ...) -> dX, inputs 0 and 1 present, all float32 of one shape.
bool same_float_shapes(const KernelSpec& s) {
  return s.inputs.size() >= 2 && s.has_input(0) && s.has_input(1) && single_output(s) &&
         float_only(s) && s.inputs[1] == s.inputs[0] && s.outputs[0] == s.inputs[0];
}

// dX = dY * alg'(saved) on oneDNN's eltwise backward; `saved` (input 1) is bound as the forward's
// src or dst (saved_arg). The forward primitive_desc is the hint oneDNN asks for.
std::unique_ptr<Kernel> make_eltwise_grad(const KernelSpec& s, dnnl::algorithm alg,
                                          int saved_arg, float alpha = 0.f, float beta = 0.f) {
  const int threads = elementwise_threads(s.inputs[0].numel(), s.cpu->threads);
  return build_or_null(s, [&]() -> std::unique_ptr<Kernel> {
    auto k = std::make_unique<DnnlKernel>(*s.cpu, threads);
    const memory::desc md = plain_desc(s.inputs[0]);
    const dnnl::eltwise_forward::primitive_desc hint(
        {dnnl::prop_kind::forward_training, alg, md, alpha, beta}, k->engine());
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::eltwise_backward::primitive_desc pd({alg, md, md, alpha, beta}, attr,
                                                    k->engine(), hint);
    k->add_step(dnnl::eltwise_backward(pd), pd.scratchpad_desc(),
                {{DNNL_ARG_DIFF_DST, md, {Place::kInput, 0}},
                 {saved_arg, md, {Place::kInput, 1}},
                 {DNNL_ARG_DIFF_SRC, md, {Place::kOutput, 0}}});
    return k;
  }, threads);
}

// dx[i] = dy[i] * 2/sqrt(pi) * exp(-x[i]^2) over [begin, end); dx may be dy or x.
PT_VECTOR_CLONES void erf_grad_loop(const float* dy, const float* x, float* dx, int64_t begin, int64_t end) {
  constexpr float k2OverSqrtPi = 1.12837916709551257f;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) dx[i] = dy[i] * k2OverSqrtPi * exp_poly(-x[i] * x[i]);
}

// dx[i] = dy[i] * gelu'(x[i]) over [begin, end), gelu the erf or the tanh form (lane_math.h).
template <bool Tanh>
PT_VECTOR_CLONES void gelu_grad_loop(const float* dy, const float* x, float* dx, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) dx[i] = dy[i] * (Tanh ? gelu_tanh_grad(x[i]) : gelu_erf_grad(x[i]));
}

// dX = dY * f'(X) by a loop over blocks of elements (erf_grad_loop, gelu_grad_loop): ErfGrad,
// exp by the vectorisable exp_poly (relative error below 2e-7; it returns about 1e-38 instead of
// underflowing for |X| > 9.3), and GeluGrad, the forward's own math (oneDNN 2.6's gelu backward
// took twice its time).
class GradLoop final : public Kernel {
 public:
  using Loop = void (*)(const float*, const float*, float*, int64_t, int64_t);
  GradLoop(Loop loop, int64_t n, int threads) : loop_(loop), n_(n), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* dy = in[0].as<const float>();
    const float* x = in[1].as<const float>();
    float* dx = out[0].as<float>();
    for_blocks(n_, threads_, kParallelMin, [&](int64_t begin, int64_t end) { loop_(dy, x, dx, begin, end); });
  }

 private:
  Loop loop_;
  int64_t n_;
  int threads_;
};

// One ClipGrad bound: a value fixed at creation (given constant, or infinite when omitted), or
// the scalar input `input` read in run().
struct ClipGradBound {
  float value = 0.f;
  int input = -1;
  float get(std::span<const Buffer> in) const {
    return input < 0 ? value : in[static_cast<size_t>(input)].as<const float>()[0];
  }
};

// ClipGrad with a bound not known until run(): dX = dY where lo < X < hi, else 0.
class ClipGradLoop final : public Kernel {
 public:
  ClipGradLoop(ClipGradBound lo, ClipGradBound hi, int64_t n, int threads)
      : lo_(lo), hi_(hi), n_(n), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float lo = lo_.get(in), hi = hi_.get(in);
    const float* dy = in[0].as<const float>();
    const float* x = in[1].as<const float>();
    float* dx = out[0].as<float>();
    parallel_for(n_, threads_, n_ >= kParallelMin, [&](int64_t i) { dx[i] = lo < x[i] && x[i] < hi ? dy[i] : 0.f; });
  }

 private:
  ClipGradBound lo_, hi_;
  int64_t n_;
  int threads_;
};

// Bound k of ClipGrad (2 = min, 3 = max): `fallback` when omitted; nullopt unless a float32
// scalar.
std::optional<ClipGradBound> clip_grad_bound(const KernelSpec& s, size_t k, float fallback) {
  if (!s.has_input(k)) return ClipGradBound{fallback};
  if (s.inputs[k].dtype != DType::kFloat32 || s.inputs[k].numel() != 1) return std::nullopt;
  const Tensor* c = s.constant(k);
  return c ? ClipGradBound{c->as<float>()[0]} : ClipGradBound{0.f, static_cast<int>(k)};
}

// dx[i] = dy[i] * d[i], d 1 or 0 as oneDNN's eltwise backward takes them: Relu's (from Y, alpha 0)
// 1 unless y <= 0 (a NaN y passes dY), clip_v2's (from X) 1 where lo < x < hi. A product, not a
// select: dY * 0 keeps the sign of dY and makes a NaN or an infinite dY NaN, as oneDNN's does.
template <bool kRelu>
PT_VECTOR_CLONES void mask_grad_loop(const float* dy, const float* s, float* dx, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) {
    const bool pass = kRelu ? !(s[i] <= 0.f) : lo < s[i] && s[i] < hi;
    dx[i] = dy[i] * (pass ? 1.f : 0.f);
  }
}

// ReluGrad, or ClipGrad with constant bounds, below kParallelMin elements: one thread, no oneDNN
// call (~0.8 us a call whatever its size), the eltwise backward's bits.
template <bool kRelu>
class SmallMaskGrad final : public Kernel {
 public:
  SmallMaskGrad(int64_t n, float lo, float hi) : n_(n), lo_(lo), hi_(hi) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    mask_grad_loop<kRelu>(in[0].as<const float>(), in[1].as<const float>(), out[0].as<float>(), n_, lo_, hi_);
  }

 private:
  int64_t n_;
  float lo_, hi_;
};

}  // namespace

// ReluGrad(dY, Y): dX = dY where Y > 0, else 0 (relu's backward from its dst, alpha 0).
std::unique_ptr<Kernel> make_relu_grad(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !same_float_shapes(s)) return nullptr;
  const int64_t n = s.inputs[0].numel();
  if (n < kParallelMin) return std::make_unique<SmallMaskGrad<true>>(n, 0.f, 0.f);
  return make_eltwise_grad(s, dnnl::algorithm::eltwise_relu_use_dst_for_bwd, DNNL_ARG_DST);
}

// ClipGrad(dY, X, min?, max?): dX = dY where min < X < max, else 0. Constant (or omitted) bounds
// run as oneDNN's clip_v2 backward, whose mask is the same strict one (below kParallelMin
// elements a loop of its bits); a bound fed at run time as a loop.
std::unique_ptr<Kernel> make_clip_grad(const KernelSpec& s) {
  if (s.inputs.size() < 2 || s.inputs.size() > 4 || !same_float_shapes(s)) return nullptr;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const auto lo = clip_grad_bound(s, 2, -kInf), hi = clip_grad_bound(s, 3, kInf);
  if (!lo || !hi) return nullptr;
  if (lo->input < 0 && hi->input < 0) {
    if (s.inputs[0].numel() < kParallelMin)
      return std::make_unique<SmallMaskGrad<false>>(s.inputs[0].numel(), lo->value, hi->value);
    return make_eltwise_grad(s, dnnl::algorithm::eltwise_clip_v2, DNNL_ARG_SRC, lo->value,
                             hi->value);
  }
  return std::make_unique<ClipGradLoop>(*lo, *hi, s.inputs[0].numel(), s.cpu->threads);
}

// ErfGrad(dY, X): dX = dY * 2/sqrt(pi) * exp(-X^2).
std::unique_ptr<Kernel> make_erf_grad(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !same_float_shapes(s)) return nullptr;
  return std::make_unique<GradLoop>(erf_grad_loop, s.inputs[0].numel(), s.cpu->threads);
}

// GeluGrad(dY, X): dX = dY * gelu'(X), approximate "none" (gelu_erf) or "tanh" (gelu_tanh), from
// the forward's src, as a loop (GradLoop above).
std::unique_ptr<Kernel> make_gelu_grad(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !same_float_shapes(s)) return nullptr;
  const std::string approximate = s.node.attr_string("approximate", "none");
  const int64_t n = s.inputs[0].numel();
  if (approximate == "none") return std::make_unique<GradLoop>(gelu_grad_loop<false>, n, s.cpu->threads);
  if (approximate == "tanh") return std::make_unique<GradLoop>(gelu_grad_loop<true>, n, s.cpu->threads);
  return nullptr;
}

}  // namespace pt::cpu
