// exec/cpu/elementwise_grad.cc: the backward half of the element-wise family, pipetrain-domain
// ops (core/pipetrain_ops.h has their math): ReluGrad, ClipGrad and GeluGrad on oneDNN's eltwise
// backward, ErfGrad (and ClipGrad with a bound known only at run time) as loops, SoftmaxGrad and
// LogSoftmaxGrad as a row loop along the last axis and on oneDNN's softmax_v2 backward along any
// other. dY, the saved tensor (X or Y) and dX share one
// float32 shape.
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

// ErfGrad: dX = dY * 2/sqrt(pi) * exp(-X^2), exp by the vectorisable exp_poly (relative error
// below 2e-7; it returns about 1e-38 instead of underflowing for |X| > 9.3).
class ErfGrad final : public Kernel {
 public:
  ErfGrad(int64_t n, int threads) : n_(n), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* dy = in[0].as<const float>();
    const float* x = in[1].as<const float>();
    float* dx = out[0].as<float>();
    for_blocks(n_, threads_, kParallelMin,
               [&](int64_t begin, int64_t end) { erf_grad_loop(dy, x, dx, begin, end); });
  }

 private:
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
#pragma omp parallel for num_threads(threads_) if (n_ >= kParallelMin)
    for (int64_t i = 0; i < n_; ++i) dx[i] = lo < x[i] && x[i] < hi ? dy[i] : 0.f;
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

// Rows [r0, r1) of SoftmaxGradRows, n elements each.
PT_VECTOR_CLONES void softmax_grad_rows(const float* dy, const float* y, float* dx, int64_t r0,
                                        int64_t r1, int64_t n, bool log) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* d = dy + r * n;
    const float* p = y + r * n;
    float* g = dx + r * n;
    if (log) {  // dX = dY - exp(Y) * sum(dY)
      const float s = static_cast<float>(lane_sum(d, n));
      for (int64_t k = 0; k < n; ++k) g[k] = d[k] - std::exp(p[k]) * s;
    } else {  // dX = Y * (dY - sum(dY * Y))
      const float s = static_cast<float>(lane_dot(d, p, n));
      for (int64_t k = 0; k < n; ++k) g[k] = p[k] * (d[k] - s);
    }
  }
}

// SoftmaxGrad or LogSoftmaxGrad along the last axis, one row of n at a time: oneDNN 2.6 has
// no JIT softmax backward below AVX-512, and its reference one took 4% of a transformer's step
// (the attention probabilities' gradient). Blocks of rows run in parallel; each row's sum in
// lanes.
class SoftmaxGradRows final : public Kernel {
 public:
  SoftmaxGradRows(int64_t rows, int64_t n, bool log, int threads)
      : rows_(rows), n_(n), log_(log), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* dy = in[0].as<const float>();
    const float* y = in[1].as<const float>();
    float* dx = out[0].as<float>();
    const int64_t n = n_, block = std::max<int64_t>(1, kVectorBlock / std::max<int64_t>(n, 1));
    const int64_t blocks = (rows_ + block - 1) / block;
#pragma omp parallel for num_threads(threads_) if (rows_ * n >= kParallelMin)
    for (int64_t b = 0; b < blocks; ++b)
      softmax_grad_rows(dy, y, dx, b * block, std::min(rows_, (b + 1) * block), n, log_);
  }

 private:
  int64_t rows_, n_;
  bool log_;
  int threads_;
};

// SoftmaxGrad (softmax_accurate) or LogSoftmaxGrad (softmax_log) along `axis` (default -1):
// DIFF_DST = dY (input 0), DST = Y (input 1). The last axis runs as SoftmaxGradRows, any other on
// oneDNN's softmax_v2 backward.
std::unique_ptr<Kernel> make_softmax_grad_like(const KernelSpec& s, dnnl::algorithm alg) {
  if (s.inputs.size() != 2 || !same_float_shapes(s)) return nullptr;
  const int64_t rank = static_cast<int64_t>(s.inputs[0].shape.size());
  int64_t axis = s.node.attr_int("axis", -1);
  if (axis < 0) axis += rank;
  if (rank == 0 || axis < 0 || axis >= rank) return nullptr;
  if (axis == rank - 1) {
    const int64_t n = s.inputs[0].shape.back();
    return std::make_unique<SoftmaxGradRows>(n > 0 ? s.inputs[0].numel() / n : 0, n,
                                             alg == dnnl::algorithm::softmax_log, s.cpu->threads);
  }
  return build_or_null(s, [&]() -> std::unique_ptr<Kernel> {
    auto k = std::make_unique<DnnlKernel>(*s.cpu);
    const memory::desc md = plain_desc(s.inputs[0]);
    const int ax = static_cast<int>(axis);
    const dnnl::softmax_v2_forward::primitive_desc hint(
        {dnnl::prop_kind::forward_training, alg, md, md, ax}, k->engine());
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::softmax_v2_backward::primitive_desc pd({alg, md, md, md, ax}, attr, k->engine(),
                                                       hint);
    k->add_step(dnnl::softmax_v2_backward(pd), pd.scratchpad_desc(),
                {{DNNL_ARG_DIFF_DST, md, {Place::kInput, 0}},
                 {DNNL_ARG_DST, md, {Place::kInput, 1}},
                 {DNNL_ARG_DIFF_SRC, md, {Place::kOutput, 0}}});
    return k;
  });
}

}  // namespace

// ReluGrad(dY, Y): dX = dY where Y > 0, else 0 (relu's backward from its dst, alpha 0).
std::unique_ptr<Kernel> make_relu_grad(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !same_float_shapes(s)) return nullptr;
  return make_eltwise_grad(s, dnnl::algorithm::eltwise_relu_use_dst_for_bwd, DNNL_ARG_DST);
}

// ClipGrad(dY, X, min?, max?): dX = dY where min < X < max, else 0. Constant (or omitted) bounds
// run as oneDNN's clip_v2 backward, whose mask is the same strict one; a bound fed at run time
// as a loop.
std::unique_ptr<Kernel> make_clip_grad(const KernelSpec& s) {
  if (s.inputs.size() < 2 || s.inputs.size() > 4 || !same_float_shapes(s)) return nullptr;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const auto lo = clip_grad_bound(s, 2, -kInf), hi = clip_grad_bound(s, 3, kInf);
  if (!lo || !hi) return nullptr;
  if (lo->input < 0 && hi->input < 0)
    return make_eltwise_grad(s, dnnl::algorithm::eltwise_clip_v2, DNNL_ARG_SRC, lo->value,
                             hi->value);
  return std::make_unique<ClipGradLoop>(*lo, *hi, s.inputs[0].numel(), s.cpu->threads);
}

// ErfGrad(dY, X): dX = dY * 2/sqrt(pi) * exp(-X^2).
std::unique_ptr<Kernel> make_erf_grad(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !same_float_shapes(s)) return nullptr;
  return std::make_unique<ErfGrad>(s.inputs[0].numel(), s.cpu->threads);
}

// GeluGrad(dY, X): dX = dY * gelu'(X), approximate "none" (gelu_erf) or "tanh" (gelu_tanh), from
// the forward's src.
std::unique_ptr<Kernel> make_gelu_grad(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !same_float_shapes(s)) return nullptr;
  const std::string approximate = s.node.attr_string("approximate", "none");
  if (approximate == "none")
    return make_eltwise_grad(s, dnnl::algorithm::eltwise_gelu_erf, DNNL_ARG_SRC);
  if (approximate == "tanh")
    return make_eltwise_grad(s, dnnl::algorithm::eltwise_gelu_tanh, DNNL_ARG_SRC);
  return nullptr;
}

// SoftmaxGrad(dY, Y): dX = Y * (dY - sum_axis(dY * Y)).
std::unique_ptr<Kernel> make_softmax_grad(const KernelSpec& s) {
  return make_softmax_grad_like(s, dnnl::algorithm::softmax_accurate);
}

// LogSoftmaxGrad(dY, Y): dX = dY - exp(Y) * sum_axis(dY).
std::unique_ptr<Kernel> make_log_softmax_grad(const KernelSpec& s) {
  return make_softmax_grad_like(s, dnnl::algorithm::softmax_log);
}

}  // namespace pt::cpu
