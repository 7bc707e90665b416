// exec/cpu/elementwise.cc: the broadcasting half of the element-wise family (see cpu_kernels.h):
// Add, Sub, Mul, Div, Pow, Mod, Min, Max, the comparisons (Equal, Less, Greater, LessOrEqual,
// GreaterOrEqual), And, Or, Xor and Where under numpy broadcasting (shapes right-aligned, rank
// <= 6). fp32 Add/Sub/Mul/Div run on oneDNN's binary primitive when the output has the shape of
// an operand (the first, for Div); the rest are plain loops over broadcast strides computed once.
// The unary half (activations, Clip, Cast, Dropout) is in elementwise_ops.cc.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dispatch.h"
#include "exec/cpu/dnnl_kernel.h"
#include "exec/cpu/dnnl_util.h"
#include "exec/cpu/parallel.h"
#include "exec/cpu/vector_clones.h"

namespace pt::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements below which a loop stays on one thread
constexpr int64_t kChunk = 1 << 12;        // elements of one row handled by one parallel task

// ---- dtype dispatch (exec/cpu/dispatch.h) ----------------------------------------------

using ArithTypes = TypeList<float, double, int32_t, int64_t, int8_t, uint8_t>;  // Add..Div
using PowTypes = TypeList<float, double, int32_t, int64_t>;  // Pow's base and exponent
using ValueTypes = TypeList<float, double, int32_t, int64_t, int8_t, uint8_t, bool>;  // Equal, Where
using OrderedTypes = TypeList<float, double, int32_t, int64_t, int8_t, uint8_t>;  // Less, ..., Mod

// ---- broadcasting ---------------------------------------------------------------------------

// Numpy broadcasting of up to three operands into one output (BroadcastGeometry,
// exec/kernel_geometry.h), computed once per kernel, and walked here.
struct Broadcast : BroadcastGeometry {
  // Offsets of the three operands at the first element of row `row` (all dims but the last).
  std::array<int64_t, 3> row_offsets(int64_t row) const {
    std::array<int64_t, 3> off{};
    for (int d = rank - 2; d >= 0; --d) {
      const int64_t i = row % dims[d];
      row /= dims[d];
      for (int k = 0; k < 3; ++k) off[k] += i * strides[k][d];
    }
    return off;
  }

  // Calls f(i, a, b, c) for every output index i with the offsets a, b, c of operands 0..2.
  // Tasks are chunks of rows, run in parallel when the output is large.
  template <class F>
  void for_each(int threads, F f) const {
    if (numel == 0) return;
    const int64_t inner = dims[rank - 1];
    const int64_t chunks = (inner + kChunk - 1) / kChunk;
    const int64_t tasks = numel / inner * chunks;
    const int64_t s0 = strides[0][rank - 1], s1 = strides[1][rank - 1], s2 = strides[2][rank - 1];
    parallel_for(tasks, threads, numel >= kParallelMin, [&](int64_t t) {
      const int64_t row = t / chunks, begin = t % chunks * kChunk;
      const int64_t end = std::min(inner, begin + kChunk);
      const std::array<int64_t, 3> off = row_offsets(row);
      for (int64_t j = begin; j < end; ++j)
        f(row * inner + j, off[0] + j * s0, off[1] + j * s1, off[2] + j * s2);
    });
  }
};

// Broadcast of the spec's inputs 0..n-1 (n <= 3) into output 0 (broadcast_geometry).
std::optional<Broadcast> make_broadcast(const KernelSpec& s, int n) {
  const auto g = broadcast_geometry(s, n);
  if (!g) return std::nullopt;
  return Broadcast{*g};
}

// ---- plain kernels --------------------------------------------------------------------------

struct AddOp {
  template <class T> T operator()(T a, T b) const { return a + b; }
};
struct SubOp {
  template <class T> T operator()(T a, T b) const { return a - b; }
};
struct MulOp {
  template <class T> T operator()(T a, T b) const { return a * b; }
};
// Integer division truncates toward zero (as C++ and onnxruntime); x / 0 gives 0, not a trap.
struct DivOp {
  template <class T> T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) return b == 0 ? T(0) : T(a / b);
    else return a / b;
  }
};
// y = a^b in the base's type: fp32^fp32 in float, any other pair through double.
struct PowOp {
  template <class A, class B> A operator()(A a, B b) const {
    if constexpr (std::is_same_v<A, float> && std::is_same_v<B, float>) return std::pow(a, b);
    else return static_cast<A>(std::pow(static_cast<double>(a), static_cast<double>(b)));
  }
};
struct EqualOp {
  template <class T> bool operator()(T a, T b) const { return a == b; }
};
struct LessOp {
  template <class T> bool operator()(T a, T b) const { return a < b; }
};
struct GreaterOp {
  template <class T> bool operator()(T a, T b) const { return a > b; }
};
struct LessOrEqualOp {
  template <class T> bool operator()(T a, T b) const { return a <= b; }
};
struct GreaterOrEqualOp {
  template <class T> bool operator()(T a, T b) const { return a >= b; }
};
struct AndOp {
  bool operator()(bool a, bool b) const { return a && b; }
};
struct OrOp {
  bool operator()(bool a, bool b) const { return a || b; }
};
struct XorOp {
  bool operator()(bool a, bool b) const { return a != b; }
};
// NaN wins, as numpy's maximum and minimum (and PyTorch's) give it.
struct MaxOp {
  template <class T> T operator()(T a, T b) const { return a != a || a > b ? a : b; }
};
struct MinOp {
  template <class T> T operator()(T a, T b) const { return a != a || a < b ? a : b; }
};
// fmod = 1: the remainder of truncated division, the dividend's sign (C's fmod and %); x mod 0
// gives NaN for floats and 0 for integers (no trap).
struct FmodOp {
  template <class T> T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) return b == 0 ? T(0) : T(a % b);
    else return std::fmod(a, b);
  }
};
// fmod = 0: the remainder of floored division, the divisor's sign (Python's and numpy's %);
// x mod 0 gives 0 for integers, NaN for floats.
struct FloorModOp {
  template <class T> T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) return T(0);
      const T r = T(a % b);
      return r != 0 && ((r < 0) != (b < 0)) ? T(r + b) : r;
    } else {
      const T r = std::fmod(a, b);
      if (r == 0) return std::copysign(T(0), b);  // a zero takes the divisor's sign, as numpy's
      return (r < 0) != (b < 0) ? T(r + b) : r;
    }
  }
};

// y[i] = Op(Op(a[ia], b[ib]), c[ic]) under numpy broadcasting of three operands (Min and Max of
// three inputs).
template <class T, class Op>
class BroadcastTernary final : public Kernel {
 public:
  BroadcastTernary(const Broadcast& bc, int threads) : bc_(bc), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const T* a = in[0].as<const T>();
    const T* b = in[1].as<const T>();
    const T* c = in[2].as<const T>();
    T* y = out[0].as<T>();
    bc_.for_each(threads_, [=](int64_t i, int64_t ia, int64_t ib, int64_t ic) {
      y[i] = Op{}(Op{}(a[ia], b[ib]), c[ic]);
    });
  }

 private:
  Broadcast bc_;
  int threads_;
};

// y[i] = Op(a[ia], b[ib]) under numpy broadcasting. a: A, b: B, y: Y.
template <class A, class B, class Y, class Op>
class BroadcastBinary final : public Kernel {
 public:
  BroadcastBinary(const Broadcast& bc, int threads) : bc_(bc), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const A* a = in[0].as<const A>();
    const B* b = in[1].as<const B>();
    Y* y = out[0].as<Y>();
    bc_.for_each(threads_, [=](int64_t i, int64_t ia, int64_t ib, int64_t) {
      y[i] = Op{}(a[ia], b[ib]);
    });
  }

 private:
  Broadcast bc_;
  int threads_;
};

// y[i] = cond[ic] ? x[ix] : z[iz] under numpy broadcasting of all three. cond: bool; x, z, y: T.
template <class T>
class WhereKernel final : public Kernel {
 public:
  WhereKernel(const Broadcast& bc, int threads) : bc_(bc), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const bool* c = in[0].as<const bool>();
    const T* x = in[1].as<const T>();
    const T* z = in[2].as<const T>();
    T* y = out[0].as<T>();
    bc_.for_each(threads_, [=](int64_t i, int64_t ic, int64_t ix, int64_t iz) {
      y[i] = c[ic] ? x[ix] : z[iz];
    });
  }

 private:
  Broadcast bc_;
  int threads_;
};

// ---- oneDNN kernels -------------------------------------------------------------------------

enum class Arith { kAdd, kSub, kMul, kDiv };

// The oneDNN form of an fp32 Add/Sub/Mul/Div, or nullptr where it does not fit: the output must
// have input 0's shape, or input 1's for Add and Mul (operands swapped) and Sub (swapped, then
// negated by a linear post-op: a - b = -(b - a) exactly).
std::unique_ptr<Kernel> make_dnnl_binary(const KernelSpec& s, Arith op) {
  using dnnl::algorithm;
  const std::vector<int64_t>& out = s.outputs[0].shape;
  const auto a = align_to_rank(s.inputs[0].shape, out.size());
  const auto b = align_to_rank(s.inputs[1].shape, out.size());
  if (!a || !b || s.outputs[0].numel() == 0) return nullptr;
  const bool swap = *a != out;
  if (swap && (*b != out || op == Arith::kDiv)) return nullptr;
  const algorithm alg = op == Arith::kAdd   ? algorithm::binary_add
                        : op == Arith::kSub ? algorithm::binary_sub
                        : op == Arith::kMul ? algorithm::binary_mul
                                            : algorithm::binary_div;
  dnnl::primitive_attr attr;
  if (swap && op == Arith::kSub) {
    dnnl::post_ops negate;
    negate.append_eltwise(1.f, algorithm::eltwise_linear, -1.f, 0.f);
    attr.set_post_ops(negate);
  }
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // src0 is the input of the output's shape: input 1 when swapped (input 0 broadcasts).
  const memory::desc md0 = plain_desc(DType::kFloat32, swap ? *b : *a);
  const memory::desc md1 = plain_desc(DType::kFloat32, swap ? *a : *b);
  const memory::desc mdy = plain_desc(DType::kFloat32, out);
  const int threads = elementwise_threads(s.outputs[0].numel(), s.cpu->threads);
  return build_or_null(s, [&]() -> std::unique_ptr<Kernel> {  // nullptr: the plain loop runs it
    auto k = std::make_unique<DnnlKernel>(*s.cpu, threads);
    const dnnl::binary::primitive_desc pd({alg, md0, md1, mdy}, attr, k->engine());
    // oneDNN's reference loop (on AVX2 it takes some broadcasts its jit kernel takes on AVX-512,
    // Qwen3's per-head RMSNorm division of 2 x 8 x 2 x 16 by 2 x 8 x 2 x 1): the plain loop,
    // vectorised, gives the same bits (one IEEE operation per element).
    if (implementation_is(pd, "ref")) return nullptr;
    k->add_step(dnnl::binary(pd), pd.scratchpad_desc(),
                {{DNNL_ARG_SRC_0, md0, {Place::kInput, swap ? 1u : 0u}},
                 {DNNL_ARG_SRC_1, md1, {Place::kInput, swap ? 0u : 1u}},
                 {DNNL_ARG_DST, mdy, {Place::kOutput, 0}}});
    return k;
  }, threads);
}

// ---- small fp32 kernels ---------------------------------------------------------------------

// y[i] = Op(a[i % na], b[i % nb]) for i in [0, n), in rows of the shorter operand's length: an
// operand of the output's shape, or of its trailing dims (a rotary table, a row of biases, one
// element), repeated. Each row's loop is compiled per ISA (vector_clones.h).
template <class Op>
PT_VECTOR_CLONES void arith_rows(const float* a, const float* b, float* y, int64_t n, int64_t na, int64_t nb) {
  const int64_t row = std::min(na, nb);
  if (row == 1) {  // one operand a single element
    for (int64_t i = 0; i < n; ++i) y[i] = Op{}(na == 1 ? a[0] : a[i], nb == 1 ? b[0] : b[i]);
    return;
  }
  for (int64_t r = 0; r < n; r += row) {
    const float* ar = a + (na == n ? r : 0);
    const float* br = b + (nb == n ? r : 0);
    float* yr = y + r;
    for (int64_t i = 0; i < row; ++i) yr[i] = Op{}(ar[i], br[i]);
  }
}

// An fp32 Add, Sub or Mul below kParallelMin elements whose operands each have the output's shape
// or its trailing dims (a residual, a gradient summed, x * a rotary table, x * scale): one thread,
// no OpenMP region. oneDNN's binary primitive costs ~0.8 us a call whatever its size, most of such
// a kernel's time. Each element is one rounded operation either way: oneDNN's bits.
template <class Op>
class SmallArith final : public Kernel {
 public:
  SmallArith(int64_t n, int64_t na, int64_t nb) : n_(n), na_(na), nb_(nb) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    arith_rows<Op>(in[0].as<const float>(), in[1].as<const float>(), out[0].as<float>(), n_, na_, nb_);
  }

 private:
  int64_t n_, na_, nb_;
};

// Elements of `in` when it is the output's trailing dims (leading dims of 1 aside), else -1.
int64_t trailing_numel(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  size_t i = 0;
  while (i < in.size() && in[i] == 1) ++i;  // leading 1s
  const size_t rank = in.size() - i;
  if (rank > out.size()) return -1;
  int64_t n = 1;
  for (size_t k = 0; k < rank; ++k) {
    if (in[i + k] != out[out.size() - rank + k]) return -1;
    n *= in[i + k];
  }
  return n;
}

std::unique_ptr<Kernel> make_small_arith(const KernelSpec& s, Arith op) {
  const int64_t n = s.outputs[0].numel();
  if (op == Arith::kDiv || n == 0 || n >= kParallelMin) return nullptr;
  const int64_t na = trailing_numel(s.inputs[0].shape, s.outputs[0].shape);
  const int64_t nb = trailing_numel(s.inputs[1].shape, s.outputs[0].shape);
  if (na <= 0 || nb <= 0 || (na != n && nb != n)) return nullptr;
  if (op == Arith::kAdd) return std::make_unique<SmallArith<AddOp>>(n, na, nb);
  if (op == Arith::kSub) return std::make_unique<SmallArith<SubOp>>(n, na, nb);
  return std::make_unique<SmallArith<MulOp>>(n, na, nb);
}

// ---- factories ------------------------------------------------------------------------------

template <class A, class B, class Y, class Op>
std::unique_ptr<Kernel> plain_binary(const Broadcast& bc, const KernelSpec& s) {
  return std::make_unique<BroadcastBinary<A, B, Y, Op>>(bc, s.cpu->threads);
}

// Add, Sub, Mul, Div: a, b and y of one dtype (ArithTypes).
std::unique_ptr<Kernel> make_arith(const KernelSpec& s, Arith op) {
  if (!has_io(s, 2)) return nullptr;
  const DType t = s.inputs[0].dtype;
  if (s.inputs[1].dtype != t || s.outputs[0].dtype != t) return nullptr;
  const auto bc = make_broadcast(s, 2);
  if (!bc) return nullptr;
  if (t == DType::kFloat32) {
    if (auto k = make_small_arith(s, op)) return k;
    if (auto k = make_dnnl_binary(s, op)) return k;
  }
  return visit(ArithTypes{}, t, [&]<class T>() -> std::unique_ptr<Kernel> {
    switch (op) {
      case Arith::kAdd: return plain_binary<T, T, T, AddOp>(*bc, s);
      case Arith::kSub: return plain_binary<T, T, T, SubOp>(*bc, s);
      case Arith::kMul: return plain_binary<T, T, T, MulOp>(*bc, s);
      case Arith::kDiv: return plain_binary<T, T, T, DivOp>(*bc, s);
    }
    return nullptr;
  });
}

// y = x^2 or x^3 for float x and a float exponent of 2 or 3 (GPT-2's GELU cubes, and its
// gradient squares): x * x and x * x * x, as PyTorch's and onnxruntime's Pow take these
// exponents; x^1 is x (a squaring's gradient, autodiff's x^(2 - 1): RMSNorm's in Llama).
// std::pow per element took 7 ns an element, 14 us on GPT-2's 2 x 8 x 128.
template <int E>
PT_VECTOR_CLONES void power_loop(const float* x, float* y, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) y[i] = E == 2 ? x[i] * x[i] : x[i] * x[i] * x[i];
}

// y = x^e for a one-element float exponent e: the loops above where e is 1, 2 or 3, std::pow per
// element (PowOp's bits) otherwise. A constant e is read once when the kernel is made, a computed
// one at each run.
class SmallPower final : public Kernel {
 public:
  SmallPower(std::optional<float> exponent, int64_t n, int threads)
      : exponent_(exponent), n_(n), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* x = in[0].as<const float>();
    float* y = out[0].as<float>();
    const float e = exponent_ ? *exponent_ : in[1].as<const float>()[0];
    if (e == 1.f) {
      if (y != x) std::memcpy(y, x, static_cast<size_t>(n_) * sizeof(float));
      return;
    }
    for_blocks(n_, threads_, int64_t{1} << 16, [&](int64_t b, int64_t end) {
      if (e == 2.f) power_loop<2>(x, y, b, end);
      else if (e == 3.f) power_loop<3>(x, y, b, end);
      else for (int64_t i = b; i < end; ++i) y[i] = PowOp{}(x[i], e);
    });
  }

 private:
  std::optional<float> exponent_;
  int64_t n_;
  int threads_;
};

std::unique_ptr<Kernel> make_small_power(const KernelSpec& s) {
  if (s.inputs[0].dtype != DType::kFloat32 || s.inputs[1].dtype != DType::kFloat32 || s.inputs[1].numel() != 1 ||
      !(s.outputs[0] == s.inputs[0]))
    return nullptr;
  std::optional<float> exponent;
  if (const Tensor* e = s.constant(1)) exponent = e->as<float>()[0];
  return std::make_unique<SmallPower>(exponent, s.inputs[0].numel(), s.cpu->threads);
}

}  // namespace

std::unique_ptr<Kernel> make_add(const KernelSpec& s) { return make_arith(s, Arith::kAdd); }
std::unique_ptr<Kernel> make_sub(const KernelSpec& s) { return make_arith(s, Arith::kSub); }
std::unique_ptr<Kernel> make_mul(const KernelSpec& s) { return make_arith(s, Arith::kMul); }
std::unique_ptr<Kernel> make_div(const KernelSpec& s) { return make_arith(s, Arith::kDiv); }

// Pow(a: A, b: B) -> y: A, A and B in PowTypes.
std::unique_ptr<Kernel> make_pow(const KernelSpec& s) {
  if (!has_io(s, 2) || s.outputs[0].dtype != s.inputs[0].dtype) return nullptr;
  if (auto small = make_small_power(s)) return small;
  const auto bc = make_broadcast(s, 2);
  if (!bc) return nullptr;
  return visit(PowTypes{}, s.inputs[0].dtype, [&]<class A>() {
    return visit(PowTypes{}, s.inputs[1].dtype, [&]<class B>() {
      return plain_binary<A, B, A, PowOp>(*bc, s);
    });
  });
}

// Equal(a: T, b: T) -> y: bool, T in ValueTypes.
std::unique_ptr<Kernel> make_equal(const KernelSpec& s) {
  if (!has_io(s, 2) || s.inputs[1].dtype != s.inputs[0].dtype ||
      s.outputs[0].dtype != DType::kBool)
    return nullptr;
  const auto bc = make_broadcast(s, 2);
  if (!bc) return nullptr;
  return visit(ValueTypes{}, s.inputs[0].dtype, [&]<class T>() {
    return plain_binary<T, T, bool, EqualOp>(*bc, s);
  });
}

namespace {

// A comparison (a: T, b: T) -> y: bool, T in OrderedTypes.
template <class Op>
std::unique_ptr<Kernel> make_compare(const KernelSpec& s) {
  if (!has_io(s, 2) || s.inputs[1].dtype != s.inputs[0].dtype || s.outputs[0].dtype != DType::kBool)
    return nullptr;
  const auto bc = make_broadcast(s, 2);
  if (!bc) return nullptr;
  return visit(OrderedTypes{}, s.inputs[0].dtype, [&]<class T>() { return plain_binary<T, T, bool, Op>(*bc, s); });
}

// And, Or, Xor: bool, bool -> bool.
template <class Op>
std::unique_ptr<Kernel> make_logic(const KernelSpec& s) {
  if (!has_io(s, 2) || s.inputs[0].dtype != DType::kBool || s.inputs[1].dtype != DType::kBool ||
      s.outputs[0].dtype != DType::kBool)
    return nullptr;
  const auto bc = make_broadcast(s, 2);
  return bc ? plain_binary<bool, bool, bool, Op>(*bc, s) : nullptr;
}

// Min and Max of one to three inputs of one dtype (ArithTypes); one input is a copy.
template <class Op>
std::unique_ptr<Kernel> make_extreme(const KernelSpec& s) {
  const int n = static_cast<int>(s.inputs.size());
  if (n < 1 || n > 3 || !has_io(s, n)) return nullptr;
  const DType t = s.outputs[0].dtype;
  for (const TensorType& in : s.inputs)
    if (in.dtype != t) return nullptr;
  if (n == 1) return s.outputs[0] == s.inputs[0] ? make_reshape(s) : nullptr;
  const auto bc = make_broadcast(s, n);
  if (!bc) return nullptr;
  return visit(ArithTypes{}, t, [&]<class T>() -> std::unique_ptr<Kernel> {
    if (n == 2) return plain_binary<T, T, T, Op>(*bc, s);
    return std::make_unique<BroadcastTernary<T, Op>>(*bc, s.cpu->threads);
  });
}

}  // namespace

std::unique_ptr<Kernel> make_less(const KernelSpec& s) { return make_compare<LessOp>(s); }
std::unique_ptr<Kernel> make_greater(const KernelSpec& s) { return make_compare<GreaterOp>(s); }
std::unique_ptr<Kernel> make_less_or_equal(const KernelSpec& s) { return make_compare<LessOrEqualOp>(s); }
std::unique_ptr<Kernel> make_greater_or_equal(const KernelSpec& s) { return make_compare<GreaterOrEqualOp>(s); }
std::unique_ptr<Kernel> make_logical_and(const KernelSpec& s) { return make_logic<AndOp>(s); }
std::unique_ptr<Kernel> make_logical_or(const KernelSpec& s) { return make_logic<OrOp>(s); }
std::unique_ptr<Kernel> make_logical_xor(const KernelSpec& s) { return make_logic<XorOp>(s); }
std::unique_ptr<Kernel> make_min(const KernelSpec& s) { return make_extreme<MinOp>(s); }
std::unique_ptr<Kernel> make_max(const KernelSpec& s) { return make_extreme<MaxOp>(s); }

// Mod(a: T, b: T) -> y: T, T in OrderedTypes: fmod = 1 truncated, fmod = 0 floored (for floats
// too, as onnx's reference computes it).
std::unique_ptr<Kernel> make_mod(const KernelSpec& s) {
  if (!has_io(s, 2)) return nullptr;
  const DType t = s.inputs[0].dtype;
  if (s.inputs[1].dtype != t || s.outputs[0].dtype != t) return nullptr;
  const bool fmod = s.node.attr_int("fmod", 0) != 0;
  const auto bc = make_broadcast(s, 2);
  if (!bc) return nullptr;
  return visit(OrderedTypes{}, t, [&]<class T>() -> std::unique_ptr<Kernel> {
    if (fmod) return plain_binary<T, T, T, FmodOp>(*bc, s);
    return plain_binary<T, T, T, FloorModOp>(*bc, s);
  });
}

// Where(cond: bool, x: T, z: T) -> y: T, T in ValueTypes, all three broadcast.
std::unique_ptr<Kernel> make_where(const KernelSpec& s) {
  if (!has_io(s, 3) || s.inputs[0].dtype != DType::kBool) return nullptr;
  const DType t = s.inputs[1].dtype;
  if (s.inputs[2].dtype != t || s.outputs[0].dtype != t) return nullptr;
  const auto bc = make_broadcast(s, 3);
  if (!bc) return nullptr;
  return visit(ValueTypes{}, t, [&]<class T>() -> std::unique_ptr<Kernel> {
    return std::make_unique<WhereKernel<T>>(*bc, s.cpu->threads);
  });
}

}  // namespace pt::cpu
