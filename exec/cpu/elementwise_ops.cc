// exec/cpu/elementwise_ops.cc: the unary half of the element-wise family (see cpu_kernels.h):
// activations, Erf, Neg, Clip, Cast and Dropout, input and output of one shape. fp32 activations
// run on oneDNN's eltwise primitive (small Relus and Clips on a loop of its bits); the rest are
// plain loops. The broadcasting half is in elementwise.cc.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dispatch.h"
#include "exec/cpu/dnnl_kernel.h"
#include "exec/cpu/dnnl_util.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"
#include "exec/cpu/vector_clones.h"

namespace pt::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements below which a loop stays on one thread

// ---- dtype dispatch (exec/cpu/dispatch.h) ----------------------------------------------

using ClipTypes = TypeList<float, double, int32_t, int64_t, int8_t, uint8_t>;
using NegTypes = TypeList<double, int32_t, int64_t, int8_t>;  // fp32 goes to oneDNN
using CastTypes = TypeList<float, double, int32_t, int64_t, bool>;
using AbsTypes = TypeList<float, double, int32_t, int64_t, int8_t>;
using FloatTypes = TypeList<float, double>;  // Floor, Ceil, Exp

// ---- kernels --------------------------------------------------------------------------------

struct ErfOp {
  float operator()(float x) const { return erf_poly(x); }
};
struct GeluErfOp {
  float operator()(float x) const { return gelu_erf(x); }
};
struct GeluTanhOp {
  float operator()(float x) const { return gelu_tanh(x); }
};
struct NegOp {
  template <class T> T operator()(T x) const { return -x; }
};
struct IsNaNOp {
  bool operator()(float x) const { return x != x; }
};
struct SinOp {
  float operator()(float x) const { return std::sin(x); }
};
struct CosOp {
  float operator()(float x) const { return std::cos(x); }
};
struct AbsOp {
  template <class T> T operator()(T x) const { return x < T(0) ? T(-x) : x; }
};
struct FloorOp {
  template <class T> T operator()(T x) const { return std::floor(x); }
};
struct CeilOp {
  template <class T> T operator()(T x) const { return std::ceil(x); }
};
struct ExpOp {
  template <class T> T operator()(T x) const { return std::exp(x); }
};
struct NotOp {
  bool operator()(bool x) const { return !x; }
};

// y[i] = Op(x[i]) over [begin, end); y may be x itself.
template <class T, class Op, class Out>
PT_VECTOR_CLONES void unary_loop(const T* x, Out* y, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) y[i] = Op{}(x[i]);
}

// y[i] = Op(x[i]) over n elements; y is of type Out (T unless the op says otherwise).
template <class T, class Op, class Out = T>
class PlainUnary final : public Kernel {
 public:
  PlainUnary(int64_t n, int threads) : n_(n), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const T* x = in[0].as<const T>();
    Out* y = out[0].as<Out>();
    for_blocks(n_, threads_, kParallelMin,
               [&](int64_t begin, int64_t end) { unary_loop<T, Op, Out>(x, y, begin, end); });
  }

 private:
  int64_t n_;
  int threads_;
};

// Clip bound k (1 = min, 2 = max): `fallback` when omitted, its value when constant, or
// read from the input buffer in run() (is_constant false).
template <class T>
struct ClipBound {
  T value;
  bool is_constant = true;
  T get(std::span<const Buffer> in, size_t k) const {
    return is_constant ? value : in[k].as<const T>()[0];
  }
};

// y = min(max(x, lo), hi) (ONNX order: lo > hi gives hi), NaN stays NaN.
template <class T>
class ClipKernel final : public Kernel {
 public:
  ClipKernel(ClipBound<T> lo, ClipBound<T> hi, int64_t n, int threads)
      : lo_(lo), hi_(hi), n_(n), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const T lo = lo_.get(in, 1), hi = hi_.get(in, 2);
    const T* x = in[0].as<const T>();
    T* y = out[0].as<T>();
    parallel_for(n_, threads_, n_ >= kParallelMin, [&](int64_t i) { y[i] = std::min(std::max(x[i], lo), hi); });
  }

 private:
  ClipBound<T> lo_, hi_;
  int64_t n_;
  int threads_;
};

template <class T>
std::optional<ClipBound<T>> clip_bound(const KernelSpec& s, size_t k, T fallback) {
  if (!s.has_input(k)) return ClipBound<T>{fallback};
  if (s.inputs[k].dtype != dtype_of<T>() || s.inputs[k].numel() != 1) return std::nullopt;
  const Tensor* c = s.constant(k);
  return c ? ClipBound<T>{c->as<T>()[0]} : ClipBound<T>{fallback, false};
}

// y[i] = To(x[i]): C++ conversion, which is ONNX's: float -> int truncates toward zero,
// anything -> bool is x != 0, bool -> number is 0 or 1.
template <class From, class To>
class CastKernel final : public Kernel {
 public:
  CastKernel(int64_t n, int threads) : n_(n), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const From* x = in[0].as<const From>();
    To* y = out[0].as<To>();
    parallel_for(n_, threads_, n_ >= kParallelMin, [&](int64_t i) { y[i] = static_cast<To>(x[i]); });
  }

 private:
  int64_t n_;
  int threads_;
};

// Inference Dropout: output = input (bytes copied), mask (if present) all true.
class DropoutKernel final : public Kernel {
 public:
  DropoutKernel(int64_t bytes, int threads) : bytes_(bytes), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const auto* x = in[0].as<const std::byte>();
    auto* y = out[0].as<std::byte>();
    const int64_t blocks = (bytes_ + kBlock - 1) / kBlock;
    if (x != y) {
      parallel_for(blocks, threads_, bytes_ >= kParallelMin * 4, [&](int64_t b) {
        std::memcpy(y + b * kBlock, x + b * kBlock, static_cast<size_t>(std::min(kBlock, bytes_ - b * kBlock)));
      });
    }
    if (out.size() > 1 && out[1].present())
      std::memset(out[1].data, 1, static_cast<size_t>(out[1].numel()));
  }

 private:
  static constexpr int64_t kBlock = 1 << 16;
  int64_t bytes_;
  int threads_;
};

// y[i] = min(max(x[i], lo), hi) as x86's maxps and minps take them, oneDNN's eltwise relu (alpha
// 0: lo 0, hi inf) and clip_v2 do: max(x, lo) is x > lo ? x : lo, so a NaN x gives lo and a zero
// of either sign against lo 0 gives +0.
PT_VECTOR_CLONES void clamp_loop(const float* x, float* y, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) {
    const float m = x[i] > lo ? x[i] : lo;
    y[i] = m < hi ? m : hi;
  }
}

// An fp32 Relu or constant-bound Clip below kParallelMin elements: one thread, no oneDNN call
// (its eltwise primitive costs ~0.8 us a call whatever its size, an MLP's Relu most of it), the
// primitive's bits.
class SmallClamp final : public Kernel {
 public:
  SmallClamp(int64_t n, float lo, float hi) : n_(n), lo_(lo), hi_(hi) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    clamp_loop(in[0].as<const float>(), out[0].as<float>(), n_, lo_, hi_);
  }

 private:
  int64_t n_;
  float lo_, hi_;
};

// ---- factory helpers ------------------------------------------------------------------------

// fp32 y = alg(x; alpha, beta) for input 0 -> output 0 (same type), or nullptr.
std::unique_ptr<Kernel> make_dnnl_eltwise(const KernelSpec& s, dnnl::algorithm alg,
                                          float alpha = 0.f, float beta = 0.f) {
  if (!has_io(s, 1) || s.inputs[0].dtype != DType::kFloat32 || !(s.outputs[0] == s.inputs[0]))
    return nullptr;
  const int threads = elementwise_threads(s.inputs[0].numel(), s.cpu->threads);
  return build_or_null(s, [&]() -> std::unique_ptr<Kernel> {
    auto k = std::make_unique<DnnlKernel>(*s.cpu, threads);
    const memory::desc md = plain_desc(s.inputs[0]);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::eltwise_forward::primitive_desc pd(
        {dnnl::prop_kind::forward_inference, alg, md, alpha, beta}, attr, k->engine());
    k->add_step(dnnl::eltwise_forward(pd), pd.scratchpad_desc(),
                {{DNNL_ARG_SRC, md, {Place::kInput, 0}}, {DNNL_ARG_DST, md, {Place::kOutput, 0}}});
    return k;
  }, threads);
}

// Dropout's ratio: 0.5 when omitted, else its value when it is a constant float/double scalar.
std::optional<double> dropout_ratio(const KernelSpec& s) {
  if (!s.has_input(1)) return 0.5;
  if (const auto r = constant_scalar<float>(s, 1)) return static_cast<double>(*r);
  return constant_scalar<double>(s, 1);
}

// dnnl_activation's op (Relu, or Clip with constant bounds lo <= hi) as a SmallClamp when its
// input is below kParallelMin elements, else on oneDNN's eltwise primitive.
std::unique_ptr<Kernel> make_activation(const KernelSpec& s, const EltwiseOp& op) {
  const int64_t n = s.inputs[0].numel();
  if (n >= kParallelMin) return make_dnnl_eltwise(s, op.alg, op.alpha, op.beta);
  if (op.alg == dnnl::algorithm::eltwise_relu)
    return std::make_unique<SmallClamp>(n, 0.f, std::numeric_limits<float>::infinity());
  return std::make_unique<SmallClamp>(n, op.alpha, op.beta);
}

}  // namespace

std::optional<EltwiseOp> dnnl_activation(const KernelSpec& s) {
  if (!has_io(s, 1) || s.inputs[0].dtype != DType::kFloat32 || !(s.outputs[0] == s.inputs[0]))
    return std::nullopt;
  if (!s.node.domain.empty()) return std::nullopt;
  if (s.node.op_type == "Relu") return EltwiseOp{dnnl::algorithm::eltwise_relu};
  if (s.node.op_type != "Clip") return std::nullopt;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const auto lo = clip_bound<float>(s, 1, -kInf), hi = clip_bound<float>(s, 2, kInf);
  if (!lo || !hi || !lo->is_constant || !hi->is_constant || !(lo->value <= hi->value)) return std::nullopt;
  return EltwiseOp{dnnl::algorithm::eltwise_clip_v2, lo->value, hi->value};
}

std::unique_ptr<Kernel> make_sqrt(const KernelSpec& s) {
  return make_dnnl_eltwise(s, dnnl::algorithm::eltwise_sqrt);
}
std::unique_ptr<Kernel> make_relu(const KernelSpec& s) {
  const std::optional<EltwiseOp> op = dnnl_activation(s);
  return op ? make_activation(s, *op) : nullptr;
}
std::unique_ptr<Kernel> make_tanh(const KernelSpec& s) {
  return make_dnnl_eltwise(s, dnnl::algorithm::eltwise_tanh);
}
std::unique_ptr<Kernel> make_sigmoid(const KernelSpec& s) {
  return make_dnnl_eltwise(s, dnnl::algorithm::eltwise_logistic);
}

// Gelu, approximate = "none": 0.5 x (1 + erf(x / sqrt 2));
//       approximate = "tanh": 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
// fp32 loops on lane_math.h's erf and tanh (oneDNN 2.6's gelu_erf eltwise took 1.5-2x the time
// of the erf loop on a transformer's 8 x 128 x 1024 activations).
std::unique_ptr<Kernel> make_gelu(const KernelSpec& s) {
  if (!has_io(s, 1) || s.inputs[0].dtype != DType::kFloat32 || !(s.outputs[0] == s.inputs[0]))
    return nullptr;
  const std::string approximate = s.node.attr_string("approximate", "none");
  const int64_t n = s.inputs[0].numel();
  if (approximate == "none") return std::make_unique<PlainUnary<float, GeluErfOp>>(n, s.cpu->threads);
  if (approximate == "tanh") return std::make_unique<PlainUnary<float, GeluTanhOp>>(n, s.cpu->threads);
  return nullptr;
}

// Erf on fp32 through ErfOp (oneDNN's eltwise has no erf of its own; std::erf does not
// vectorise and took a third of the GPT sample's forward time).
std::unique_ptr<Kernel> make_erf(const KernelSpec& s) {
  if (!has_io(s, 1) || s.inputs[0].dtype != DType::kFloat32 || !(s.outputs[0] == s.inputs[0]))
    return nullptr;
  return std::make_unique<PlainUnary<float, ErfOp>>(s.inputs[0].numel(), s.cpu->threads);
}

// Neg: fp32 as oneDNN linear (y = -1 x + 0), NegTypes plain.
std::unique_ptr<Kernel> make_neg(const KernelSpec& s) {
  if (!has_io(s, 1) || !(s.outputs[0] == s.inputs[0])) return nullptr;
  if (s.inputs[0].dtype == DType::kFloat32)
    return make_dnnl_eltwise(s, dnnl::algorithm::eltwise_linear, -1.f, 0.f);
  return visit(NegTypes{}, s.inputs[0].dtype, [&]<class T>() -> std::unique_ptr<Kernel> {
    return std::make_unique<PlainUnary<T, NegOp>>(s.inputs[0].numel(), s.cpu->threads);
  });
}

// Reciprocal: fp32 as oneDNN pow, y = 1 * x^-1.
std::unique_ptr<Kernel> make_reciprocal(const KernelSpec& s) {
  return make_dnnl_eltwise(s, dnnl::algorithm::eltwise_pow, 1.f, -1.f);
}

// IsNaN: fp32 -> bool.
std::unique_ptr<Kernel> make_is_nan(const KernelSpec& s) {
  if (!has_io(s, 1) || s.inputs[0].dtype != DType::kFloat32 || s.outputs[0].dtype != DType::kBool ||
      s.outputs[0].shape != s.inputs[0].shape)
    return nullptr;
  return std::make_unique<PlainUnary<float, IsNaNOp, bool>>(s.inputs[0].numel(), s.cpu->threads);
}

// y = h(x) = max(0, min(1, alpha x + beta)), or x * h(x) for HardSwish; fp32.
class HardSigmoidKernel final : public Kernel {
 public:
  HardSigmoidKernel(int64_t n, float alpha, float beta, bool swish, int threads)
      : n_(n), alpha_(alpha), beta_(beta), swish_(swish), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* x = in[0].as<const float>();
    float* y = out[0].as<float>();
    parallel_for(n_, threads_, n_ >= kParallelMin, [&](int64_t i) {
      const float h = std::max(0.f, std::min(1.f, alpha_ * x[i] + beta_));
      y[i] = swish_ ? x[i] * h : h;
    });
  }

 private:
  int64_t n_;
  float alpha_, beta_;
  bool swish_;
  int threads_;
};

std::unique_ptr<Kernel> make_hard(const KernelSpec& s, float alpha, float beta, bool swish) {
  if (!has_io(s, 1) || s.inputs[0].dtype != DType::kFloat32 || !(s.outputs[0] == s.inputs[0])) return nullptr;
  return std::make_unique<HardSigmoidKernel>(s.inputs[0].numel(), alpha, beta, swish, s.cpu->threads);
}

std::unique_ptr<Kernel> make_hard_sigmoid(const KernelSpec& s) {
  return make_hard(s, s.node.attr_float("alpha", 0.2f), s.node.attr_float("beta", 0.5f), false);
}
std::unique_ptr<Kernel> make_hard_swish(const KernelSpec& s) { return make_hard(s, 1.f / 6, 0.5f, true); }

// Sin, Cos: fp32 (rotary tables computed at run time).
std::unique_ptr<Kernel> make_sin(const KernelSpec& s) {
  if (!has_io(s, 1) || s.inputs[0].dtype != DType::kFloat32 || !(s.outputs[0] == s.inputs[0])) return nullptr;
  return std::make_unique<PlainUnary<float, SinOp>>(s.inputs[0].numel(), s.cpu->threads);
}
std::unique_ptr<Kernel> make_cos(const KernelSpec& s) {
  if (!has_io(s, 1) || s.inputs[0].dtype != DType::kFloat32 || !(s.outputs[0] == s.inputs[0])) return nullptr;
  return std::make_unique<PlainUnary<float, CosOp>>(s.inputs[0].numel(), s.cpu->threads);
}

// y = Op(x) of x's type and shape, for the dtypes of `Types`.
template <class Op, class Types>
std::unique_ptr<Kernel> make_plain_unary(const KernelSpec& s, Types types) {
  if (!has_io(s, 1) || !(s.outputs[0] == s.inputs[0])) return nullptr;
  return visit(types, s.inputs[0].dtype, [&]<class T>() -> std::unique_ptr<Kernel> {
    return std::make_unique<PlainUnary<T, Op>>(s.inputs[0].numel(), s.cpu->threads);
  });
}

std::unique_ptr<Kernel> make_abs(const KernelSpec& s) { return make_plain_unary<AbsOp>(s, AbsTypes{}); }
std::unique_ptr<Kernel> make_floor(const KernelSpec& s) { return make_plain_unary<FloorOp>(s, FloatTypes{}); }
std::unique_ptr<Kernel> make_ceil(const KernelSpec& s) { return make_plain_unary<CeilOp>(s, FloatTypes{}); }
std::unique_ptr<Kernel> make_exp(const KernelSpec& s) { return make_plain_unary<ExpOp>(s, FloatTypes{}); }
std::unique_ptr<Kernel> make_logical_not(const KernelSpec& s) {
  return make_plain_unary<NotOp>(s, TypeList<bool>{});
}

// Clip(x, min?, max?) on ClipTypes; min and max are scalars, constant or read in run(). fp32
// with constant bounds lo <= hi runs as oneDNN's clip_v2 (y = min(max(x, lo), hi)), or below
// kParallelMin elements a loop of the same bits (SmallClamp).
std::unique_ptr<Kernel> make_clip(const KernelSpec& s) {
  if (!has_io(s, 1) || !(s.outputs[0] == s.inputs[0])) return nullptr;
  return visit(ClipTypes{}, s.inputs[0].dtype, [&]<class T>() -> std::unique_ptr<Kernel> {
    using Limits = std::numeric_limits<T>;
    const T lowest = Limits::has_infinity ? -Limits::infinity() : Limits::lowest();
    const T highest = Limits::has_infinity ? Limits::infinity() : Limits::max();
    if constexpr (std::is_same_v<T, float>) {
      if (const std::optional<EltwiseOp> op = dnnl_activation(s))
        return make_activation(s, *op);
    }
    const auto lo = clip_bound<T>(s, 1, lowest), hi = clip_bound<T>(s, 2, highest);
    if (!lo || !hi) return nullptr;
    return std::make_unique<ClipKernel<T>>(*lo, *hi, s.inputs[0].numel(), s.cpu->threads);
  });
}

// Cast between float32, float64, int32, int64 and bool (attribute `to`); nullptr for others.
std::unique_ptr<Kernel> make_cast(const KernelSpec& s) {
  if (!has_io(s, 1) || s.outputs[0].shape != s.inputs[0].shape) return nullptr;
  const int64_t n = s.inputs[0].numel();
  return visit(CastTypes{}, s.inputs[0].dtype, [&]<class From>() {
    return visit(CastTypes{}, s.outputs[0].dtype, [&]<class To>() -> std::unique_ptr<Kernel> {
      return std::make_unique<CastKernel<From, To>>(n, s.cpu->threads);
    });
  });
}

// Dropout(data, ratio?, training_mode?) -> (output, mask?). Inference (training_mode omitted or
// constant false, or ratio constant 0) is the identity with an all-true mask. Training with a
// ratio > 0, or a training_mode only known at run time, returns nullptr: training dropout comes
// with autodiff.
std::unique_ptr<Kernel> make_dropout(const KernelSpec& s) {
  if (!has_io(s, 1) || !(s.outputs[0] == s.inputs[0])) return nullptr;
  if (s.outputs.size() > 1 && s.outputs[1].dtype != DType::kUndefined &&
      (s.outputs[1].dtype != DType::kBool || s.outputs[1].shape != s.inputs[0].shape))
    return nullptr;
  if (s.has_input(2)) {
    const auto training = constant_scalar<bool>(s, 2);
    const auto ratio = dropout_ratio(s);
    if (!training || (*training != 0 && (!ratio || *ratio != 0))) return nullptr;
  }
  return std::make_unique<DropoutKernel>(s.inputs[0].bytes(), s.cpu->threads);
}

}  // namespace pt::cpu
