// exec/cpu/lane_math.h: scalar helpers the CPU kernel loops share, written so that the loops
// calling them vectorise: a polynomial exp, erf and tanh and the GELUs on them, and float sums
// kept in 16 interleaved lanes and folded in double (vectorisable, and less rounding than one
// running sum).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

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

// 16 floats as one value (GCC's vector extension: one AVX-512 register in that clone, two or four
// narrower ones in the others), for loops whose vector form the compiler does not find alone:
// short rows, where a reduction's end and its tail cost as much as its body.
typedef float Vec16 __attribute__((vector_size(64)));

// v = 16 floats from p, at any alignment (by reference: a vector argument's ABI differs by ISA).
[[gnu::always_inline]] inline void load16(Vec16& v, const float* p) { std::memcpy(&v, p, sizeof v); }

// The sum, and the max, of v's 16 lanes by halves: a fixed order, 4 steps deep.
[[gnu::always_inline]] inline float fold_sum(const Vec16& v) {
  typedef float Vec8 __attribute__((vector_size(32)));
  typedef float Vec4 __attribute__((vector_size(16)));
  const Vec8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}
[[gnu::always_inline]] inline float fold_max(const Vec16& v) {
  typedef float Vec8 __attribute__((vector_size(32)));
  typedef float Vec4 __attribute__((vector_size(16)));
  const Vec8 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const Vec8 hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec8 a = lo < hi ? hi : lo;
  const Vec4 blo = __builtin_shufflevector(a, a, 0, 1, 2, 3), bhi = __builtin_shufflevector(a, a, 4, 5, 6, 7);
  const Vec4 b = blo < bhi ? bhi : blo;
  return std::max(std::max(b[0], b[2]), std::max(b[1], b[3]));
}

// max_i p[i] over [0, n) (-inf when empty): 16 lanes, folded by halves, then the tail.
[[gnu::always_inline]] inline float row_max(const float* p, int64_t n) {
  Vec16 m = Vec16{} - std::numeric_limits<float>::infinity(), v;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    load16(v, p + i);
    m = m < v ? v : m;
  }
  float out = fold_max(m);
  for (; i < n; ++i) out = std::max(out, p[i]);
  return out;
}

// sum_i p[i] over [0, n), and sum_i p[i] q[i]: 16 lanes, folded by halves, then the tail.
[[gnu::always_inline]] inline float row_sum(const float* p, int64_t n) {
  Vec16 s = {}, v;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    load16(v, p + i);
    s += v;
  }
  float out = fold_sum(s);
  for (; i < n; ++i) out += p[i];
  return out;
}
[[gnu::always_inline]] inline float row_dot(const float* p, const float* q, int64_t n) {
  Vec16 s = {}, v, w;
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

}  // namespace pt::cpu
