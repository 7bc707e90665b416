// tests/exec/cuda/gradient_compare.h: how the CUDA tests hold a GPU gradient to the CPU's.
//
// A gradient is held to 1e-3 of its own largest value, except a gradient that is zero in exact
// arithmetic, where float32 leaves rounding noise on both backends and the relative error of
// noise means nothing. In the samples that is attention's key bias: adding q.b to every key's
// score leaves the softmax unchanged, so d loss / d b_k = 0, and both backends return the
// cancelling sum of large terms (seen on an H200: CPU and GPU noise of the same size, relative
// error about 1). Such a gradient is held to an absolute bound instead: under kNoise of the
// step's largest gradient, on both backends. CudaModel.KeyBiasGradientIsNoise checks on the
// CPU that the key biases are that small, and that no other gradient is.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/ir.h"

namespace pt::cuda_test {

inline constexpr double kNoise = 1e-5;

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.type.numel(); ++i) m = std::max(m, double(std::fabs(t.as<float>()[i])));
  return m;
}

// The largest |g| over every gradient of a step.
inline double largest_gradient(const std::map<std::string, Tensor>& grads) {
  double m = 0;
  for (const auto& [p, g] : grads) m = std::max(m, max_abs(g));
  return m;
}

// The samples' attention key biases (samples/export_samples.py names them `*.attn.k.bias`).
inline bool is_key_bias(const std::string& param) { return param.find("attn.k.bias") != std::string::npos; }

// The error of parameter p's GPU gradient as a fraction of what it is allowed (at most 1
// passes): the largest |have - want| over 1e-3 of the largest |want|; for a key bias, the larger
// of |have| and |want| over kNoise of the step's largest gradient.
inline double gradient_error(const std::string& p, const Tensor& want, const Tensor& have, double step_largest) {
  if (is_key_bias(p)) return std::max(max_abs(have), max_abs(want)) / (kNoise * step_largest);
  const double scale = std::max(max_abs(want), 1e-30);
  double worst = 0;
  for (int64_t i = 0; i < want.type.numel(); ++i)
    worst = std::max(worst, std::fabs(double(have.as<float>()[i]) - want.as<float>()[i]) / scale);
  return worst / 1e-3;
}

}  // namespace pt::cuda_test
