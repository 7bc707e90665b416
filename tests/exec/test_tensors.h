// tests/exec/test_tensors.h: the tensors kernel and model tests make: zeroed, uniform floats from
// a fixed seed, random model feeds (normal floats, int64 class ids), a pipeline step's feeds, and
// a backend's buffer brought back to the host. Header-only.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "autodiff/backward.h"
#include "autodiff/loss.h"
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

// A step's feeds: per micro-batch the graph's inputs (drawn as the first chunk types them, ids
// below 16), a target in range for the last chunk's loss, loss_scale = 1 / (micro-batches x
// micro-batch rows). Seeded: the same feeds in every process.
inline std::vector<std::map<std::string, Tensor>> step_feeds(const Graph& g, const std::vector<BackwardGraphs>& chunks,
                                                             int micro_batches, int rows, unsigned seed = 7) {
  const Graph& first = chunks.front().forward;
  const Graph& last = chunks.back().forward;
  int64_t classes = 1;
  for (const Node& n : last.nodes)
    if (n.op_type == "SoftmaxCrossEntropy") classes = last.value(n.inputs[0]).type.shape.back();
  std::vector<std::map<std::string, Tensor>> feeds(static_cast<size_t>(micro_batches));
  std::mt19937 rng(seed);
  for (auto& f : feeds) {
    for (ValueId v : g.inputs) {
      const std::string& name = g.value(v).name;
      f[name] = random_tensor(first.value(first.find(name)).type, rng, 16);
    }
    f[kLossTarget] = random_tensor(last.value(last.find(kLossTarget)).type, rng, classes);
    Tensor scale = make_tensor(DType::kFloat32, {});
    *scale.as<float>() = 1.0f / static_cast<float>(micro_batches * rows);
    f[kLossScale] = std::move(scale);
  }
  return feeds;
}

}  // namespace pt::testing
