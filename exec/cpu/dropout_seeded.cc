// exec/cpu/dropout_seeded.cc: SeededDropout and SeededBernoulli (core/pipetrain_ops.h), training
// Dropout and the stochastic-depth draw, whose element i is a pure function of (key, stream, i)
// (exec/cpu/seeded_uniform.h). Plain loops, parallel over blocks of elements: any split draws the
// same mask. The loops are vector clones (exec/cpu/vector_clones.h): the baseline x86-64 has no
// vector 64-bit multiply, so the hash ran one element at a time (1.7 us for 1,024 elements, 4x
// what its 12 operations an element cost on AVX-512's 8 lanes); integer hashing and a product
// by the scale, so every clone draws and writes the same bits.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/parallel.h"
#include "exec/cpu/seeded_uniform.h"
#include "exec/cpu/vector_clones.h"

namespace pt::cpu {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 15;  // elements below which one thread runs
constexpr int64_t kBlock = int64_t{1} << 12;

// Elements [begin, end) of SeededDropout: y = keep ? x * scale : 0, keep = u(i) >= ratio.
PT_VECTOR_CLONES void dropout_block(const float* x, float* y, bool* mask, uint64_t base, float ratio, float scale,
                                    int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const bool keep = seeded_uniform(base, i) >= ratio;
    y[i] = keep ? x[i] * scale : 0.0f;
    if (mask) mask[i] = keep;
  }
}

// Elements [begin, end) of SeededBernoulli: y = u(i) < p ? 1 : 0.
PT_VECTOR_CLONES void bernoulli_block(const float* p, float* y, uint64_t base, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) y[i] = seeded_uniform(base, i) < p[i] ? 1.0f : 0.0f;
}

// X, Y: float32 of n elements; key: int64 scalar; mask: bool of n elements, optional.
//   mask[i] = u(i) >= ratio, Y[i] = mask[i] ? X[i] * scale : 0, scale = 1 / (1 - ratio)
class SeededDropout final : public Kernel {
 public:
  SeededDropout(int64_t n, float ratio, int64_t stream, int threads)
      : n_(n), ratio_(ratio), scale_(1.0f / (1.0f - ratio)), stream_(stream), threads_(threads) {}

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* x = in[0].as<const float>();
    const uint64_t base = seeded_base(*in[1].as<const int64_t>(), stream_);
    float* y = out[0].as<float>();
    bool* mask = out.size() > 1 && out[1].present() ? out[1].as<bool>() : nullptr;
    const int64_t blocks = (n_ + kBlock - 1) / kBlock;
    parallel_for(blocks, threads_, n_ >= kParallelMin, [&](int64_t b) {
      dropout_block(x, y, mask, base, ratio_, scale_, b * kBlock, std::min(n_, (b + 1) * kBlock));
    });
  }

 private:
  int64_t n_;
  float ratio_, scale_;
  int64_t stream_;
  int threads_;
};

// P, Y: float32 of n elements; key: int64 scalar.  Y[i] = u(i) < P[i] ? 1 : 0
class SeededBernoulli final : public Kernel {
 public:
  SeededBernoulli(int64_t n, int64_t stream, int threads)
      : n_(n), stream_(stream), threads_(threads) {}

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* p = in[0].as<const float>();
    const uint64_t base = seeded_base(*in[1].as<const int64_t>(), stream_);
    float* y = out[0].as<float>();
    const int64_t blocks = (n_ + kBlock - 1) / kBlock;
    parallel_for(blocks, threads_, n_ >= kParallelMin, [&](int64_t b) {
      bernoulli_block(p, y, base, b * kBlock, std::min(n_, (b + 1) * kBlock));
    });
  }

 private:
  int64_t n_;
  int64_t stream_;
  int threads_;
};

}  // namespace

// SeededBernoulli(P, key) -> Y, stream. P and Y float32 of one shape, key an int64 scalar.
std::unique_ptr<Kernel> make_seeded_bernoulli(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !s.has_input(0) || !s.has_input(1) || s.outputs.size() != 1)
    return nullptr;
  const TensorType& p = s.inputs[0];
  if (p.dtype != DType::kFloat32 || s.inputs[1] != TensorType{DType::kInt64, {}} ||
      s.outputs[0] != p || !s.node.has_attr("stream"))
    return nullptr;
  return std::make_unique<SeededBernoulli>(p.numel(), s.node.attr_int("stream", 0), s.cpu->threads);
}

// SeededDropout(X, key) -> (Y, mask?), ratio in [0, 1), stream. X float32, key an int64 scalar.
std::unique_ptr<Kernel> make_seeded_dropout(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !s.has_input(0) || !s.has_input(1) || s.outputs.empty() ||
      s.outputs.size() > 2)
    return nullptr;
  const TensorType& x = s.inputs[0];
  if (x.dtype != DType::kFloat32 || s.inputs[1] != TensorType{DType::kInt64, {}} ||
      s.outputs[0] != x)
    return nullptr;
  if (s.outputs.size() > 1 && s.outputs[1].dtype != DType::kUndefined &&
      s.outputs[1] != TensorType{DType::kBool, x.shape})
    return nullptr;
  const float ratio = s.node.attr_float("ratio", 0.5f);
  if (!(ratio >= 0.0f && ratio < 1.0f) || !s.node.has_attr("stream")) return nullptr;
  return std::make_unique<SeededDropout>(x.numel(), ratio, s.node.attr_int("stream", 0),
                                         s.cpu->threads);
}

}  // namespace pt::cpu
