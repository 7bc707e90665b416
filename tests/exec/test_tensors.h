// tests/exec/test_tensors.h: the tensors kernel and model tests make: zeroed, uniform floats from
// a fixed seed, random model feeds (normal floats, int64 class ids), and a backend's buffer
// brought back to the host. Header-only.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/ir.h"
#include "exec/backend.h"
#include "exec/kernel.h"

namespace pt::testing {

// A zeroed tensor of this dtype and shape.
inline Tensor make_tensor(DType t, const std::vector<int64_t>& shape) {
  Tensor x;
  x.type = TensorType{t, shape};
  x.data.resize(static_cast<size_t>(x.type.bytes()));
  return x;
}

// float32, uniform in [lo, hi), fixed seed.
inline Tensor uniform(const std::vector<int64_t>& shape, unsigned seed, float lo = -1.f,
                      float hi = 1.f) {
  Tensor x = make_tensor(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < x.type.numel(); ++i) x.as<float>()[i] = u(rng);
  return x;
}

// A model feed of this type: standard normal floats, int64 ids in [0, classes); other dtypes
// zero.
inline Tensor random_tensor(const TensorType& type, std::mt19937& rng, int64_t classes) {
  std::normal_distribution<float> normal;
  Tensor t = make_tensor(type.dtype, type.shape);
  for (int64_t i = 0; i < type.numel(); ++i) {
    if (type.dtype == DType::kFloat32) t.as<float>()[i] = normal(rng);
    if (type.dtype == DType::kInt64) t.as<int64_t>()[i] = static_cast<int64_t>(rng() % classes);
  }
  return t;
}

// A buffer in `backend`'s memory (a program's output) copied into a host tensor.
inline Tensor download(Backend& backend, const Buffer& b) {
  Tensor t = make_tensor(b.type->dtype, b.type->shape);
  backend.copy(t.data.data(), b.data, t.data.size());
  return t;
}

}  // namespace pt::testing
