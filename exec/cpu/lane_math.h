// exec/cpu/lane_math.h: scalar helpers the CPU kernel loops share, written so that the loops
// calling them vectorise: a polynomial exp, erf and tanh and the GELUs on them, and float sums
// kept in 16 interleaved lanes and folded in double (vectorisable, and less rounding than one
// running sum); and 16 lanes as one value, in the vector types each ISA's registers hold (Vec16,
// Vec16x2, Vec16x4), for the loops the compiler does not vectorise alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace pt::cpu {

// exp(x) for x in [-87, 88] with relative error below 2e-7, written so that loops over it
// vectorise: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-6 polynomial, 2^n placed
// into the exponent bits.
inline float exp_poly(float x) {
  x = std::min(88.0f, std::max(-87.0f, x));
  // Round to nearest by adding and subtracting 1.5 * 2^23 (no rounding instruction needed).
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln2 split in two parts
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// erf(x) = sign(x) (1 - t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e^{-x^2}), t = 1 / (1 + p|x|)
// (Abramowitz and Stegun 7.1.26): absolute error below 1.5e-7, branch-free, vectorisable.
// erf_with(x, e) takes e = e^{-x^2} already made (GELU's gradient shares it).
inline float erf_with(float x, float e) {
  const float t = 1.0f / (1.0f + 0.3275911f * std::fabs(x));
  const float poly =
      t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  return std::copysign(1.0f - poly * e, x);
}
inline float erf_poly(float x) { return erf_with(x, exp_poly(-x * x)); }

// tanh(x) = sign(x) (1 - 2 / (e^{2|x|} + 1)): absolute error about 1e-7 (exp_poly's), 1 past
// |x| = 44, vectorisable.
inline float tanh_poly(float x) {
  const float y = 1.0f - 2.0f / (exp_poly(2.0f * std::fabs(x)) + 1.0f);
  return std::copysign(y, x);
}

// GELU, approximate "none": x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); its derivative
// Phi(x) + x phi(x), phi(x) = e^{-x^2 / 2} / sqrt(2 pi).
inline constexpr float kSqrtHalf = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
inline float gelu_erf(float x) { return 0.5f * x * (1.0f + erf_poly(x * kSqrtHalf)); }
inline float gelu_erf_grad(float x) {
  const float e = exp_poly(-0.5f * x * x);  // e^{-z^2}, z = x / sqrt 2: erf's and phi's
  return 0.5f * (1.0f + erf_with(x * kSqrtHalf, e)) + x * kInvSqrt2Pi * e;
}

// GELU, approximate "tanh": 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3); its
// derivative 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2), t = tanh(u).
inline constexpr float kSqrt2OverPi = 0.79788456080286536f, kGeluCubic = 0.044715f;
inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanh_poly(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}
inline float gelu_tanh_grad(float x) {
  const float t = tanh_poly(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
}

inline constexpr int kLanes = 16;

// sum_i p[i] over [0, n): 16 interleaved float lanes (vectorisable, and less rounding than one
// running sum), folded in double. Under 16 elements the lanes stay zero and are not folded (the
// same sum, and 16 dependent additions fewer: GlobalAveragePool over 1 x 1 maps calls this per
// channel).
inline double lane_sum(const float* p, int64_t n) {
  if (n < kLanes) {
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += p[i];
    return total;
  }
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] += p[i + k];
  double total = 0;
  for (; i < n; ++i) total += p[i];
  for (float l : lane) total += l;
  return total;
}

// 16 floats as one value (GCC's vector extension), for loops whose vector form the compiler does
// not find alone: short rows, where a reduction's end and its tail cost as much as its body, and
// the attention's register blocks. Vec16 is one AVX-512 register. Where registers are narrower,
// GCC lowers a 64-byte vector badly (a row loop 3.7x slower on AVX2 than on AVX-512, an attention
// block 44x), so the AVX2 and baseline copies hold the same 16 lanes as two Vec8 or four Vec4
// (SplitLanes): every lane's arithmetic and every fold's order stay Vec16's, and so do the bits.
typedef float Vec16 __attribute__((vector_size(64)));
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec4 __attribute__((vector_size(16)));

// 16 floats as N vectors V of 16 / N: lanes [16 k / N, 16 (k + 1) / N) in part[k].
template <class V, int N>
struct SplitLanes {
  V part[N];
};
using Vec16x2 = SplitLanes<Vec8, 2>;  // AVX2: two ymm registers
using Vec16x4 = SplitLanes<Vec4, 4>;  // baseline x86-64: four xmm registers

// The operators the loops use, part by part (by reference: a vector argument's ABI differs by ISA).
template <class V, int N>
[[gnu::always_inline]] inline SplitLanes<V, N>& operator+=(SplitLanes<V, N>& a, const SplitLanes<V, N>& b) {
  for (int k = 0; k < N; ++k) a.part[k] += b.part[k];
  return a;
}
template <class V, int N>
[[gnu::always_inline]] inline SplitLanes<V, N> operator+(const SplitLanes<V, N>& a, const SplitLanes<V, N>& b) {
  SplitLanes<V, N> c;
  for (int k = 0; k < N; ++k) c.part[k] = a.part[k] + b.part[k];
  return c;
}
template <class V, int N>
[[gnu::always_inline]] inline SplitLanes<V, N> operator*(const SplitLanes<V, N>& a, const SplitLanes<V, N>& b) {
  SplitLanes<V, N> c;
  for (int k = 0; k < N; ++k) c.part[k] = a.part[k] * b.part[k];
  return c;
}
template <class V, int N>
[[gnu::always_inline]] inline SplitLanes<V, N> operator*(float s, const SplitLanes<V, N>& b) {
  SplitLanes<V, N> c;
  for (int k = 0; k < N; ++k) c.part[k] = s * b.part[k];
  return c;
}

// The ISAs of the per-ISA copies (vector_clones.h's on_vector_isa), each with its 16-lane type.
struct IsaAvx512 {
  using Lanes = Vec16;
};
struct IsaAvx2 {
  using Lanes = Vec16x2;
};
struct IsaBaseline {
  using Lanes = Vec16x4;
};

// v = 16 floats from p, at any alignment; p[0, 16) = v.
[[gnu::always_inline]] inline void load16(Vec16& v, const float* p) { std::memcpy(&v, p, sizeof v); }
[[gnu::always_inline]] inline void store16(float* p, const Vec16& v) { std::memcpy(p, &v, sizeof v); }
// Part by part: one memcpy of the whole struct went through the stack.
template <class V, int N>
[[gnu::always_inline]] inline void load16(SplitLanes<V, N>& v, const float* p) {
  for (int k = 0; k < N; ++k) std::memcpy(&v.part[k], p + k * (16 / N), sizeof(V));
}
template <class V, int N>
[[gnu::always_inline]] inline void store16(float* p, const SplitLanes<V, N>& v) {
  for (int k = 0; k < N; ++k) std::memcpy(p + k * (16 / N), &v.part[k], sizeof(V));
}

// v = 16 copies of x.
template <class L>
[[gnu::always_inline]] inline void splat16(L& v, float x) {
  float p[16];
  std::fill(p, p + 16, x);
  load16(v, p);
}

// m = max(m, v) lane by lane, as m < v ? v : m.
[[gnu::always_inline]] inline void max16(Vec16& m, const Vec16& v) { m = m < v ? v : m; }
template <class V, int N>
[[gnu::always_inline]] inline void max16(SplitLanes<V, N>& m, const SplitLanes<V, N>& v) {
  for (int k = 0; k < N; ++k) m.part[k] = m.part[k] < v.part[k] ? v.part[k] : m.part[k];
}

// x where keep's lane is positive, else 0: a select, not a product (an infinite x gives 0).
[[gnu::always_inline]] inline void keep16(Vec16& x, const Vec16& keep) { x = keep > Vec16{} ? x : Vec16{}; }
template <class V, int N>
[[gnu::always_inline]] inline void keep16(SplitLanes<V, N>& x, const SplitLanes<V, N>& keep) {
  for (int k = 0; k < N; ++k) x.part[k] = keep.part[k] > V{} ? x.part[k] : V{};
}

// The sum, and the max, of v's 16 lanes by halves: a fixed order, 4 steps deep (lanes k and
// k + 8, then k and k + 4 of that, then (0 + 2) + (1 + 3)), the same on every lane type.
[[gnu::always_inline]] inline float fold4_sum(const Vec4& b) { return (b[0] + b[2]) + (b[1] + b[3]); }
[[gnu::always_inline]] inline float fold4_max(const Vec4& b) {
  return std::max(std::max(b[0], b[2]), std::max(b[1], b[3]));
}
[[gnu::always_inline]] inline Vec4 max4(const Vec4& lo, const Vec4& hi) { return lo < hi ? hi : lo; }
[[gnu::always_inline]] inline float fold_sum(const Vec16& v) {
  const Vec8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return fold4_sum(__builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7));
}
[[gnu::always_inline]] inline float fold_max(const Vec16& v) {
  const Vec8 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const Vec8 hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec8 a = lo < hi ? hi : lo;
  return fold4_max(max4(__builtin_shufflevector(a, a, 0, 1, 2, 3), __builtin_shufflevector(a, a, 4, 5, 6, 7)));
}
[[gnu::always_inline]] inline float fold_sum(const Vec16x2& v) {
  const Vec8 a = v.part[0] + v.part[1];
  return fold4_sum(__builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7));
}
[[gnu::always_inline]] inline float fold_max(const Vec16x2& v) {
  const Vec8 a = v.part[0] < v.part[1] ? v.part[1] : v.part[0];
  return fold4_max(max4(__builtin_shufflevector(a, a, 0, 1, 2, 3), __builtin_shufflevector(a, a, 4, 5, 6, 7)));
}
[[gnu::always_inline]] inline float fold_sum(const Vec16x4& v) {
  return fold4_sum((v.part[0] + v.part[2]) + (v.part[1] + v.part[3]));
}
[[gnu::always_inline]] inline float fold_max(const Vec16x4& v) {
  return fold4_max(max4(max4(v.part[0], v.part[2]), max4(v.part[1], v.part[3])));
}

// max_i p[i] over [0, n) (-inf when empty): 16 lanes of type L, folded by halves, then the tail.
template <class L = Vec16>
[[gnu::always_inline]] inline float row_max(const float* p, int64_t n) {
  L m, v;
  splat16(m, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    load16(v, p + i);
    max16(m, v);
  }
  float out = fold_max(m);
  for (; i < n; ++i) out = std::max(out, p[i]);
  return out;
}

// sum_i p[i] over [0, n), and sum_i p[i] q[i]: 16 lanes of type L, folded by halves, then the tail.
template <class L = Vec16>
[[gnu::always_inline]] inline float row_sum(const float* p, int64_t n) {
  L s = {}, v;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    load16(v, p + i);
    s += v;
  }
  float out = fold_sum(s);
  for (; i < n; ++i) out += p[i];
  return out;
}
template <class L = Vec16>
[[gnu::always_inline]] inline float row_dot(const float* p, const float* q, int64_t n) {
  L s = {}, v, w;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    load16(v, p + i);
    load16(w, q + i);
    s += v * w;
  }
  float out = fold_sum(s);
  for (; i < n; ++i) out += p[i] * q[i];
  return out;
}

// sum_i p[i] * q[i] over [0, n), the same way.
inline double lane_dot(const float* p, const float* q, int64_t n) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] += p[i + k] * q[i + k];
  double total = 0;
  for (; i < n; ++i) total += double(p[i]) * q[i];
  for (float l : lane) total += l;
  return total;
}

// sum_i (p[i] - mean)^2 over [0, n), the same way.
inline double lane_squared_deviation(const float* p, int64_t n, float mean) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float d = p[i + k] - mean;
      lane[k] += d * d;
    }
  double total = 0;
  for (; i < n; ++i) total += double(p[i] - mean) * double(p[i] - mean);
  for (float l : lane) total += l;
  return total;
}

// A block of up to 16 channels' planes (channel-major, as NCHW holds them) to and from pixel-major
// scratch, a pixel's channels in one row of 16 lanes: the depthwise and pointwise loops on small
// maps (depthwise.cc, nn_grad.cc) take 16 channels a vector this way.
// t[p * 16 + l] = planes[l * size + p] for l < channels (at most 16) planes of `size` pixels: a
// pixel's 16 values at a time for a whole block (a copy for planes of one pixel).
template <class L>
[[gnu::always_inline]] inline void transpose_block(const float* planes, int64_t size, int64_t channels, float* t) {
  if constexpr (std::is_same_v<L, Vec16>) {
    if (channels == kLanes && size == 4) {  // 2x2 maps: 16 x 4 in two rounds of 4 two-vector shuffles
      Vec16 v[4], w[4];
      for (int k = 0; k < 4; ++k) load16(v[k], planes + k * kLanes);
      for (int k = 0; k < 2; ++k) {
        const Vec16 &a = v[2 * k], &b = v[2 * k + 1];  // channels 8k to 8k + 7
        w[2 * k] = __builtin_shufflevector(a, b, 0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
        w[2 * k + 1] = __builtin_shufflevector(a, b, 2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
      }
      for (int k = 0; k < 2; ++k) {
        const Vec16 &a = w[k], &b = w[k + 2];  // pixels 2k and 2k + 1
        store16(t + 2 * k * kLanes,
                __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23));
        store16(t + (2 * k + 1) * kLanes,
                __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31));
      }
      return;
    }
  }
  if (channels < kLanes) {
    for (int64_t l = 0; l < channels; ++l)
      for (int64_t p = 0; p < size; ++p) t[p * kLanes + l] = planes[l * size + p];
  } else if (size == 1) {
    std::copy(planes, planes + kLanes, t);
  } else {
    for (int64_t p = 0; p < size; ++p)
      for (int64_t l = 0; l < kLanes; ++l) t[p * kLanes + l] = planes[l * size + p];
  }
}

// planes[l * size + p] = t[p * 16 + l] for l < channels (at most 16): transpose_block undone.
template <class L>
[[gnu::always_inline]] inline void untranspose_block(const float* t, int64_t size, int64_t channels,
                                                     float* planes) {
  if constexpr (std::is_same_v<L, Vec16>) {
    if (channels == kLanes && size == 4) {  // pixels 0 and 1, 2 and 3 interleaved, then 4 channels a vector
      Vec16 v[4], u[4];
      for (int p = 0; p < 4; ++p) load16(v[p], t + p * kLanes);
      for (int k = 0; k < 2; ++k) {
        const Vec16 &a = v[2 * k], &b = v[2 * k + 1];  // pixels 2k and 2k + 1
        u[2 * k] = __builtin_shufflevector(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        u[2 * k + 1] = __builtin_shufflevector(a, b, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
      }
      for (int k = 0; k < 2; ++k) {
        const Vec16 &a = u[k], &b = u[k + 2];  // channels 8k to 8k + 7
        store16(planes + 2 * k * kLanes,
                __builtin_shufflevector(a, b, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23));
        store16(planes + (2 * k + 1) * kLanes,
                __builtin_shufflevector(a, b, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31));
      }
      return;
    }
  }
  if (channels == kLanes && size == 1) {
    std::copy(t, t + kLanes, planes);
    return;
  }
  for (int64_t l = 0; l < channels; ++l)
    for (int64_t p = 0; p < size; ++p) planes[l * size + p] = t[p * kLanes + l];
}

}  // namespace pt::cpu
