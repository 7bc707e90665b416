// exec/cuda/elementwise.cc: the element-wise family's CUDA factories (cuda_kernels.h), custom
// kernels of elementwise.cu: broadcasting binary ops and Where, unary activations, Clip, Cast,
// Dropout (inference), and the element-wise gradients of the pipetrain domain. Each accepts
// what its CPU counterpart accepts (dtypes of exec/cpu/elementwise*.cc).
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "exec/cuda/cuda_check.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/plan.h"

namespace pt::cuda {
namespace {

std::unique_ptr<Kernel> binary(const KernelSpec& s, CudaContext& ctx, BinaryOp op) {
  if (!has_io(s, 2)) return nullptr;
  const DType a = s.inputs[0].dtype, b = s.inputs[1].dtype;
  const DType y = binary_gives_bool(op) ? DType::kBool : a;
  if (!binary_supported(op, a, b) || s.outputs[0].dtype != y) return nullptr;
  const auto bc = make_broadcast(s, 2);
  if (!bc) return nullptr;
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=, bc = *bc](Args in, Args out, void*) {
    launch_binary(op, a, b, bc, in[0].data, in[1].data, out[0].data, stream);
  });
}

// Gelu's (and GeluGrad's) form from its `approximate` attribute: `erf` for "none", `tanh` for
// "tanh"; nullopt for anything else.
template <class Op>
std::optional<Op> gelu_form(const KernelSpec& s, Op erf, Op tanh) {
  const std::string approximate = s.node.attr_string("approximate", "none");
  if (approximate == "none") return erf;
  if (approximate == "tanh") return tanh;
  return std::nullopt;
}

// x -> y of the same type and shape.
bool same_unary(const KernelSpec& s) { return has_io(s, 1) && s.outputs[0] == s.inputs[0]; }

std::unique_ptr<Kernel> unary(const KernelSpec& s, CudaContext& ctx, UnaryOp op) {
  if (!same_unary(s) || !unary_supported(op, s.inputs[0].dtype)) return nullptr;
  const DType t = s.inputs[0].dtype;
  const int64_t n = s.inputs[0].numel();
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_unary(op, t, n, in[0].data, out[0].data, stream);
  });
}

// Bound k of Clip: none when omitted, the constant's value, or read by the kernel from the
// input's device scalar (ClipBound::ptr, set in run()). nullopt unless a scalar of type t.
struct Bound {
  ClipBound b;
  int input = -1;  // the input to read at run time, or -1
};
std::optional<Bound> clip_bound(const KernelSpec& s, size_t k, DType t) {
  if (!s.has_input(k)) return Bound{{0, nullptr, true}};
  if (s.inputs[k].dtype != t || s.inputs[k].numel() != 1) return std::nullopt;
  const Tensor* c = s.constant(k);
  if (!c) return Bound{{0, nullptr, false}, static_cast<int>(k)};
  double v = 0;
  switch (t) {
    case DType::kFloat32: v = c->as<float>()[0]; break;
    case DType::kFloat64: v = c->as<double>()[0]; break;
    case DType::kInt32: v = c->as<int32_t>()[0]; break;
    case DType::kInt64: v = static_cast<double>(c->as<int64_t>()[0]); break;
    case DType::kInt8: v = c->as<int8_t>()[0]; break;
    case DType::kUInt8: v = c->as<uint8_t>()[0]; break;
    default: return std::nullopt;
  }
  return Bound{{v, nullptr, false}};
}

ClipBound bind(const Bound& b, std::span<const Buffer> in) {
  ClipBound r = b.b;
  if (b.input >= 0) r.ptr = in[static_cast<size_t>(b.input)].data;
  return r;
}

std::unique_ptr<Kernel> unary_grad(const KernelSpec& s, CudaContext& ctx, GradOp op) {
  if (s.inputs.size() != 2 || !has_io(s, 2) || !float_io(s) || s.inputs[1] != s.inputs[0] ||
      s.outputs[0] != s.inputs[0])
    return nullptr;
  const int64_t n = s.inputs[0].numel();
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_unary_grad(op, n, in[0].as<const float>(), in[1].as<const float>(),
                      out[0].as<float>(), stream);
  });
}

}  // namespace

std::unique_ptr<Kernel> make_add(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kAdd); }
std::unique_ptr<Kernel> make_sub(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kSub); }
std::unique_ptr<Kernel> make_mul(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kMul); }
std::unique_ptr<Kernel> make_div(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kDiv); }
std::unique_ptr<Kernel> make_pow(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kPow); }
std::unique_ptr<Kernel> make_equal(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kEqual); }
std::unique_ptr<Kernel> make_less(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kLess); }
std::unique_ptr<Kernel> make_greater(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kGreater); }
std::unique_ptr<Kernel> make_less_or_equal(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kLessEqual); }
std::unique_ptr<Kernel> make_greater_or_equal(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kGreaterEqual); }
std::unique_ptr<Kernel> make_logical_and(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kAnd); }
std::unique_ptr<Kernel> make_logical_or(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kOr); }
std::unique_ptr<Kernel> make_logical_xor(const KernelSpec& s, CudaContext& c) { return binary(s, c, BinaryOp::kXor); }
std::unique_ptr<Kernel> make_logical_not(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kNot); }
std::unique_ptr<Kernel> make_abs(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kAbs); }
std::unique_ptr<Kernel> make_floor(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kFloor); }
std::unique_ptr<Kernel> make_ceil(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kCeil); }
std::unique_ptr<Kernel> make_exp(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kExp); }

// Mod: fmod = 1 truncated (floats and integers), fmod = 0 floored (integers only), as the CPU.
std::unique_ptr<Kernel> make_mod(const KernelSpec& s, CudaContext& c) {
  return binary(s, c, s.node.attr_int("fmod", 0) != 0 ? BinaryOp::kFmod : BinaryOp::kFloorMod);
}

namespace {

// Min and Max of one input (a copy), two (a binary op) or three, of one dtype.
std::unique_ptr<Kernel> extreme(const KernelSpec& s, CudaContext& ctx, BinaryOp op) {
  const size_t n = s.inputs.size();
  if (n < 1 || n > 3 || !has_io(s, static_cast<int>(n))) return nullptr;
  const DType t = s.outputs[0].dtype;
  for (const TensorType& in : s.inputs)
    if (in.dtype != t) return nullptr;
  if (n == 1) return s.outputs[0] == s.inputs[0] ? make_reshape(s, ctx) : nullptr;
  if (n == 2) return binary(s, ctx, op);
  if (!binary_supported(op, t, t)) return nullptr;
  const auto bc = make_broadcast(s, 3);
  if (!bc) return nullptr;
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=, bc = *bc](Args in, Args out, void*) {
    launch_ternary(op, t, bc, in[0].data, in[1].data, in[2].data, out[0].data, stream);
  });
}

}  // namespace

std::unique_ptr<Kernel> make_min(const KernelSpec& s, CudaContext& c) { return extreme(s, c, BinaryOp::kMin); }
std::unique_ptr<Kernel> make_max(const KernelSpec& s, CudaContext& c) { return extreme(s, c, BinaryOp::kMax); }

// Where(cond: bool, x: T, z: T) -> y: T, all three broadcast.
std::unique_ptr<Kernel> make_where(const KernelSpec& s, CudaContext& ctx) {
  if (!has_io(s, 3) || s.inputs[0].dtype != DType::kBool) return nullptr;
  const DType t = s.inputs[1].dtype;
  if (s.inputs[2].dtype != t || s.outputs[0].dtype != t || !where_supported(t)) return nullptr;
  const auto bc = make_broadcast(s, 3);
  if (!bc) return nullptr;
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=, bc = *bc](Args in, Args out, void*) {
    launch_where(t, bc, in[0].data, in[1].data, in[2].data, out[0].data, stream);
  });
}

std::unique_ptr<Kernel> make_sqrt(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kSqrt); }
std::unique_ptr<Kernel> make_neg(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kNeg); }
std::unique_ptr<Kernel> make_reciprocal(const KernelSpec& s, CudaContext& c) {
  return unary(s, c, UnaryOp::kReciprocal);
}
std::unique_ptr<Kernel> make_sin(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kSin); }

// HardSigmoid and HardSwish, fp32, as the CPU's.
std::unique_ptr<Kernel> hard(const KernelSpec& s, CudaContext& ctx, float alpha, float beta, bool swish) {
  if (!has_io(s, 1) || s.inputs[0].dtype != DType::kFloat32 || !(s.outputs[0] == s.inputs[0])) return nullptr;
  const int64_t n = s.inputs[0].numel();
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_hard_sigmoid(n, alpha, beta, swish, in[0].as<const float>(), out[0].as<float>(), stream);
  });
}
std::unique_ptr<Kernel> make_hard_sigmoid(const KernelSpec& s, CudaContext& c) {
  return hard(s, c, s.node.attr_float("alpha", 0.2f), s.node.attr_float("beta", 0.5f), false);
}
std::unique_ptr<Kernel> make_hard_swish(const KernelSpec& s, CudaContext& c) { return hard(s, c, 1.f / 6, 0.5f, true); }
std::unique_ptr<Kernel> make_cos(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kCos); }

// CumSum, float32, the CPU's geometry.
std::unique_ptr<Kernel> make_cumsum(const KernelSpec& s, CudaContext& ctx) {
  const std::optional<ScanGeometry> g = scan_geometry(s);
  if (!g || s.inputs[0].dtype != DType::kFloat32) return nullptr;
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=, g = *g](Args in, Args out, void*) {
    launch_cumsum(g.outer, g.n, g.inner, g.exclusive, g.reverse, in[0].as<const float>(),
                  out[0].as<float>(), stream);
  });
}

// IsNaN: fp32 -> bool, as the CPU's.
std::unique_ptr<Kernel> make_is_nan(const KernelSpec& s, CudaContext& ctx) {
  if (!has_io(s, 1) || s.inputs[0].dtype != DType::kFloat32 || s.outputs[0].dtype != DType::kBool ||
      s.outputs[0].shape != s.inputs[0].shape)
    return nullptr;
  const int64_t n = s.inputs[0].numel();
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_is_nan(n, in[0].as<const float>(), out[0].as<bool>(), stream);
  });
}
std::unique_ptr<Kernel> make_relu(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kRelu); }
std::unique_ptr<Kernel> make_erf(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kErf); }
std::unique_ptr<Kernel> make_tanh(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kTanh); }
std::unique_ptr<Kernel> make_sigmoid(const KernelSpec& s, CudaContext& c) { return unary(s, c, UnaryOp::kSigmoid); }

// Gelu, approximate "none" (erf form) or "tanh".
std::unique_ptr<Kernel> make_gelu(const KernelSpec& s, CudaContext& c) {
  const auto op = gelu_form(s, UnaryOp::kGeluErf, UnaryOp::kGeluTanh);
  return op ? unary(s, c, *op) : nullptr;
}

// Clip(x, min?, max?): bounds constant (read now) or fed (read by the kernel).
std::unique_ptr<Kernel> make_clip(const KernelSpec& s, CudaContext& ctx) {
  if (!same_unary(s) || !clip_supported(s.inputs[0].dtype)) return nullptr;
  const DType t = s.inputs[0].dtype;
  const auto lo = clip_bound(s, 1, t), hi = clip_bound(s, 2, t);
  if (!lo || !hi) return nullptr;
  const int64_t n = s.inputs[0].numel();
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=, lo = *lo, hi = *hi](Args in, Args out, void*) {
    launch_clip(t, n, in[0].data, bind(lo, in), bind(hi, in), out[0].data, stream);
  });
}

// Cast between float32, float64, int32, int64 and bool (C++ conversions, as the CPU's).
std::unique_ptr<Kernel> make_cast(const KernelSpec& s, CudaContext& ctx) {
  if (!has_io(s, 1) || s.outputs[0].shape != s.inputs[0].shape) return nullptr;
  const DType from = s.inputs[0].dtype, to = s.outputs[0].dtype;
  if (!cast_supported(from, to)) return nullptr;
  const int64_t n = s.inputs[0].numel();
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_cast(from, to, n, in[0].data, out[0].data, stream);
  });
}

// Dropout in inference (as the CPU's make_dropout decides it): output = input, mask all true.
std::unique_ptr<Kernel> make_dropout(const KernelSpec& s, CudaContext& ctx) {
  if (!same_unary(s)) return nullptr;
  if (wanted(s, 1) && (s.outputs[1].dtype != DType::kBool || s.outputs[1].shape != s.inputs[0].shape))
    return nullptr;
  if (s.has_input(2)) {
    const auto training = constant_scalar<bool>(s, 2);
    std::optional<double> ratio = 0.5;
    if (s.has_input(1)) {
      if (const auto f = constant_scalar<float>(s, 1)) ratio = *f;
      else if (const auto d = constant_scalar<double>(s, 1)) ratio = *d;
      else ratio = std::nullopt;
    }
    if (!training || (*training && (!ratio || *ratio != 0))) return nullptr;
  }
  const size_t bytes = static_cast<size_t>(s.inputs[0].bytes());
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    if (out[0].data != in[0].data && bytes)
      PT_CUDA_CHECK(cudaMemcpyAsync(out[0].data, in[0].data, bytes, cudaMemcpyDeviceToDevice, stream));
    if (out.size() > 1 && out[1].present())
      launch_fill_bytes(out[1].data, 1, out[1].numel(), stream);
  });
}

// SeededDropout(X, key) -> (Y, mask?), ratio in [0, 1), stream (core/pipetrain_ops.h).
std::unique_ptr<Kernel> make_seeded_dropout(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 2 || !has_io(s, 2) || s.outputs.size() > 2) return nullptr;
  const TensorType& x = s.inputs[0];
  if (x.dtype != DType::kFloat32 || s.inputs[1] != TensorType{DType::kInt64, {}} ||
      s.outputs[0] != x)
    return nullptr;
  if (wanted(s, 1) && s.outputs[1] != TensorType{DType::kBool, x.shape}) return nullptr;
  const float ratio = s.node.attr_float("ratio", 0.5f);
  if (!(ratio >= 0.0f && ratio < 1.0f) || !s.node.has_attr("stream")) return nullptr;
  const float scale = 1.0f / (1.0f - ratio);
  const int64_t stream_id = s.node.attr_int("stream", 0), n = x.numel();
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    bool* mask = out.size() > 1 && out[1].present() ? out[1].as<bool>() : nullptr;
    launch_seeded_dropout(n, ratio, scale, stream_id, in[0].as<const float>(),
                          in[1].as<const int64_t>(), out[0].as<float>(), mask, stream);
  });
}

// SeededBernoulli(P, key) -> Y, stream (core/pipetrain_ops.h). P and Y float32 of one shape.
std::unique_ptr<Kernel> make_seeded_bernoulli(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 2 || !has_io(s, 2) || s.outputs.size() != 1) return nullptr;
  const TensorType& p = s.inputs[0];
  if (p.dtype != DType::kFloat32 || s.inputs[1] != TensorType{DType::kInt64, {}} ||
      s.outputs[0] != p || !s.node.has_attr("stream"))
    return nullptr;
  const int64_t stream_id = s.node.attr_int("stream", 0), n = p.numel();
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_seeded_bernoulli(n, stream_id, in[0].as<const float>(), in[1].as<const int64_t>(),
                            out[0].as<float>(), stream);
  });
}

// ---- gradients (core/pipetrain_ops.h) ----

std::unique_ptr<Kernel> make_relu_grad(const KernelSpec& s, CudaContext& c) { return unary_grad(s, c, GradOp::kRelu); }
std::unique_ptr<Kernel> make_erf_grad(const KernelSpec& s, CudaContext& c) { return unary_grad(s, c, GradOp::kErf); }

std::unique_ptr<Kernel> make_gelu_grad(const KernelSpec& s, CudaContext& c) {
  const auto op = gelu_form(s, GradOp::kGeluErf, GradOp::kGeluTanh);
  return op ? unary_grad(s, c, *op) : nullptr;
}

// ClipGrad(dY, X, min?, max?): dX = dY where min < X < max; bounds float32 scalars, constant,
// omitted (no bound) or fed.
std::unique_ptr<Kernel> make_clip_grad(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() < 2 || s.inputs.size() > 4 || !has_io(s, 2) || !float_io(s) ||
      s.inputs[1] != s.inputs[0] || s.outputs[0] != s.inputs[0])
    return nullptr;
  const auto lo = clip_bound(s, 2, DType::kFloat32), hi = clip_bound(s, 3, DType::kFloat32);
  if (!lo || !hi) return nullptr;
  const int64_t n = s.inputs[0].numel();
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=, lo = *lo, hi = *hi](Args in, Args out, void*) {
    launch_clip_grad(n, in[0].as<const float>(), in[1].as<const float>(), bind(lo, in),
                     bind(hi, in), out[0].as<float>(), stream);
  });
}

}  // namespace pt::cuda
