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

// max_i p[i] over [0, n) (-inf when empty), std::max's order, as an OpenMP SIMD reduction (a
// running std::max does not vectorise).
inline float lane_max(const float* p, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = m < p[i] ? p[i] : m;
  return m;
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
