// onnx_import/fold_ops.cc: the numeric folders of evaluate_constant (registered in fold.cc):
// Cast, Range, broadcasting binary and variadic math, unary math, reductions. Each is written
// once over the element type and instantiated through dispatch() for float32, float64, int64,
// int32, int8, uint8 and bool; any other dtype folds to nullopt.
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/ir.h"
#include "onnx_import/fold_detail.h"

namespace pt::fold_detail {

namespace {

// ---- Element types ----

// Calls f(T{}) with T the C++ type of `t`; nullopt for dtypes folding does not compute on.
template <class F>
Folded dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
    case DType::kInt64: return f(int64_t{});
    case DType::kInt32: return f(int32_t{});
    case DType::kInt8: return f(int8_t{});
    case DType::kUInt8: return f(uint8_t{});
    case DType::kBool: return f(bool{});
    default: return std::nullopt;
  }
}

// Which element types an op takes.
enum class Kinds { kAny, kBool, kNumeric, kSigned, kFloat };

template <class T>
constexpr bool accepts(Kinds k) {
  constexpr bool is_bool = std::is_same_v<T, bool>;
  switch (k) {
    case Kinds::kAny: return true;
    case Kinds::kBool: return is_bool;
    case Kinds::kNumeric: return !is_bool;
    case Kinds::kSigned: return !is_bool && std::is_signed_v<T>;
    case Kinds::kFloat: return std::is_floating_point_v<T>;
  }
  return false;
}

// Integer add/sub/mul wrap modulo 2^bits (two's complement) rather than overflow.
template <class T, class Op>
T wrapping(T a, T b, Op op) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(op(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return static_cast<T>(op(a, b));
  }
}

// One element as Cast converts it: x != 0 to bool, a C++ conversion otherwise; nullopt where
// that conversion is undefined (NaN or out of range, float to integer).
template <class To, class From>
std::optional<To> convert(From x) {
  if constexpr (std::is_same_v<To, bool>) {
    return x != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    const double t = std::trunc(static_cast<double>(x));
    const double lo = static_cast<double>(std::numeric_limits<To>::min());
    const double hi = static_cast<double>(std::numeric_limits<To>::max() / 2 + 1) * 2;  // max + 1
    if (!(t >= lo && t < hi)) return std::nullopt;
    return static_cast<To>(t);
  } else if constexpr (std::is_same_v<To, float> && std::is_same_v<From, double>) {
    if (std::isfinite(x) && std::abs(x) > std::numeric_limits<float>::max())
      return std::copysign(std::numeric_limits<float>::infinity(), static_cast<float>(x > 0 ? 1 : -1));
    return static_cast<float>(x);
  } else {
    return static_cast<To>(x);
  }
}

// ---- Cast and Range ----

Folded cast_to(const Tensor& x, DType to) {
  return dispatch(x.type.dtype, [&](auto from) -> Folded {
    using F = decltype(from);
    return dispatch(to, [&](auto to_tag) -> Folded {
      using T = decltype(to_tag);
      Tensor out = new_tensor(to, x.type.shape);
      for (int64_t i = 0; i < x.type.numel(); ++i) {
        std::optional<T> v = convert<T>(x.as<F>()[i]);
        if (!v) return std::nullopt;
        out.as<T>()[i] = *v;
      }
      return one(std::move(out));
    });
  });
}

}  // namespace

Folded fold_cast(const Node& node, const Inputs& in, int64_t) {
  return cast_to(*in[0], static_cast<DType>(node.attr_int("to", 0)));
}

Folded fold_cast_like(const Node&, const Inputs& in, int64_t) {
  return cast_to(*in[0], in[1]->type.dtype);
}

namespace {

// Number of Range elements, max(0, ceil((limit - start) / delta)), without overflow.
template <class T>
std::optional<int64_t> range_length(T start, T limit, T delta) {
  if constexpr (std::is_integral_v<T>) {
    const bool up = delta > 0;
    if (up ? limit <= start : start <= limit) return 0;
    const auto span = up ? static_cast<uint64_t>(limit) - static_cast<uint64_t>(start)
                         : static_cast<uint64_t>(start) - static_cast<uint64_t>(limit);
    const auto step = up ? static_cast<uint64_t>(delta) : uint64_t{0} - static_cast<uint64_t>(delta);
    return static_cast<int64_t>((span - 1) / step + 1);
  } else {
    const double n = std::ceil((static_cast<double>(limit) - start) / delta);
    if (!std::isfinite(n)) return std::nullopt;
    return n > 0 ? static_cast<int64_t>(n) : 0;
  }
}

}  // namespace

// Range: out[i] = start + i * delta for i in [0, range_length).
Folded fold_range(const Node& node, const Inputs& in, int64_t) {
  const Tensor &s = *in[0], &l = *in[1], &d = *in[2];
  if (s.type.dtype != l.type.dtype || s.type.dtype != d.type.dtype) return std::nullopt;
  if (s.type.numel() != 1 || l.type.numel() != 1 || d.type.numel() != 1) return std::nullopt;
  return dispatch(s.type.dtype, [&](auto tag) -> Folded {
    using T = decltype(tag);
    if constexpr (!accepts<T>(Kinds::kNumeric)) {
      return std::nullopt;
    } else {
      const T start = s.as<T>()[0], delta = d.as<T>()[0];
      if (delta == 0) fail(node, "delta is 0");
      std::optional<int64_t> n = range_length(start, l.as<T>()[0], delta);
      if (!n) return std::nullopt;
      Tensor out = new_tensor(s.type.dtype, {*n});
      for (int64_t i = 0; i < *n; ++i) {
        if constexpr (std::is_integral_v<T>)
          out.as<T>()[i] = static_cast<T>(static_cast<int64_t>(start) + i * static_cast<int64_t>(delta));
        else
          out.as<T>()[i] = static_cast<T>(start + static_cast<T>(i) * delta);
      }
      return one(std::move(out));
    }
  });
}

namespace {

// ---- Broadcasting families ----

// out[i] = fn(a[ia[i]], b[ib[i]]) over the broadcast shape of a and b.
template <class Out, class A, class B, class Fn>
Tensor broadcast_map(const Node& node, const Tensor& a, const Tensor& b, Fn fn) {
  const std::vector<int64_t> shape = broadcast_shape(node, {a.type.shape, b.type.shape});
  const std::vector<int64_t> ia = broadcast_offsets(a.type.shape, shape);
  const std::vector<int64_t> ib = broadcast_offsets(b.type.shape, shape);
  Tensor out = new_tensor(dtype_of<Out>(), shape);
  for (size_t i = 0; i < ia.size(); ++i)
    out.as<Out>()[i] = static_cast<Out>(fn(a.as<A>()[ia[i]], b.as<B>()[ib[i]]));
  return out;
}

// Binary op on two inputs of one dtype of kind K; the output is that dtype, or bool when
// kToBool (comparisons).
template <Kinds K, bool kToBool, class Fn>
Folded binary(const Node& node, const Tensor* a, const Tensor* b, Fn fn) {
  if (a->type.dtype != b->type.dtype) return std::nullopt;
  return dispatch(a->type.dtype, [&](auto tag) -> Folded {
    using T = decltype(tag);
    using Out = std::conditional_t<kToBool, bool, T>;
    if constexpr (!accepts<T>(K)) return std::nullopt;
    else return one(broadcast_map<Out, T, T>(node, *a, *b, [&](T x, T y) { return fn(x, y); }));
  });
}

// Min/Max over any number of inputs, folded pairwise (broadcasting is associative).
template <class Fn>
Folded variadic(const Node& node, const Inputs& in, Fn fn) {
  Folded acc = one(*in[0]);
  for (size_t i = 1; i < in.size() && acc; ++i) {
    if (!in[i]) return std::nullopt;
    acc = binary<Kinds::kNumeric, false>(node, &(*acc)[0], in[i], fn);
  }
  return acc;
}

// max/min that propagate NaN, as numpy's maximum/minimum do.
constexpr auto kMax = [](auto a, auto b) { return (b > a || b != b) && !(a != a) ? b : a; };
constexpr auto kMin = [](auto a, auto b) { return (b < a || b != b) && !(a != a) ? b : a; };

// base^exponent over integers by squaring, wrapping on overflow; exponent >= 0.
template <class T, class E>
T int_pow(T base, E exponent) {
  T result = 1;
  for (auto e = static_cast<uint64_t>(exponent); e != 0; e >>= 1) {
    if (e & 1) result = wrapping(result, base, std::multiplies<>());
    base = wrapping(base, base, std::multiplies<>());
  }
  return result;
}

// Pow-15 with base type T and exponent type E; the output has the base's type.
template <class T, class E>
Folded pow_typed(const Node& node, const Tensor& a, const Tensor& b) {
  if constexpr (std::is_same_v<T, bool> || std::is_same_v<E, bool>) {
    return std::nullopt;
  } else if constexpr (std::is_integral_v<T> && std::is_integral_v<E>) {
    for (int64_t i = 0; i < b.type.numel(); ++i)
      if (b.as<E>()[i] < 0) return std::nullopt;  // integer to a negative power
    return one(broadcast_map<T, T, E>(node, a, b, int_pow<T, E>));
  } else {
    bool ok = true;
    Tensor out = broadcast_map<T, T, E>(node, a, b, [&ok](T x, E y) {
      std::optional<T> v = convert<T>(std::pow(static_cast<double>(x), static_cast<double>(y)));
      ok = ok && v.has_value();
      return v.value_or(T{});
    });
    if (!ok) return std::nullopt;
    return one(std::move(out));
  }
}

// Integer Div truncates toward zero, as C does.
template <class T>
T divide(const Node& node, T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    if (y == 0) fail(node, "integer division by zero");
    if constexpr (std::is_signed_v<T>)
      if (y == -1) return wrapping(T{0}, x, std::minus<>());
  }
  return static_cast<T>(x / y);
}

}  // namespace

Folded fold_add(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kNumeric, false>(node, in[0], in[1],
                                        [](auto x, auto y) { return wrapping(x, y, std::plus<>()); });
}

Folded fold_sub(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kNumeric, false>(node, in[0], in[1],
                                        [](auto x, auto y) { return wrapping(x, y, std::minus<>()); });
}

Folded fold_mul(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kNumeric, false>(
      node, in[0], in[1], [](auto x, auto y) { return wrapping(x, y, std::multiplies<>()); });
}

Folded fold_div(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kNumeric, false>(node, in[0], in[1],
                                        [&node](auto x, auto y) { return divide(node, x, y); });
}

Folded fold_pow(const Node& node, const Inputs& in, int64_t) {
  return dispatch(in[0]->type.dtype, [&](auto base) -> Folded {
    return dispatch(in[1]->type.dtype, [&](auto exponent) -> Folded {
      return pow_typed<decltype(base), decltype(exponent)>(node, *in[0], *in[1]);
    });
  });
}

Folded fold_min(const Node& node, const Inputs& in, int64_t) { return variadic(node, in, kMin); }
Folded fold_max(const Node& node, const Inputs& in, int64_t) { return variadic(node, in, kMax); }

Folded fold_equal(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kAny, true>(node, in[0], in[1], std::equal_to<>());
}
Folded fold_less(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kNumeric, true>(node, in[0], in[1], std::less<>());
}
Folded fold_less_or_equal(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kNumeric, true>(node, in[0], in[1], std::less_equal<>());
}
Folded fold_greater(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kNumeric, true>(node, in[0], in[1], std::greater<>());
}
Folded fold_greater_or_equal(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kNumeric, true>(node, in[0], in[1], std::greater_equal<>());
}

Folded fold_and(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kBool, false>(node, in[0], in[1], std::logical_and<>());
}
Folded fold_or(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kBool, false>(node, in[0], in[1], std::logical_or<>());
}
Folded fold_xor(const Node& node, const Inputs& in, int64_t) {
  return binary<Kinds::kBool, false>(node, in[0], in[1], std::not_equal_to<>());
}

// Mod: fmod=1 is C's fmod (the dividend's sign); fmod=0 takes the divisor's sign (floats too
// since opset 28).
Folded fold_mod(const Node& node, const Inputs& in, int64_t) {
  const bool c_fmod = node.attr_int("fmod", 0) != 0;
  return binary<Kinds::kNumeric, false>(node, in[0], in[1], [&](auto x, auto y) {
    using T = decltype(x);
    if constexpr (std::is_floating_point_v<T>) {
      const T r = std::fmod(x, y);
      return c_fmod || r == 0 || std::isnan(r) || ((r < 0) == (y < 0)) ? r : static_cast<T>(r + y);
    } else {
      if (y == 0) fail(node, "integer modulo by zero");
      if constexpr (std::is_signed_v<T>) {
        if (y == -1) return T{0};
        const T r = static_cast<T>(x % y);
        return c_fmod || r == 0 || ((r < 0) == (y < 0)) ? r : static_cast<T>(r + y);
      } else {
        return static_cast<T>(x % y);
      }
    }
  });
}

namespace {

// ---- Unary family ----

// out[i] = fn(x[i]) for x of kind K; same dtype and shape.
template <Kinds K, class Fn>
Folded unary(const Tensor& x, Fn fn) {
  return dispatch(x.type.dtype, [&](auto tag) -> Folded {
    using T = decltype(tag);
    if constexpr (!accepts<T>(K)) {
      return std::nullopt;
    } else {
      Tensor out = new_tensor(x.type.dtype, x.type.shape);
      for (int64_t i = 0; i < x.type.numel(); ++i) out.as<T>()[i] = static_cast<T>(fn(x.as<T>()[i]));
      return one(std::move(out));
    }
  });
}

// -x, wrapping for the most negative integer.
constexpr auto kNegate = [](auto x) { return wrapping(decltype(x){0}, x, std::minus<>()); };

}  // namespace

Folded fold_not(const Node&, const Inputs& in, int64_t) {
  return unary<Kinds::kBool>(*in[0], [](bool x) { return !x; });
}
Folded fold_neg(const Node&, const Inputs& in, int64_t) {
  return unary<Kinds::kSigned>(*in[0], kNegate);
}
Folded fold_abs(const Node&, const Inputs& in, int64_t) {
  return unary<Kinds::kNumeric>(*in[0], [](auto x) {
    if constexpr (std::is_floating_point_v<decltype(x)>) return std::abs(x);
    else if constexpr (std::is_unsigned_v<decltype(x)>) return x;
    else return x < 0 ? kNegate(x) : x;
  });
}
Folded fold_sqrt(const Node&, const Inputs& in, int64_t) {
  return unary<Kinds::kFloat>(*in[0], [](auto x) { return std::sqrt(x); });
}
Folded fold_floor(const Node&, const Inputs& in, int64_t) {
  return unary<Kinds::kFloat>(*in[0], [](auto x) { return std::floor(x); });
}
Folded fold_ceil(const Node&, const Inputs& in, int64_t) {
  return unary<Kinds::kFloat>(*in[0], [](auto x) { return std::ceil(x); });
}
Folded fold_reciprocal(const Node&, const Inputs& in, int64_t) {
  return unary<Kinds::kFloat>(*in[0], [](auto x) { return decltype(x){1} / x; });
}
Folded fold_sin(const Node&, const Inputs& in, int64_t) {
  return unary<Kinds::kFloat>(*in[0], [](auto x) { return std::sin(x); });
}
Folded fold_cos(const Node&, const Inputs& in, int64_t) {
  return unary<Kinds::kFloat>(*in[0], [](auto x) { return std::cos(x); });
}
Folded fold_exp(const Node&, const Inputs& in, int64_t) {
  return unary<Kinds::kFloat>(*in[0], [](auto x) { return std::exp(x); });
}
Folded fold_is_nan(const Node&, const Inputs& in, int64_t) {
  const Tensor& x = *in[0];
  return dispatch(x.type.dtype, [&](auto tag) -> Folded {
    using T = decltype(tag);
    if constexpr (!accepts<T>(Kinds::kFloat)) {
      return std::nullopt;
    } else {
      Tensor out = new_tensor(DType::kBool, x.type.shape);
      for (int64_t i = 0; i < x.type.numel(); ++i) out.as<bool>()[i] = std::isnan(x.as<T>()[i]);
      return one(std::move(out));
    }
  });
}

namespace {

// ---- Reductions ----

struct ReducePlan {
  bool noop = false;                // empty axes with noop_with_empty_axes: the input as is
  std::vector<int64_t> kept_shape;  // input shape with reduced dims set to 1
  std::vector<int64_t> out_shape;   // kept_shape, or without the reduced dims if !keepdims
};

// Axes come from the second input where present (ReduceSum-13, all Reduce*-18), else from the
// attribute; none means all.
std::optional<ReducePlan> plan_reduce(const Node& node, const Inputs& in) {
  const std::vector<int64_t>& s = in[0]->type.shape;
  std::vector<int64_t> axes = node.attr_ints("axes");
  if (in.size() > 1 && in[1]) {
    std::optional<std::vector<int64_t>> a = read_ints(in[1]);
    if (!a) return std::nullopt;
    axes = *a;
  }
  ReducePlan plan;
  plan.noop = axes.empty() && node.attr_int("noop_with_empty_axes", 0) != 0;
  std::vector<bool> reduced(s.size(), axes.empty());
  for (int64_t a : axes)
    reduced[static_cast<size_t>(normalize_axis(node, a, static_cast<int64_t>(s.size())))] = true;
  const bool keepdims = node.attr_int("keepdims", 1) != 0;
  for (size_t d = 0; d < s.size(); ++d) {
    plan.kept_shape.push_back(reduced[d] ? 1 : s[d]);
    if (!reduced[d] || keepdims) plan.out_shape.push_back(reduced[d] ? 1 : s[d]);
  }
  return plan;
}

// What an output no element lands on (a reduced dim of size 0) holds: the op's identity; for Max
// and Min (opset 18+) the lowest and highest value of the type (-inf and +inf for floats).
enum class Empty { kZero, kOne, kLowest, kHighest };

template <class T>
T empty_value(Empty e) {
  using L = std::numeric_limits<T>;
  switch (e) {
    case Empty::kZero: return T(0);
    case Empty::kOne: return T(1);
    case Empty::kLowest: return L::has_infinity ? -L::infinity() : L::lowest();
    case Empty::kHighest: return L::has_infinity ? L::infinity() : L::max();
  }
  return T(0);
}

// out[j] = fn-fold of the inputs x[i] that land on j, over element types of kind K.
template <Kinds K, class Fn>
Folded reduce(const Node& node, const Inputs& in, Empty empty, Fn fn) {
  std::optional<ReducePlan> plan = plan_reduce(node, in);
  if (!plan) return std::nullopt;
  if (plan->noop) return one(*in[0]);
  const Tensor& x = *in[0];
  return dispatch(x.type.dtype, [&](auto tag) -> Folded {
    using T = decltype(tag);
    if constexpr (!accepts<T>(K)) {
      return std::nullopt;
    } else {
      const std::vector<int64_t> dst = broadcast_offsets(plan->kept_shape, x.type.shape);
      Tensor out = new_tensor(x.type.dtype, plan->out_shape);
      std::vector<bool> seen(static_cast<size_t>(out.type.numel()), false);
      for (size_t i = 0; i < dst.size(); ++i) {
        T& o = out.as<T>()[dst[i]];
        o = seen[static_cast<size_t>(dst[i])] ? static_cast<T>(fn(o, x.as<T>()[i])) : x.as<T>()[i];
        seen[static_cast<size_t>(dst[i])] = true;
      }
      for (size_t j = 0; j < seen.size(); ++j)
        if (!seen[j]) out.as<T>()[j] = empty_value<T>(empty);
      return one(std::move(out));
    }
  });
}

}  // namespace

Folded fold_reduce_sum(const Node& node, const Inputs& in, int64_t) {
  return reduce<Kinds::kNumeric>(node, in, Empty::kZero,
                                 [](auto a, auto b) { return wrapping(a, b, std::plus<>()); });
}
Folded fold_reduce_prod(const Node& node, const Inputs& in, int64_t) {
  return reduce<Kinds::kNumeric>(node, in, Empty::kOne,
                                 [](auto a, auto b) { return wrapping(a, b, std::multiplies<>()); });
}
// Max and Min take bool too (opset 20).
Folded fold_reduce_max(const Node& node, const Inputs& in, int64_t) {
  return reduce<Kinds::kAny>(node, in, Empty::kLowest, kMax);
}
Folded fold_reduce_min(const Node& node, const Inputs& in, int64_t) {
  return reduce<Kinds::kAny>(node, in, Empty::kHighest, kMin);
}

}  // namespace pt::fold_detail
