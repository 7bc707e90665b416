// exec/cpu/movement_grad.cc: the data-movement ops autodiff emits for the backward of movement
// ops: GatherGrad (pipetrain domain, core/pipetrain_ops.h), Gather's gradient, and ONNX Pad in
// constant mode, Slice's gradient. Plain loops, planned in the factory.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dispatch.h"
#include "exec/cpu/dnnl_util.h"

namespace pt::cpu {
namespace {

using Dims = std::vector<int64_t>;

constexpr int64_t kParallelMin = int64_t{1} << 15;  // elements below which one thread runs

// Integer data of constant input i (int64 or int32); nullopt when it is not constant.
std::optional<Dims> constant_ints(const KernelSpec& s, size_t i) {
  const Tensor* t = s.constant(i);
  if (!t) return std::nullopt;
  const int64_t n = t->type.numel();
  if (t->type.dtype == DType::kInt64) return Dims(t->as<int64_t>(), t->as<int64_t>() + n);
  if (t->type.dtype == DType::kInt32) return Dims(t->as<int32_t>(), t->as<int32_t>() + n);
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// GatherGrad

// GatherGrad(dY, Indices): with dData viewed as [outer, n, inner] around `axis` and dY as
// [outer, count, inner],
//   dData = 0;  dData[o, idx[i] (+ n if negative), :] += dY[o, i, :]  for i = 0 .. count-1
// Work splits into (o, column block) units, each owning its columns of dData[o] for every i: no
// two threads touch one element, and each element adds its rows in index order, whatever the
// thread count.
class GatherGrad final : public Kernel {
 public:
  GatherGrad(std::string node, DType index_type, int64_t outer, int64_t n, int64_t count,
             int64_t inner, int threads)
      : node_(std::move(node)), index_type_(index_type), outer_(outer), n_(n), count_(count),
        inner_(inner), threads_(threads) {
    // Enough column blocks for every thread when outer alone does not give them (embeddings:
    // outer 1), at least 64 columns each.
    const int64_t per_outer = (threads + outer - 1) / std::max<int64_t>(outer, 1);
    block_ = std::max<int64_t>(64, (inner + per_outer - 1) / std::max<int64_t>(per_outer, 1));
    block_ = std::min(block_, std::max<int64_t>(inner, 1));
    blocks_ = (inner + block_ - 1) / block_;
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    if (index_type_ == DType::kInt64) {
      scatter_add(in[1].as<const int64_t>(), in[0].as<const float>(), out[0].as<float>());
    } else {
      scatter_add(in[1].as<const int32_t>(), in[0].as<const float>(), out[0].as<float>());
    }
  }

 private:
  template <class I>
  void scatter_add(const I* idx, const float* dy, float* dd) const {
    for (int64_t i = 0; i < count_; ++i)
      if (idx[i] < -n_ || idx[i] >= n_)
        throw UserError("GatherGrad node '" + node_ + "'",
                        "index " + std::to_string(idx[i]) + " out of range [-" +
                            std::to_string(n_) + ", " + std::to_string(n_) + ")",
                        "check the token ids against the vocabulary size");
    const int64_t units = outer_ * blocks_;
    const bool parallel = units > 1 && outer_ * (n_ + count_) * inner_ >= kParallelMin;
#pragma omp parallel for num_threads(threads_) if (parallel)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t o = u / blocks_, j0 = u % blocks_ * block_;
      const int64_t len = std::min(block_, inner_ - j0);
      float* base = dd + o * n_ * inner_ + j0;
      for (int64_t k = 0; k < n_; ++k) std::fill(base + k * inner_, base + k * inner_ + len, 0.f);
      const float* src = dy + o * count_ * inner_ + j0;
      for (int64_t i = 0; i < count_; ++i) {
        const int64_t k = idx[i] < 0 ? idx[i] + n_ : idx[i];
        float* row = base + k * inner_;
        const float* from = src + i * inner_;
        for (int64_t j = 0; j < len; ++j) row[j] += from[j];
      }
    }
  }

  std::string node_;
  DType index_type_;
  int64_t outer_, n_, count_, inner_;
  int threads_;
  int64_t block_ = 1, blocks_ = 1;  // columns per unit, units per outer index
};

// ---------------------------------------------------------------------------------------------
// Pad

// Pad, constant mode: out[i] = in[i - pad_begin] where that is inside the input, else the
// constant. Pads may be negative (they crop). The output is walked as rows of its last dim: a
// row outside the input in any outer dim is all constant, else constant, a copied run, constant.
template <class T>
class PadKernel final : public Kernel {
 public:
  // value_input: the input holding the constant, or -1 to use `value`.
  PadKernel(Dims in, Dims out, Dims begin, T value, int value_input, int threads)
      : in_(std::move(in)), out_(std::move(out)), begin_(std::move(begin)), value_(value),
        value_input_(value_input), threads_(threads) {
    if (in_.empty()) in_ = out_ = begin_ = {1};  // a scalar: one row of one element
    in_stride_.assign(in_.size(), 1);
    for (size_t d = in_.size() - 1; d-- > 0;) in_stride_[d] = in_stride_[d + 1] * in_[d + 1];
    const int64_t w = out_.back(), b = begin_.back();
    lo_ = std::clamp<int64_t>(b, 0, w);
    hi_ = std::clamp<int64_t>(in_.back() + b, lo_, w);
    rows_ = product(out_, 0, out_.size() - 1);
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const T v = value_input_ < 0 ? value_ : in[static_cast<size_t>(value_input_)].as<const T>()[0];
    const T* x = in[0].as<const T>();
    T* y = out[0].as<T>();
    const int64_t w = out_.back();
#pragma omp parallel for num_threads(threads_) if (rows_ > 1 && rows_ * w >= kParallelMin)
    for (int64_t r = 0; r < rows_; ++r) {
      T* row = y + r * w;
      const int64_t from = input_row(r);
      if (from < 0) {
        std::fill(row, row + w, v);
        continue;
      }
      std::fill(row, row + lo_, v);
      if (hi_ > lo_)
        std::memcpy(row + lo_, x + from + (lo_ - begin_.back()),
                    static_cast<size_t>(hi_ - lo_) * sizeof(T));
      std::fill(row + hi_, row + w, v);
    }
  }

 private:
  // Offset of the input row that output row r reads, or -1 when r lies in padding.
  int64_t input_row(int64_t r) const {
    int64_t offset = 0;
    for (size_t d = out_.size() - 1; d-- > 0;) {
      const int64_t i = r % out_[d] - begin_[d];
      r /= out_[d];
      if (i < 0 || i >= in_[d]) return -1;
      offset += i * in_stride_[d];
    }
    return offset;
  }

  Dims in_, out_, begin_, in_stride_;
  T value_;
  int value_input_;
  int threads_;
  int64_t lo_ = 0, hi_ = 0;  // columns [lo_, hi_) of a row come from the input
  int64_t rows_ = 1;
};

// Per-dim pads at the beginning of each axis, from the constant `pads` (and `axes`, opset 18);
// nullopt unless they give the output shape.
std::optional<Dims> pad_begins(const KernelSpec& s) {
  const Dims& in = s.inputs[0].shape;
  const size_t rank = in.size();
  const auto pads = constant_ints(s, 1);
  if (!pads) return std::nullopt;
  Dims axes(rank);
  for (size_t d = 0; d < rank; ++d) axes[d] = static_cast<int64_t>(d);
  if (s.has_input(3)) {
    const auto given = constant_ints(s, 3);
    if (!given) return std::nullopt;
    axes = *given;
  }
  if (pads->size() != 2 * axes.size()) return std::nullopt;
  Dims begin(rank, 0), end(rank, 0);
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t a = axes[k] < 0 ? axes[k] + static_cast<int64_t>(rank) : axes[k];
    if (a < 0 || a >= static_cast<int64_t>(rank)) return std::nullopt;
    begin[a] = (*pads)[k];
    end[a] = (*pads)[k + axes.size()];
  }
  for (size_t d = 0; d < rank; ++d)
    if (in[d] + begin[d] + end[d] != s.outputs[0].shape[d]) return std::nullopt;
  return begin;
}

}  // namespace

// GatherGrad(dY, Indices) -> dData, axis (default 0), data_shape. float32 dY, int64 or int32
// indices.
std::unique_ptr<Kernel> make_gather_grad(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !s.has_input(0) || !s.has_input(1) || s.outputs.size() != 1)
    return nullptr;
  const TensorType &dy = s.inputs[0], &idx = s.inputs[1];
  const Dims data = s.node.attr_ints("data_shape");
  if (dy.dtype != DType::kFloat32 || s.outputs[0].dtype != DType::kFloat32 ||
      (idx.dtype != DType::kInt64 && idx.dtype != DType::kInt32) || data.empty() ||
      s.outputs[0].shape != data)
    return nullptr;
  int64_t axis = s.node.attr_int("axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(data.size());
  if (axis < 0 || axis >= static_cast<int64_t>(data.size())) return nullptr;
  const size_t a = static_cast<size_t>(axis);
  Dims want(data.begin(), data.begin() + axis);
  want.insert(want.end(), idx.shape.begin(), idx.shape.end());
  want.insert(want.end(), data.begin() + axis + 1, data.end());
  if (dy.shape != want) return nullptr;
  return std::make_unique<GatherGrad>(s.node.name, idx.dtype, product(data, 0, a), data[a],
                                      idx.numel(), product(data, a + 1, data.size()),
                                      s.cpu->threads);
}

// Pad(data, pads, constant_value?, axes?) in constant mode (opset 13+ form), pads and axes
// constant, constant_value constant or fed at run time; float32, int32 and int64 data.
std::unique_ptr<Kernel> make_pad(const KernelSpec& s) {
  if (s.inputs.size() < 2 || s.inputs.size() > 4 || !s.has_input(0) || !s.has_input(1) ||
      s.outputs.size() != 1 || s.outputs[0].dtype != s.inputs[0].dtype ||
      s.outputs[0].shape.size() != s.inputs[0].shape.size() ||
      s.node.attr_string("mode", "constant") != "constant")
    return nullptr;
  const auto begin = pad_begins(s);
  if (!begin) return nullptr;
  using PadTypes = TypeList<float, int32_t, int64_t>;
  return visit(PadTypes{}, s.inputs[0].dtype, [&]<class T>() -> std::unique_ptr<Kernel> {
    T value = T(0);
    int value_input = -1;
    if (s.has_input(2)) {
      if (s.inputs[2].dtype != dtype_of<T>() || s.inputs[2].numel() != 1) return nullptr;
      const Tensor* c = s.constant(2);
      if (c) {
        value = c->as<T>()[0];
      } else {
        value_input = 2;
      }
    }
    return std::make_unique<PadKernel<T>>(s.inputs[0].shape, s.outputs[0].shape, *begin, value,
                                          value_input, s.cpu->threads);
  });
}

}  // namespace pt::cpu
