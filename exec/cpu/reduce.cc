// exec/cpu/reduce.cc: ReduceSum and ReduceMean for float32 (see cpu_kernels.h), as loops: the
// input viewed as [M, K, N] when the reduced dims form one block (parallel), else row by row.
// ReduceMax, ReduceMin and ReduceProd (masks and shape arithmetic, not hot paths) as one serial
// walk over the input.
//
// Not oneDNN's reduction primitive: in oneDNN 2.6 it has a jit implementation only when the
// innermost dims are reduced, and there it ran 2.5-4x slower than BlockReduce ([32,512,768]
// over the last axis: 7.6 ms against 2.9 ms on one thread); its reference implementation, used
// for every other layout, is 20-100x slower.
//
// Opset 13: ReduceSum takes axes as constant input 1, ReduceMean as the `axes` attribute (either
// form is read for both). Empty axes reduce every dim, or copy when noop_with_empty_axes = 1.
// keepdims = 1 keeps reduced dims as 1; the bytes are the same either way.
#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dispatch.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"
#include "exec/cpu/vector_clones.h"
#include "exec/kernel_geometry.h"

namespace pt::cpu {
namespace {

// Sum of n contiguous floats in 8 independent lanes (lane l takes x[l], x[l + 8], ...; the lanes
// fix the order of the additions, so every clone gives the same bits), the lanes one Vec8: written
// as 8 scalar lanes, GCC at -O3 kept them in memory, a chain of stores and loads (MobileNetV2's
// bias gradient of 8 x 48 planes of 16x16: 17 us a call, now 4).
__attribute__((always_inline)) inline float sum_lanes(const float* x, int64_t n) {
  Vec8 lane = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Vec8 v;
    std::memcpy(&v, x + i, sizeof v);
    lane += v;
  }
  float tail = 0.f;
  for (; i < n; ++i) tail += x[i];
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7])) + tail;
}

PT_VECTOR_CLONES float sum_contiguous(const float* x, int64_t n) { return sum_lanes(x, n); }

// y[m] += sum_lanes(row (k, m)) for k in [0, k1), m in [0, mid), rows of k2 floats: [K1, M, K2]
// reduced to [M] (a convolution's bias gradient, [N, C, H, W] -> [C]) in LoopReduce's order, in
// one call per ISA rather than one per row (MobileNetV2's 8 x 144 x 2 x 2: 1,152 rows of 4).
// Rows shorter than sum_lanes' 8 lanes (planes of 2x2 or 1x3 pixels) are summed for a block of
// rows at once, column after column, the row length a constant so that the compiler vectorises
// the strided reads: each row's sum is still 0 + its elements in order, what sum_lanes gives it
// (its lanes add up to +0 before the tail), but the block's sums run side by side instead of one
// chain after another (MobileNetV2's 8 x 96 x 2 x 2: 1.0 us a call before).
template <int64_t K2>
__attribute__((always_inline)) inline void add_short_row_sums(const float* x, float* y, int64_t k1, int64_t mid) {
  constexpr int64_t kBlock = 64;
  for (int64_t k = 0; k < k1; ++k)
    for (int64_t m0 = 0; m0 < mid; m0 += kBlock) {
      const int64_t rows = std::min(kBlock, mid - m0);
      const float* block = x + (k * mid + m0) * K2;
      float sum[kBlock];
      for (int64_t m = 0; m < rows; ++m) sum[m] = 0.f;
      for (int64_t j = 0; j < K2; ++j)
        for (int64_t m = 0; m < rows; ++m) sum[m] += block[m * K2 + j];
      for (int64_t m = 0; m < rows; ++m) y[m0 + m] += sum[m];
    }
}

PT_VECTOR_CLONES void add_row_sums(const float* x, float* y, int64_t k1, int64_t mid, int64_t k2) {
  switch (k2) {
    case 2: return add_short_row_sums<2>(x, y, k1, mid);
    case 3: return add_short_row_sums<3>(x, y, k1, mid);
    case 4: return add_short_row_sums<4>(x, y, k1, mid);
    default:
      for (int64_t k = 0; k < k1; ++k)
        for (int64_t m = 0; m < mid; ++m) y[m] += sum_lanes(x + (k * mid + m) * k2, k2);
  }
}

// y[c] = scale * sum_k x[k * n + c] for c in [c0, c1), k in [0, rows): additions in k order,
// the same bits in every clone.
PT_VECTOR_CLONES void add_rows(const float* x, float* y, int64_t rows, int64_t n, int64_t c0,
                               int64_t c1, float scale) {
  std::fill(y + c0, y + c1, 0.f);
  for (int64_t k = 0; k < rows; ++k)
    for (int64_t c = c0; c < c1; ++c) y[c] += x[k * n + c];
  if (scale != 1.f)
    for (int64_t c = c0; c < c1; ++c) y[c] *= scale;
}

// One reduced block: x viewed as [M, K, N] with the reduced dims merged into K,
//   y[m, n] = scale * sum_k x[m, k, n],   scale = 1/K for the mean, else 1.
// N = 1: one contiguous sum per m, parallel over m. N > 1: whole rows added into y[m, :], parallel
// over m, or over column blocks of N (at least kMinBlockColumns each) when M is smaller than the
// thread count. Each column is summed in k order whatever the blocks, so the bits are the same at
// any thread count.
constexpr int64_t kMinBlockColumns = 64;  // 256 bytes of y per thread: a bias gradient of 256
                                          // columns (charlm d 256) splits over 2 threads
class BlockReduce : public Kernel {
 public:
  BlockReduce(int64_t m, int64_t k, int64_t n, bool mean, int threads)
      : m_(m), k_(k), n_(n), threads_(threads) {
    scale_ = mean ? 1.f / static_cast<float>(k) : 1.f;  // k = 0: 0 * inf gives NaN
    const bool big = m * k * n * static_cast<int64_t>(sizeof(float)) >= (1 << 16);
    col_blocks_ = n > 1 && m < threads ? std::clamp<int64_t>(n / kMinBlockColumns, 1, threads) : 1;
    units_ = m * col_blocks_;
    parallel_ = big && units_ > 1 && threads > 1;
  }

  void run(std::span<const Buffer> inputs, std::span<const Buffer> outputs, void*) override {
    const float* x = inputs[0].as<const float>();
    float* y = outputs[0].as<float>();
    if (k_ == 1) {  // nothing to reduce: the bytes are the same
      if (m_ * n_ > 0) std::memcpy(y, x, static_cast<size_t>(m_ * n_) * sizeof(float));
      return;
    }
    parallel_for(units_, threads_, parallel_, [&](int64_t u) {
      const int64_t m = u / col_blocks_, b = u % col_blocks_;
      if (n_ == 1) {
        y[m] = scale_ * sum_contiguous(x + m * k_, k_);
      } else {
        add_rows(x + m * k_ * n_, y + m * n_, k_, n_, n_ * b / col_blocks_, n_ * (b + 1) / col_blocks_,
                 scale_);
      }
    });
  }

 private:
  int64_t m_, k_, n_;
  int threads_;
  float scale_ = 1.f;
  int64_t col_blocks_ = 1, units_ = 0;
  bool parallel_ = false;
};

// [M, K, N] when the reduced dims (size-1 dims aside) are adjacent, else nullopt.
std::optional<std::array<int64_t, 3>> block_view(const std::vector<int64_t>& shape,
                                                 const std::vector<bool>& reduced) {
  std::array<int64_t, 3> mkn = {1, 1, 1};
  int part = 0;  // 0: before the reduced block, 1: in it, 2: after it
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (reduced[d] && part == 2) return std::nullopt;  // a second reduced block
    if (reduced[d]) part = 1;
    if (!reduced[d] && part == 1) part = 2;
    mkn[part] *= shape[d];
  }
  return mkn;
}

// Reductions over separate blocks of dims ([K1, M, K2]: [N, C, H, W] -> [1, C, 1, 1]),
// serially. With the dims merged (size-1 dropped, neighbours of one kind joined) and the input
// walked row by row (a row = the innermost merged dim, n elements):
//   innermost reduced: y[o] += sum(row);   innermost kept: y[o : o+n] += row
// then y *= scale (1/count for the mean).
class LoopReduce : public Kernel {
 public:
  LoopReduce(const std::vector<int64_t>& shape, const std::vector<bool>& reduced, bool mean) {
    int64_t count = 1;
    numel_ = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      numel_ *= shape[d];
      if (reduced[d]) count *= shape[d];
      if (shape[d] == 1) continue;
      if (!dims_.empty() && dims_.back().reduced == reduced[d]) {
        dims_.back().size *= shape[d];
      } else {
        dims_.push_back({shape[d], reduced[d], 0});
      }
    }
    PT_CHECK(dims_.size() >= 3, "LoopReduce takes separate reduced blocks");
    out_numel_ = 1;
    for (size_t d = dims_.size(); d-- > 0;) {
      if (dims_[d].reduced) continue;
      dims_[d].out_stride = out_numel_;
      out_numel_ *= dims_[d].size;
    }
    inner_ = dims_.back();
    dims_.pop_back();
    idx_.assign(dims_.size(), 0);
    scale_ = mean ? 1.f / static_cast<float>(count) : 1.f;  // count 0: 0 * inf gives NaN
  }

  void run(std::span<const Buffer> inputs, std::span<const Buffer> outputs, void*) override {
    const float* x = inputs[0].as<const float>();
    float* y = outputs[0].as<float>();
    std::fill(y, y + out_numel_, 0.f);
    std::fill(idx_.begin(), idx_.end(), 0);
    if (dims_.size() == 2 && dims_[0].reduced && inner_.reduced) {  // [K1, M, K2]
      add_row_sums(x, y, dims_[0].size, dims_[1].size, inner_.size);
    } else {
      walk_rows(x, y);
    }
    if (scale_ != 1.f)
      for (int64_t j = 0; j < out_numel_; ++j) y[j] *= scale_;
  }

 private:
  void walk_rows(const float* x, float* y) {
    int64_t o = 0;
    for (int64_t i = 0; i < numel_; i += inner_.size) {
      if (inner_.reduced) {
        y[o] += sum_contiguous(x + i, inner_.size);
      } else {
        for (int64_t c = 0; c < inner_.size; ++c) y[o + c] += x[i + c];
      }
      for (size_t d = dims_.size(); d-- > 0;) {  // next row
        o += dims_[d].out_stride;
        if (++idx_[d] < dims_[d].size) break;
        o -= dims_[d].size * dims_[d].out_stride;
        idx_[d] = 0;
      }
    }
  }

  struct Dim {
    int64_t size;
    bool reduced;
    int64_t out_stride;  // 0 for reduced dims
  };
  std::vector<Dim> dims_;     // merged, all but the innermost
  Dim inner_{1, false, 1};
  std::vector<int64_t> idx_;  // odometer over dims_, reused by every run
  int64_t numel_ = 0, out_numel_ = 0;
  float scale_ = 1.f;
};

// The reduced dims and the spec's checks are reduce_geometry's (exec/kernel_geometry.h).
std::unique_ptr<Kernel> make_reduce(const KernelSpec& s, bool mean) {
  const std::optional<std::vector<bool>> reduced = reduce_geometry(s);
  if (!reduced || s.inputs[0].dtype != DType::kFloat32) return nullptr;
  if (const auto mkn = block_view(s.inputs[0].shape, *reduced))
    return std::make_unique<BlockReduce>((*mkn)[0], (*mkn)[1], (*mkn)[2], mean,
                                         s.cpu ? std::max(1, s.cpu->threads) : 1);
  return std::make_unique<LoopReduce>(s.inputs[0].shape, *reduced, mean);
}

// y[o] = Op over the input elements that reduce to o, from Op's identity: every input element i
// is folded into y at the output offset of its kept coordinates. NaN wins max and min.
struct MaxOf {
  template <class T> static T first() {
    return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
  }
  template <class T> T operator()(T y, T x) const { return y != y || y > x ? y : x; }
};
struct MinOf {
  template <class T> static T first() {
    return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
  }
  template <class T> T operator()(T y, T x) const { return y != y || y < x ? y : x; }
};
struct ProductOf {
  template <class T> static T first() { return T(1); }
  template <class T> T operator()(T y, T x) const { return y * x; }
};

template <class T, class Op>
class WalkReduce final : public Kernel {
 public:
  WalkReduce(const std::vector<int64_t>& shape, const std::vector<bool>& reduced) : shape_(shape) {
    out_stride_.assign(shape.size(), 0);
    for (size_t d = shape.size(); d-- > 0;)
      if (!reduced[d]) out_stride_[d] = out_numel_, out_numel_ *= shape[d];
    numel_ = 1;
    for (int64_t d : shape) numel_ *= d;
  }
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const T* x = in[0].as<const T>();
    T* y = out[0].as<T>();
    std::fill(y, y + out_numel_, Op::template first<T>());
    std::vector<int64_t> idx(shape_.size(), 0);
    int64_t o = 0;
    for (int64_t i = 0; i < numel_; ++i) {
      y[o] = Op{}(y[o], x[i]);
      for (size_t d = shape_.size(); d-- > 0;) {  // next element: an odometer over the dims
        o += out_stride_[d];
        if (++idx[d] < shape_[d]) break;
        o -= shape_[d] * out_stride_[d];
        idx[d] = 0;
      }
    }
  }

 private:
  std::vector<int64_t> shape_, out_stride_;
  int64_t numel_ = 0, out_numel_ = 1;
};

// Max and Min also of bool (any and all), Prod of numbers only.
template <class Op, class Types>
std::unique_ptr<Kernel> make_walk_reduce(const KernelSpec& s, Types types) {
  const std::optional<std::vector<bool>> reduced = reduce_geometry(s);
  if (!reduced) return nullptr;
  return visit(types, s.inputs[0].dtype, [&]<class T>() -> std::unique_ptr<Kernel> {
    return std::make_unique<WalkReduce<T, Op>>(s.inputs[0].shape, *reduced);
  });
}
using Numbers = TypeList<float, double, int32_t, int64_t>;
using NumbersAndBool = TypeList<float, double, int32_t, int64_t, bool>;

}  // namespace

std::unique_ptr<Kernel> make_reduce_max(const KernelSpec& s) { return make_walk_reduce<MaxOf>(s, NumbersAndBool{}); }
std::unique_ptr<Kernel> make_reduce_min(const KernelSpec& s) { return make_walk_reduce<MinOf>(s, NumbersAndBool{}); }
std::unique_ptr<Kernel> make_reduce_prod(const KernelSpec& s) { return make_walk_reduce<ProductOf>(s, Numbers{}); }
std::unique_ptr<Kernel> make_reduce_mean(const KernelSpec& s) { return make_reduce(s, true); }
std::unique_ptr<Kernel> make_reduce_sum(const KernelSpec& s) { return make_reduce(s, false); }

}  // namespace pt::cpu
