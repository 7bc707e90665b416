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
#include "exec/cpu/parallel.h"
#include "exec/movement_geometry.h"

namespace pt::cpu {
namespace {

constexpr int64_t kParallelMin = int64_t{1} << 15;  // elements below which one thread runs

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
    parallel_for(units, threads_, parallel, [&](int64_t u) {
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
    });
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
    parallel_for(rows_, threads_, rows_ > 1 && rows_ * w >= kParallelMin, [&](int64_t r) {
      T* row = y + r * w;
      const int64_t from = input_row(r);
      if (from < 0) {
        std::fill(row, row + w, v);
        return;
      }
      std::fill(row, row + lo_, v);
      if (hi_ > lo_)
        std::memcpy(row + lo_, x + from + (lo_ - begin_.back()),
                    static_cast<size_t>(hi_ - lo_) * sizeof(T));
      std::fill(row + hi_, row + w, v);
    });
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

}  // namespace

// GatherGrad(dY, Indices) -> dData, axis (default 0), data_shape. float32 dY, int64 or int32
// indices (gather_grad_geometry).
std::unique_ptr<Kernel> make_gather_grad(const KernelSpec& s) {
  const auto g = gather_grad_geometry(s);
  if (!g) return nullptr;
  return std::make_unique<GatherGrad>(s.node.name, g->index_type, g->outer, g->n, g->count,
                                      g->inner, s.cpu->threads);
}

// Pad(data, pads, constant_value?, axes?) in constant mode (pad_geometry), constant_value
// constant or fed at run time; float32, int32 and int64 data.
std::unique_ptr<Kernel> make_pad(const KernelSpec& s) {
  const auto begin = pad_geometry(s);
  if (!begin) return nullptr;
  using PadTypes = TypeList<float, int32_t, int64_t>;
  return visit(PadTypes{}, s.inputs[0].dtype, [&]<class T>() -> std::unique_ptr<Kernel> {
    T value = T(0);
    int value_input = -1;
    if (const Tensor* c = s.has_input(2) ? s.constant(2) : nullptr) {
      value = c->as<T>()[0];
    } else if (s.has_input(2)) {
      value_input = 2;
    }
    return std::make_unique<PadKernel<T>>(s.inputs[0].shape, s.outputs[0].shape, *begin, value,
                                          value_input, s.cpu->threads);
  });
}

}  // namespace pt::cpu
