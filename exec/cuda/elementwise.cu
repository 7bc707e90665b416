// exec/cuda/elementwise.cu: device code and launchers of the element-wise family (launch.h):
// numpy-broadcast binary ops and Where, unary activations, Clip, Cast, and the element-wise
// gradients of the pipetrain domain. One thread per output element in a grid-stride loop (four
// for float32 binary ops whose rows allow 16-byte accesses); the math follows the CPU kernels'
// (exec/cpu/elementwise*.cc) definitions.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "exec/cuda/device_util.cuh"
#include "exec/cuda/launch.h"

namespace pt::cuda {
namespace {

// ---- dtype dispatch ---------------------------------------------------------------------------

template <class T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) for the T of dtype t among float, double, int32, int64, int8, uint8, bool
// allowed by `mask` (bit k set: the k-th of those); false when t is not allowed.
enum : unsigned { kF32 = 1, kF64 = 2, kI32 = 4, kI64 = 8, kI8 = 16, kU8 = 32, kBool = 64 };
constexpr unsigned kArith = kF32 | kF64 | kI32 | kI64 | kI8 | kU8;
constexpr unsigned kPowTypes = kF32 | kF64 | kI32 | kI64;
constexpr unsigned kValue = kF32 | kF64 | kI32 | kI64 | kI8 | kU8 | kBool;
constexpr unsigned kNegTypes = kF32 | kF64 | kI32 | kI64 | kI8;  // and Abs
constexpr unsigned kOrdered = kF32 | kF64 | kI32 | kI64 | kI8 | kU8;  // comparisons, Mod
constexpr unsigned kFloatTypes = kF32 | kF64;                      // Floor, Ceil, Exp

template <class F>
bool visit(DType t, unsigned mask, F&& f) {
  switch (t) {
    case DType::kFloat32: if (mask & kF32) { f(Tag<float>{}); return true; } break;
    case DType::kFloat64: if (mask & kF64) { f(Tag<double>{}); return true; } break;
    case DType::kInt32: if (mask & kI32) { f(Tag<int32_t>{}); return true; } break;
    case DType::kInt64: if (mask & kI64) { f(Tag<int64_t>{}); return true; } break;
    case DType::kInt8: if (mask & kI8) { f(Tag<int8_t>{}); return true; } break;
    case DType::kUInt8: if (mask & kU8) { f(Tag<uint8_t>{}); return true; } break;
    case DType::kBool: if (mask & kBool) { f(Tag<bool>{}); return true; } break;
    default: break;
  }
  return false;
}

// A query: whether t is in mask.
bool allowed(DType t, unsigned mask) {
  return visit(t, mask, [](auto) {});
}

// ---- broadcasting -----------------------------------------------------------------------------

// Index arithmetic in Idx: uint32_t wherever the output has under 2^31 elements (a 64-bit
// division costs several times a 32-bit one, and this runs once per element). The outermost dim
// needs no division: what is left of i after the inner dims is its index.
template <class Idx>
__device__ inline void offsets(const Broadcast& bc, Idx i, int64_t* off) {
  off[0] = off[1] = off[2] = 0;
  for (int d = bc.rank - 1; d > 0; --d) {
    const Idx n = static_cast<Idx>(bc.dims[d]);
    const Idx q = i / n, k = i - q * n;
    i = q;
    off[0] += static_cast<int64_t>(k) * bc.strides[0][d];
    off[1] += static_cast<int64_t>(k) * bc.strides[1][d];
    off[2] += static_cast<int64_t>(k) * bc.strides[2][d];
  }
  off[0] += static_cast<int64_t>(i) * bc.strides[0][0];
  off[1] += static_cast<int64_t>(i) * bc.strides[1][0];
  off[2] += static_cast<int64_t>(i) * bc.strides[2][0];
}

bool narrow_index(int64_t numel) { return numel < (int64_t{1} << 31); }

struct AddOp { template <class T> __device__ T operator()(T a, T b) const { return a + b; } };
struct SubOp { template <class T> __device__ T operator()(T a, T b) const { return a - b; } };
struct MulOp { template <class T> __device__ T operator()(T a, T b) const { return a * b; } };
// Integer division truncates toward zero; x / 0 gives 0 (as the CPU kernel).
struct DivOp {
  template <class T> __device__ T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) return b == 0 ? T(0) : T(a / b);
    else return a / b;
  }
};
// fp32^fp32 in float, any other pair through double, in the base's type.
struct PowOp {
  template <class A, class B> __device__ A operator()(A a, B b) const {
    if constexpr (std::is_same_v<A, float> && std::is_same_v<B, float>) return powf(a, b);
    else return static_cast<A>(pow(static_cast<double>(a), static_cast<double>(b)));
  }
};
struct EqualOp { template <class T> __device__ bool operator()(T a, T b) const { return a == b; } };
struct LessOp { template <class T> __device__ bool operator()(T a, T b) const { return a < b; } };
struct GreaterOp { template <class T> __device__ bool operator()(T a, T b) const { return a > b; } };
struct LessEqualOp { template <class T> __device__ bool operator()(T a, T b) const { return a <= b; } };
struct GreaterEqualOp { template <class T> __device__ bool operator()(T a, T b) const { return a >= b; } };
struct AndOp { __device__ bool operator()(bool a, bool b) const { return a && b; } };
struct OrOp { __device__ bool operator()(bool a, bool b) const { return a || b; } };
struct XorOp { __device__ bool operator()(bool a, bool b) const { return a != b; } };
// NaN wins, as the CPU's (numpy's maximum and minimum).
struct MaxOp { template <class T> __device__ T operator()(T a, T b) const { return a != a || a > b ? a : b; } };
struct MinOp { template <class T> __device__ T operator()(T a, T b) const { return a != a || a < b ? a : b; } };
// Truncated remainder (the dividend's sign); x mod 0 is 0 for integers, NaN for floats.
struct FmodOp {
  template <class T> __device__ T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) return b == 0 ? T(0) : T(a % b);
    else return fmod(a, b);
  }
};
// Floored remainder (the divisor's sign); x mod 0 is 0 for integers, NaN for floats.
struct FloorModOp {
  template <class T> __device__ T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) return T(0);
      const T r = T(a % b);
      return r != 0 && ((r < 0) != (b < 0)) ? T(r + b) : r;
    } else {
      const T r = fmod(a, b);
      if (r == 0) return copysign(T(0), b);  // a zero takes the divisor's sign, as numpy's
      return (r < 0) != (b < 0) ? T(r + b) : r;
    }
  }
};

template <class Idx, class T, class Op>
__global__ void ternary_kernel(Broadcast bc, const T* a, const T* b, const T* c, T* y) {
  PT_GRID_STRIDE(i, bc.numel) {
    int64_t off[3];
    offsets(bc, static_cast<Idx>(i), off);
    y[i] = Op{}(Op{}(a[off[0]], b[off[1]]), c[off[2]]);
  }
}

template <class Idx, class A, class B, class Y, class Op>
__global__ void binary_kernel(Broadcast bc, const A* a, const B* b, Y* y) {
  PT_GRID_STRIDE(i, bc.numel) {
    int64_t off[3];
    offsets(bc, static_cast<Idx>(i), off);
    y[i] = Op{}(a[off[0]], b[off[1]]);
  }
}

// Four floats of a row at p (inner stride 1), or one float repeated (inner stride 0).
__device__ inline float4 load4(const float* p, int64_t inner_stride) {
  if (inner_stride) return *reinterpret_cast<const float4*>(p);
  const float v = *p;
  return make_float4(v, v, v, v);
}

// float32 ops four outputs at a time (16-byte loads and stores), when the innermost merged dim
// is a multiple of 4 that every operand walks with stride 1 or 0 and every 16-byte access is
// aligned (vectorisable()): the same per-element arithmetic as binary_kernel.
template <class Op>
__global__ void binary_vec4_kernel(Broadcast bc, const float* a, const float* b, float* y) {
  const int inner = bc.rank - 1;
  PT_GRID_STRIDE(g, bc.numel / 4) {
    int64_t off[3];
    offsets(bc, static_cast<uint32_t>(4 * g), off);
    const float4 va = load4(a + off[0], bc.strides[0][inner]);
    const float4 vb = load4(b + off[1], bc.strides[1][inner]);
    const Op op{};
    reinterpret_cast<float4*>(y)[g] =
        make_float4(op(va.x, vb.x), op(va.y, vb.y), op(va.z, vb.z), op(va.w, vb.w));
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether binary_vec4_kernel can run operands a and b (0 and 1 of bc) into a contiguous y.
bool vectorisable(const Broadcast& bc, const void* a, const void* b, const void* y) {
  const int inner = bc.rank - 1;
  if (!narrow_index(bc.numel) || bc.dims[inner] % 4 != 0 || !aligned16(y)) return false;
  const void* operand[2] = {a, b};
  for (int k = 0; k < 2; ++k) {
    const int64_t s = bc.strides[k][inner];
    if (s == 0) continue;  // one value per row: offsets stay whatever the outer strides
    if (s != 1 || !aligned16(operand[k])) return false;
    for (int d = 0; d < inner; ++d)
      if (bc.strides[k][d] % 4 != 0) return false;
  }
  return true;
}

template <class Idx, class T>
__global__ void where_kernel(Broadcast bc, const bool* c, const T* x, const T* z, T* y) {
  PT_GRID_STRIDE(i, bc.numel) {
    int64_t off[3];
    offsets(bc, static_cast<Idx>(i), off);
    y[i] = c[off[0]] ? x[off[1]] : z[off[2]];
  }
}

template <class A, class B, class Y, class Op>
void binary(const Broadcast& bc, const void* a, const void* b, void* y, cudaStream_t s) {
  if (bc.numel == 0) return;
  constexpr bool kFloats =
      std::is_same_v<A, float> && std::is_same_v<B, float> && std::is_same_v<Y, float>;
  if constexpr (kFloats) {
    if (vectorisable(bc, a, b, y)) {
      binary_vec4_kernel<Op><<<grid_for(bc.numel / 4), kThreads, 0, s>>>(
          bc, static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(y));
      PT_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  if (narrow_index(bc.numel))
    binary_kernel<uint32_t, A, B, Y, Op><<<grid_for(bc.numel), kThreads, 0, s>>>(
        bc, static_cast<const A*>(a), static_cast<const B*>(b), static_cast<Y*>(y));
  else
    binary_kernel<int64_t, A, B, Y, Op><<<grid_for(bc.numel), kThreads, 0, s>>>(
        bc, static_cast<const A*>(a), static_cast<const B*>(b), static_cast<Y*>(y));
  PT_CUDA_LAUNCH_CHECK();
}

// ---- unary ------------------------------------------------------------------------------------

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float k2OverSqrtPi = 1.1283791670955126f;

template <class T>
__device__ T apply_unary(UnaryOp op, T x) {
  if constexpr (std::is_same_v<T, bool>) {
    return !x;  // only Not takes bool
  } else if constexpr (std::is_same_v<T, float>) {
    switch (op) {
      case UnaryOp::kAbs: return fabsf(x);
      case UnaryOp::kFloor: return floorf(x);
      case UnaryOp::kCeil: return ceilf(x);
      case UnaryOp::kExp: return expf(x);
      default: break;
    }
    switch (op) {
      case UnaryOp::kSqrt: return sqrtf(x);
      case UnaryOp::kNeg: return -x;
      case UnaryOp::kReciprocal: return 1.f / x;
      case UnaryOp::kSin: return sinf(x);
      case UnaryOp::kCos: return cosf(x);
      case UnaryOp::kRelu: return x > 0.f ? x : 0.f;
      case UnaryOp::kErf: return erff(x);
      case UnaryOp::kGeluErf: return 0.5f * x * (1.f + erff(x * kInvSqrt2));
      case UnaryOp::kGeluTanh:
        return 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
      case UnaryOp::kTanh: return tanhf(x);
      case UnaryOp::kSigmoid: return 1.f / (1.f + expf(-x));
      default: break;
    }
    return x;
  } else {
    if constexpr (std::is_same_v<T, double>) {
      switch (op) {
        case UnaryOp::kFloor: return floor(x);
        case UnaryOp::kCeil: return ceil(x);
        case UnaryOp::kExp: return exp(x);
        default: break;
      }
    }
    if (op == UnaryOp::kAbs) return x < T(0) ? T(-x) : x;
    return T(-x);  // Neg
  }
}

template <class T>
__global__ void unary_kernel(UnaryOp op, int64_t n, const T* x, T* y) {
  PT_GRID_STRIDE(i, n) y[i] = apply_unary<T>(op, x[i]);
}

__global__ void hard_sigmoid_kernel(int64_t n, float alpha, float beta, bool swish, const float* x,
                                    float* y) {
  PT_GRID_STRIDE(i, n) {
    const float h = fmaxf(0.f, fminf(1.f, alpha * x[i] + beta));
    y[i] = swish ? x[i] * h : h;
  }
}

__global__ void is_nan_kernel(int64_t n, const float* x, bool* y) {
  PT_GRID_STRIDE(i, n) y[i] = isnan(x[i]);
}

template <class T>
__device__ T bound(ClipBound b) {
  return b.ptr ? *static_cast<const T*>(b.ptr) : static_cast<T>(b.value);
}

// y = min(max(x, lo), hi) with the CPU's comparisons (NaN stays NaN; lo > hi gives hi); an
// absent bound is no bound.
template <class T>
__global__ void clip_kernel(int64_t n, const T* x, ClipBound lo_b, ClipBound hi_b, T* y) {
  const T lo = lo_b.none ? T(0) : bound<T>(lo_b), hi = hi_b.none ? T(0) : bound<T>(hi_b);
  PT_GRID_STRIDE(i, n) {
    T v = x[i];
    if (!lo_b.none) v = v < lo ? lo : v;
    if (!hi_b.none) v = hi < v ? hi : v;
    y[i] = v;
  }
}

template <class From, class To>
__global__ void cast_kernel(int64_t n, const From* x, To* y) {
  PT_GRID_STRIDE(i, n) y[i] = static_cast<To>(x[i]);
}

__global__ void fill_kernel(unsigned char* y, unsigned char v, int64_t n) {
  PT_GRID_STRIDE(i, n) y[i] = v;
}

__global__ void broadcast_matrix_kernel(int64_t m, int64_t n, int64_t sm, int64_t sn,
                                        const float* c, float* y) {
  PT_GRID_STRIDE(i, m * n) y[i] = c[(i / n) * sm + (i % n) * sn];
}

// SeededDropout's counter-based generator, as core/pipetrain_ops.h specifies it (the CPU's is
// exec/cpu/seeded_uniform.h): mix is splitmix64's finaliser, base = mix(key ^ mix(stream)),
// u(i) = (mix(base + (i + 1) * G) >> 40) / 2^24 with G = 0x9e3779b97f4a7c15 (mod 2^64).
__device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ inline float seeded_uniform(uint64_t base, int64_t i) {
  const uint64_t r = mix64(base + (static_cast<uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ull);
  return static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
}

__global__ void seeded_dropout_kernel(int64_t n, float ratio, float scale, int64_t stream_id,
                                      const float* x, const int64_t* key, float* y, bool* mask) {
  const uint64_t base = mix64(static_cast<uint64_t>(*key) ^ mix64(static_cast<uint64_t>(stream_id)));
  PT_GRID_STRIDE(i, n) {
    const bool keep = seeded_uniform(base, i) >= ratio;
    y[i] = keep ? x[i] * scale : 0.f;
    if (mask) mask[i] = keep;
  }
}

__global__ void seeded_bernoulli_kernel(int64_t n, int64_t stream_id, const float* p,
                                        const int64_t* key, float* y) {
  const uint64_t base = mix64(static_cast<uint64_t>(*key) ^ mix64(static_cast<uint64_t>(stream_id)));
  PT_GRID_STRIDE(i, n) y[i] = seeded_uniform(base, i) < p[i] ? 1.f : 0.f;
}

// ---- gradients --------------------------------------------------------------------------------

__device__ float grad_factor(GradOp op, float s) {
  switch (op) {
    case GradOp::kRelu: return s > 0.f ? 1.f : 0.f;
    case GradOp::kErf: return k2OverSqrtPi * expf(-s * s);
    case GradOp::kGeluErf:
      return 0.5f * (1.f + erff(s * kInvSqrt2)) + s * expf(-0.5f * s * s) * kInvSqrt2Pi;
    case GradOp::kGeluTanh: {
      const float t = tanhf(kSqrt2OverPi * (s + 0.044715f * s * s * s));
      return 0.5f * (1.f + t) +
             0.5f * s * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * 0.044715f * s * s);
    }
  }
  return 0.f;
}

__global__ void unary_grad_kernel(GradOp op, int64_t n, const float* dy, const float* saved,
                                  float* dx) {
  // ReluGrad is a select (dY * 1 would turn -0 and NaN the way the CPU's select does not).
  if (op == GradOp::kRelu) {
    PT_GRID_STRIDE(i, n) dx[i] = saved[i] > 0.f ? dy[i] : 0.f;
    return;
  }
  PT_GRID_STRIDE(i, n) dx[i] = dy[i] * grad_factor(op, saved[i]);
}

__global__ void clip_grad_kernel(int64_t n, const float* dy, const float* x, ClipBound lo_b,
                                 ClipBound hi_b, float* dx) {
  const float lo = lo_b.none ? -INFINITY : bound<float>(lo_b);
  const float hi = hi_b.none ? INFINITY : bound<float>(hi_b);
  PT_GRID_STRIDE(i, n) dx[i] = lo < x[i] && x[i] < hi ? dy[i] : 0.f;
}

}  // namespace

bool binary_supported(BinaryOp op, DType a, DType b) {
  switch (op) {
    case BinaryOp::kPow: return allowed(a, kPowTypes) && allowed(b, kPowTypes);
    case BinaryOp::kEqual: return a == b && allowed(a, kValue);
    case BinaryOp::kLess:
    case BinaryOp::kGreater:
    case BinaryOp::kLessEqual:
    case BinaryOp::kGreaterEqual:
    case BinaryOp::kFmod:
    case BinaryOp::kFloorMod: return a == b && allowed(a, kOrdered);
    case BinaryOp::kAnd:
    case BinaryOp::kOr:
    case BinaryOp::kXor: return a == DType::kBool && b == DType::kBool;
    default: return a == b && allowed(a, kArith);
  }
}

bool binary_gives_bool(BinaryOp op) { return op >= BinaryOp::kEqual; }

void launch_ternary(BinaryOp op, DType t, const Broadcast& bc, const void* a, const void* b,
                    const void* c, void* y, cudaStream_t s) {
  if (bc.numel == 0) return;
  const bool done = visit(t, kArith, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto *pa = static_cast<const T*>(a), *pb = static_cast<const T*>(b), *pc = static_cast<const T*>(c);
    auto* py = static_cast<T*>(y);
    const unsigned grid = grid_for(bc.numel);
    if (op == BinaryOp::kMax)
      ternary_kernel<int64_t, T, MaxOp><<<grid, kThreads, 0, s>>>(bc, pa, pb, pc, py);
    else
      ternary_kernel<int64_t, T, MinOp><<<grid, kThreads, 0, s>>>(bc, pa, pb, pc, py);
    PT_CUDA_LAUNCH_CHECK();
  });
  PT_CHECK(done && (op == BinaryOp::kMax || op == BinaryOp::kMin), "no CUDA ternary kernel for this op or dtype");
}

void launch_binary(BinaryOp op, DType a, DType b, const Broadcast& bc, const void* pa,
                   const void* pb, void* py, cudaStream_t s) {
  bool done = false;
  if (op == BinaryOp::kPow) {
    done = visit(a, kPowTypes, [&](auto ta) {
      using A = typename decltype(ta)::type;
      visit(b, kPowTypes, [&](auto tb) {
        using B = typename decltype(tb)::type;
        binary<A, B, A, PowOp>(bc, pa, pb, py, s);
      });
    });
  } else if (op == BinaryOp::kEqual) {
    done = visit(a, kValue, [&](auto t) {
      using T = typename decltype(t)::type;
      binary<T, T, bool, EqualOp>(bc, pa, pb, py, s);
    });
  } else if (op == BinaryOp::kLess || op == BinaryOp::kGreater || op == BinaryOp::kLessEqual ||
             op == BinaryOp::kGreaterEqual) {
    done = visit(a, kOrdered, [&](auto t) {
      using T = typename decltype(t)::type;
      switch (op) {
        case BinaryOp::kLess: binary<T, T, bool, LessOp>(bc, pa, pb, py, s); break;
        case BinaryOp::kGreater: binary<T, T, bool, GreaterOp>(bc, pa, pb, py, s); break;
        case BinaryOp::kLessEqual: binary<T, T, bool, LessEqualOp>(bc, pa, pb, py, s); break;
        default: binary<T, T, bool, GreaterEqualOp>(bc, pa, pb, py, s); break;
      }
    });
  } else if (op == BinaryOp::kAnd || op == BinaryOp::kOr || op == BinaryOp::kXor) {
    done = a == DType::kBool && b == DType::kBool;
    if (done && op == BinaryOp::kAnd) binary<bool, bool, bool, AndOp>(bc, pa, pb, py, s);
    else if (done && op == BinaryOp::kOr) binary<bool, bool, bool, OrOp>(bc, pa, pb, py, s);
    else if (done) binary<bool, bool, bool, XorOp>(bc, pa, pb, py, s);
  } else if (op == BinaryOp::kFmod || op == BinaryOp::kFloorMod) {
    done = visit(a, kOrdered, [&](auto t) {
      using T = typename decltype(t)::type;
      if (op == BinaryOp::kFmod) binary<T, T, T, FmodOp>(bc, pa, pb, py, s);
      else binary<T, T, T, FloorModOp>(bc, pa, pb, py, s);
    });
  } else {
    done = visit(a, kArith, [&](auto t) {
      using T = typename decltype(t)::type;
      switch (op) {
        case BinaryOp::kAdd: binary<T, T, T, AddOp>(bc, pa, pb, py, s); break;
        case BinaryOp::kSub: binary<T, T, T, SubOp>(bc, pa, pb, py, s); break;
        case BinaryOp::kMul: binary<T, T, T, MulOp>(bc, pa, pb, py, s); break;
        case BinaryOp::kMin: binary<T, T, T, MinOp>(bc, pa, pb, py, s); break;
        case BinaryOp::kMax: binary<T, T, T, MaxOp>(bc, pa, pb, py, s); break;
        default: binary<T, T, T, DivOp>(bc, pa, pb, py, s); break;
      }
    });
  }
  PT_CHECK(done, "no CUDA binary kernel for these dtypes");
}

bool where_supported(DType t) { return allowed(t, kValue); }

void launch_where(DType t, const Broadcast& bc, const void* cond, const void* x, const void* z,
                  void* y, cudaStream_t s) {
  if (bc.numel == 0) return;
  const bool done = visit(t, kValue, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* c = static_cast<const bool*>(cond);
    const auto *px = static_cast<const T*>(x), *pz = static_cast<const T*>(z);
    auto* py = static_cast<T*>(y);
    if (narrow_index(bc.numel))
      where_kernel<uint32_t, T><<<grid_for(bc.numel), kThreads, 0, s>>>(bc, c, px, pz, py);
    else
      where_kernel<int64_t, T><<<grid_for(bc.numel), kThreads, 0, s>>>(bc, c, px, pz, py);
    PT_CUDA_LAUNCH_CHECK();
  });
  PT_CHECK(done, "no CUDA Where kernel for this dtype");
}

// The dtypes each unary op takes, as the CPU's.
unsigned unary_types(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg:
    case UnaryOp::kAbs: return kNegTypes;
    case UnaryOp::kFloor:
    case UnaryOp::kCeil:
    case UnaryOp::kExp: return kFloatTypes;
    case UnaryOp::kNot: return kBool;
    default: return kF32;
  }
}

bool unary_supported(UnaryOp op, DType t) { return allowed(t, unary_types(op)); }

void launch_unary(UnaryOp op, DType t, int64_t n, const void* x, void* y, cudaStream_t s) {
  if (n == 0) return;
  const bool done = visit(t, unary_types(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_kernel<T><<<grid_for(n), kThreads, 0, s>>>(op, n, static_cast<const T*>(x),
                                                     static_cast<T*>(y));
    PT_CUDA_LAUNCH_CHECK();
  });
  PT_CHECK(done, "no CUDA unary kernel for this dtype");
}

void launch_hard_sigmoid(int64_t n, float alpha, float beta, bool swish, const float* x, float* y,
                         cudaStream_t s) {
  if (n == 0) return;
  hard_sigmoid_kernel<<<grid_for(n), kThreads, 0, s>>>(n, alpha, beta, swish, x, y);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_is_nan(int64_t n, const float* x, bool* y, cudaStream_t s) {
  if (n == 0) return;
  is_nan_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, y);
  PT_CUDA_LAUNCH_CHECK();
}

bool clip_supported(DType t) { return allowed(t, kArith); }

void launch_clip(DType t, int64_t n, const void* x, ClipBound lo, ClipBound hi, void* y,
                 cudaStream_t s) {
  if (n == 0) return;
  const bool done = visit(t, kArith, [&](auto tag) {
    using T = typename decltype(tag)::type;
    clip_kernel<T><<<grid_for(n), kThreads, 0, s>>>(n, static_cast<const T*>(x), lo, hi,
                                                    static_cast<T*>(y));
    PT_CUDA_LAUNCH_CHECK();
  });
  PT_CHECK(done, "no CUDA Clip kernel for this dtype");
}

bool cast_supported(DType from, DType to) { return allowed(from, kValue) && allowed(to, kValue); }

void launch_cast(DType from, DType to, int64_t n, const void* x, void* y, cudaStream_t s) {
  if (n == 0) return;
  const bool done = visit(from, kValue, [&](auto tf) {
    using From = typename decltype(tf)::type;
    visit(to, kValue, [&](auto tt) {
      using To = typename decltype(tt)::type;
      cast_kernel<From, To><<<grid_for(n), kThreads, 0, s>>>(n, static_cast<const From*>(x),
                                                             static_cast<To*>(y));
      PT_CUDA_LAUNCH_CHECK();
    });
  });
  PT_CHECK(done, "no CUDA Cast kernel for these dtypes");
}

void launch_fill_bytes(void* y, unsigned char value, int64_t bytes, cudaStream_t s) {
  if (bytes == 0) return;
  fill_kernel<<<grid_for(bytes), kThreads, 0, s>>>(static_cast<unsigned char*>(y), value, bytes);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_broadcast_matrix(int64_t m, int64_t n, int64_t c_rows, int64_t c_cols,
                             const float* c, float* y, cudaStream_t s) {
  if (m * n == 0) return;
  const int64_t sm = c_rows == 1 ? 0 : c_cols, sn = c_cols == 1 ? 0 : 1;
  broadcast_matrix_kernel<<<grid_for(m * n), kThreads, 0, s>>>(m, n, sm, sn, c, y);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_seeded_dropout(int64_t n, float ratio, float scale, int64_t stream_id, const float* x,
                           const int64_t* key, float* y, bool* mask, cudaStream_t s) {
  if (n == 0) return;
  seeded_dropout_kernel<<<grid_for(n), kThreads, 0, s>>>(n, ratio, scale, stream_id, x, key, y,
                                                         mask);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_seeded_bernoulli(int64_t n, int64_t stream_id, const float* p, const int64_t* key,
                             float* y, cudaStream_t s) {
  if (n == 0) return;
  seeded_bernoulli_kernel<<<grid_for(n), kThreads, 0, s>>>(n, stream_id, p, key, y);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_unary_grad(GradOp op, int64_t n, const float* dy, const float* saved, float* dx,
                       cudaStream_t s) {
  if (n == 0) return;
  unary_grad_kernel<<<grid_for(n), kThreads, 0, s>>>(op, n, dy, saved, dx);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_clip_grad(int64_t n, const float* dy, const float* x, ClipBound lo, ClipBound hi,
                      float* dx, cudaStream_t s) {
  if (n == 0) return;
  clip_grad_kernel<<<grid_for(n), kThreads, 0, s>>>(n, dy, x, lo, hi, dx);
  PT_CUDA_LAUNCH_CHECK();
}

}  // namespace pt::cuda
