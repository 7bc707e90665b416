// exec/cpu/loss.cc: the fused loss of the pipetrain domain (core/pipetrain_ops.h):
// SoftmaxCrossEntropy and its gradient, on Logits [..., C] seen as T rows of C classes. Loops
// that vectorise: the row max, then exp (exp_poly) summed in float lanes folded in double; rows
// run in parallel. Rows shorter than the lanes (an MLP's 10 classes) run as one flat array.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"
#include "exec/cpu/vector_clones.h"

namespace pt::cpu {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 15;  // elements below which one thread runs

// max_j x[j] over a row of c > 0 values, in 8 independent lanes: without finite-math GCC will
// not vectorise a float max, and one running max is a chain of dependent maxss (9x slower on a
// row of 8192).
PT_VECTOR_CLONES float row_max(const float* x, int64_t c) {
  constexpr int kMaxLanes = 8;
  float lane[kMaxLanes];
  std::fill(lane, lane + kMaxLanes, x[0]);
  int64_t j = 0;
  for (; j + kMaxLanes <= c; j += kMaxLanes)
    for (int k = 0; k < kMaxLanes; ++k) lane[k] = x[j + k] > lane[k] ? x[j + k] : lane[k];
  float m = *std::max_element(lane, lane + kMaxLanes);
  for (; j < c; ++j) m = std::max(m, x[j]);
  return m;
}

// sum_j exp(x[j] - m) in double: 16 interleaved float lanes (vectorisable) folded into the
// double total every kBlock values, so no float partial sums more than 32 values <= 1. With
// kStore, also writes each exp to e[j].
template <bool kStore>
PT_VECTOR_CLONES double exp_sum(const float* x, int64_t c, float m, float* e) {
  constexpr int64_t kBlock = 512;
  double total = 0;
  for (int64_t b = 0; b < c; b += kBlock) {
    const int64_t end = std::min(c, b + kBlock);
    float lane[kLanes] = {};
    int64_t j = b;
    for (; j + kLanes <= end; j += kLanes)
      for (int k = 0; k < kLanes; ++k) {
        const float v = exp_poly(x[j + k] - m);
        if constexpr (kStore) e[j + k] = v;
        lane[k] += v;
      }
    for (; j < end; ++j) {
      const float v = exp_poly(x[j] - m);
      if constexpr (kStore) e[j] = v;
      total += v;
    }
    for (float l : lane) total += l;
  }
  return total;
}

// Rows of fewer than 16 values, all T at once: e[t, j] = exp(x[t, j] - max_t) and sums[t] =
// sum_j e[t, j] (in double, in j order). Each row's max and x - max, then the exps of the whole
// T x C array in one vector loop, then the sums: row by row (row_max and exp_sum) each row ran
// its exps through lanes it mostly left empty and folded 16 of them, ~55 ns a row of 10 classes
// (an MLP's loss over 32 x 10 logits: 2.2 us, 6x what its FLOPs and bytes cost).
PT_VECTOR_CLONES void exp_in_place(float* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = exp_poly(e[i]);
}

void short_rows_exp(const float* x, int64_t rows, int64_t c, float* e, float* max, double* sums) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = x + t * c;
    float m = row[0];
    for (int64_t j = 1; j < c; ++j) m = std::max(m, row[j]);
    max[t] = m;
    for (int64_t j = 0; j < c; ++j) e[t * c + j] = row[j] - m;
  }
  exp_in_place(e, rows * c);
  for (int64_t t = 0; t < rows; ++t) {
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += e[t * c + j];
    sums[t] = s;
  }
}

// d[j] = k * softmax(x)[j] over a row of c > 0 values: the exps written to d, then scaled by
// k / their sum.
PT_VECTOR_CLONES void softmax_row_scaled(const float* x, int64_t c, float k, float* d) {
  const float m = row_max(x, c);
  const float scale = static_cast<float>(double(k) / exp_sum<true>(x, c, m, d));
  for (int64_t j = 0; j < c; ++j) d[j] *= scale;
}

// A short row's gradient from its exps in d and their sum: k * (softmax - onehot(target)), or
// 0 where the target is ignored.
void scale_row(float* d, int64_t c, float k, double sum, int64_t target, int64_t ignore_index) {
  if (target == ignore_index) {
    std::fill(d, d + c, 0.f);
    return;
  }
  const float scale = static_cast<float>(double(k) / sum);
  for (int64_t j = 0; j < c; ++j) d[j] *= scale;
  d[target] -= k;
}

// Shared by the loss and its gradient: T rows of C classes, targets in [0, C) or ignore_index.
struct LossRows {
  std::string node;
  int64_t rows = 0, classes = 0, ignore_index = -100;
  int threads = 1;

  bool parallel() const { return rows > 1 && rows * classes >= kParallelMin; }
  // short_rows_exp's case: rows shorter than the lanes, on one thread.
  bool short_rows() const { return classes < kLanes && !(parallel() && threads > 1); }

  // Targets are the user's data: checked before any row is computed.
  void check(const int64_t* target) const {
    for (int64_t t = 0; t < rows; ++t)
      if (target[t] != ignore_index && (target[t] < 0 || target[t] >= classes))
        throw UserError(node, "target " + std::to_string(target[t]) + " at row " +
                                  std::to_string(t) + " is outside the classes [0, " +
                                  std::to_string(classes) + ")",
                        "check the labels against the number of classes, or mark ignored rows "
                        "with ignore_index (" + std::to_string(ignore_index) + ")");
  }
};

// Loss = Scale * sum over valid t of (logsumexp(Logits[t]) - Logits[t, Target[t]]), with
// logsumexp = m + log(sum exp(x - m)), m the row max. Row losses go to scratch (double) and are
// added in row order: the same result for any thread count.
class SoftmaxCrossEntropy final : public Kernel {
 public:
  explicit SoftmaxCrossEntropy(LossRows r) : r_(std::move(r)) {}

  // Per row its loss (double); short rows also their sums (double), maxima and exps (float).
  size_t scratch_bytes() const override {
    const size_t rows = static_cast<size_t>(r_.rows);
    return rows * sizeof(double) + (r_.short_rows() ? rows * (sizeof(double) + sizeof(float)) +
                                                          rows * static_cast<size_t>(r_.classes) * sizeof(float)
                                                    : 0);
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float* x = in[0].as<const float>();
    const int64_t* target = in[1].as<const int64_t>();
    auto* loss = static_cast<double*>(scratch);
    r_.check(target);
    const int64_t c = r_.classes;
    if (r_.short_rows()) {
      double* sums = loss + r_.rows;
      auto* max = reinterpret_cast<float*>(sums + r_.rows);
      short_rows_exp(x, r_.rows, c, max + r_.rows, max, sums);
      for (int64_t t = 0; t < r_.rows; ++t)
        loss[t] = target[t] == r_.ignore_index ? 0
                                               : double(max[t]) + std::log(sums[t]) - double(x[t * c + target[t]]);
    } else {
      parallel_for(r_.rows, r_.threads, r_.parallel(), [&](int64_t t) {
        if (target[t] == r_.ignore_index) {
          loss[t] = 0;
          return;
        }
        const float* row = x + t * c;
        const float m = row_max(row, c);
        loss[t] = double(m) + std::log(exp_sum<false>(row, c, m, nullptr)) - double(row[target[t]]);
      });
    }
    double total = 0;
    for (int64_t t = 0; t < r_.rows; ++t) total += loss[t];
    out[0].as<float>()[0] = static_cast<float>(double(in[2].as<const float>()[0]) * total);
  }

 private:
  LossRows r_;
};

// dLogits[t] = dLoss * Scale * (softmax(Logits[t]) - onehot(Target[t])) for valid t, else 0.
// The exps are written to the row, then scaled by dLoss * Scale / sum.
class SoftmaxCrossEntropyGrad final : public Kernel {
 public:
  explicit SoftmaxCrossEntropyGrad(LossRows r) : r_(std::move(r)) {}

  // Short rows: their sums (double) and maxima (float); the exps go to dX.
  size_t scratch_bytes() const override {
    return r_.short_rows() ? static_cast<size_t>(r_.rows) * (sizeof(double) + sizeof(float)) : 0;
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float k = in[0].as<const float>()[0] * in[3].as<const float>()[0];
    const float* x = in[1].as<const float>();
    const int64_t* target = in[2].as<const int64_t>();
    float* dx = out[0].as<float>();
    r_.check(target);
    const int64_t c = r_.classes;
    if (r_.short_rows()) {
      auto* sums = static_cast<double*>(scratch);
      auto* max = reinterpret_cast<float*>(sums + r_.rows);
      short_rows_exp(x, r_.rows, c, dx, max, sums);
      for (int64_t t = 0; t < r_.rows; ++t) scale_row(dx + t * c, c, k, sums[t], target[t], r_.ignore_index);
      return;
    }
    parallel_for(r_.rows, r_.threads, r_.parallel(), [&](int64_t t) {
      float* d = dx + t * c;
      if (target[t] == r_.ignore_index) {
        std::fill(d, d + c, 0.f);
        return;
      }
      softmax_row_scaled(x + t * c, c, k, d);
      d[target[t]] -= k;
    });
  }

 private:
  LossRows r_;
};

// Logits [..., C] float32 with C > 0, Target int64 of Logits.shape[:-1], Scale a float32
// scalar: the rows, or nullopt.
std::optional<LossRows> loss_rows(const KernelSpec& s, size_t logits, size_t target,
                                  size_t scale) {
  for (size_t i : {logits, target, scale})
    if (!s.has_input(i)) return std::nullopt;
  const TensorType &x = s.inputs[logits], &t = s.inputs[target], &sc = s.inputs[scale];
  if (x.dtype != DType::kFloat32 || x.shape.empty() || x.shape.back() < 1 ||
      t.dtype != DType::kInt64 ||
      t.shape != std::vector<int64_t>(x.shape.begin(), x.shape.end() - 1) ||
      sc.dtype != DType::kFloat32 || sc.numel() != 1)
    return std::nullopt;
  return LossRows{"SoftmaxCrossEntropy node '" + s.node.name + "'", t.numel(), x.shape.back(),
                  s.node.attr_int("ignore_index", -100), s.cpu->threads};
}

}  // namespace

// SoftmaxCrossEntropy(Logits, Target, Scale) -> Loss (float32 scalar), ignore_index.
std::unique_ptr<Kernel> make_softmax_cross_entropy(const KernelSpec& s) {
  if (s.inputs.size() != 3 || s.outputs.size() != 1 ||
      s.outputs[0].dtype != DType::kFloat32 || s.outputs[0].numel() != 1)
    return nullptr;
  auto rows = loss_rows(s, 0, 1, 2);
  if (!rows) return nullptr;
  return std::make_unique<SoftmaxCrossEntropy>(std::move(*rows));
}

// SoftmaxCrossEntropyGrad(dLoss, Logits, Target, Scale) -> dLogits, ignore_index.
std::unique_ptr<Kernel> make_softmax_cross_entropy_grad(const KernelSpec& s) {
  if (s.inputs.size() != 4 || !s.has_input(0) || s.inputs[0].dtype != DType::kFloat32 ||
      s.inputs[0].numel() != 1 || s.outputs.size() != 1)
    return nullptr;
  auto rows = loss_rows(s, 1, 2, 3);
  if (!rows || s.outputs[0] != s.inputs[1]) return nullptr;
  rows->node = "SoftmaxCrossEntropyGrad node '" + s.node.name + "'";
  return std::make_unique<SoftmaxCrossEntropyGrad>(std::move(*rows));
}

}  // namespace pt::cpu
