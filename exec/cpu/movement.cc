// exec/cpu/movement.cc: the data-movement kernels (see cpu_kernels.h): reshapes as copies,
// Transpose, Concat, Split, Slice, Expand (all one strided-copy plan, made in the factory) and
// Gather (rows picked by indices read at run time). The reductions are in reduce.cc.
//
// Every op here moves bytes without reading them, so one kernel serves float32, int32, int64 and
// bool (element sizes 4, 4, 8, 1).
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>

#include "core/error.h"
#include "exec/cpu/cpu_kernels.h"

namespace pt::cpu {
namespace {

constexpr int64_t kParallelBytes = 1 << 16;  // below this a copy runs on the calling thread
constexpr size_t kMaxDims = 16;              // dims of a copy plan after merging
constexpr int64_t kTile = 32;                // side of a transpose tile, in elements

bool is_movable(DType t) {
  return t == DType::kFloat32 || t == DType::kInt64 || t == DType::kInt32 || t == DType::kBool;
}

int threads_of(const KernelSpec& s) { return s.cpu ? std::max(1, s.cpu->threads) : 1; }

// Row-major strides, in elements.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

int64_t product(const std::vector<int64_t>& v, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= v[i];
  return p;
}

// axis in [-rank, rank) -> [0, rank); -1 when out of range.
int64_t normalize_axis(int64_t axis, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) return -1;
  return axis < 0 ? axis + r : axis;
}

// Integer data of a constant input (int64 or int32), or nullopt when it is not constant.
std::optional<std::vector<int64_t>> constant_ints(const KernelSpec& s, size_t i) {
  const Tensor* t = s.constant(i);
  if (!t) return std::nullopt;
  const int64_t n = t->type.numel();
  std::vector<int64_t> v(static_cast<size_t>(n));
  if (t->type.dtype == DType::kInt64) {
    std::copy(t->as<int64_t>(), t->as<int64_t>() + n, v.begin());
  } else if (t->type.dtype == DType::kInt32) {
    std::copy(t->as<int32_t>(), t->as<int32_t>() + n, v.begin());
  } else {
    return std::nullopt;
  }
  return v;
}

// Rows of a transpose tile written `stride_bytes` apart. Rows 4 KiB apart fall in the same
// L1 set (64 sets of 64 B): keep at most 8 per set, so a 1024x1024 float transpose does not
// thrash; 8..32 rows.
int64_t tile_height(int64_t stride_bytes) {
  const int64_t sets = 4096 / std::gcd<int64_t>(std::abs(stride_bytes), 4096);
  return std::clamp<int64_t>(8 * sets, 8, kTile);
}

// bytes split into up to `threads` chunks of at least kParallelBytes, copied side by side.
void parallel_memcpy(void* dst, const void* src, int64_t bytes, int threads) {
  if (bytes <= 0 || dst == src) return;
  const int64_t chunks = std::clamp<int64_t>(bytes / kParallelBytes, 1, threads);
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
#pragma omp parallel for num_threads(threads) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = bytes * c / chunks, hi = bytes * (c + 1) / chunks;
    std::memcpy(d + lo, s + lo, static_cast<size_t>(hi - lo));
  }
}

// Copies a strided view. For every index i over `shape`:
//   dst[out_offset + sum_k i_k * out_stride_k] = src[in_offset + sum_k i_k * in_stride_k]
// (offsets and strides in elements of esize bytes; strides may be 0 (broadcast) or negative).
// The constructor drops size-1 dims and merges neighbours that are contiguous on both sides, so
// the innermost dim ("a row") is as long as possible: a memcpy when both its strides are 1, a
// strided loop otherwise, and tiles of up to 32x32 when the dim next to it is contiguous on the
// input side (a transpose of the last two dims, NCHW -> NHWC, ...). [B,S,H,D] -> [B,H,S,D]
// keeps D contiguous: rows of D floats, each a memcpy.
class StridedCopy {
 public:
  StridedCopy(std::vector<int64_t> shape, std::vector<int64_t> in_stride,
              std::vector<int64_t> out_stride, int64_t in_offset, int64_t out_offset,
              size_t esize, int threads);
  bool valid() const { return outer_.size() < kMaxDims; }
  void run(const void* src, void* dst) const;

 private:
  struct Dim {
    int64_t size, in, out;  // extent; input and output strides
  };
  template <class T>
  void copy_rows(int64_t begin, int64_t end, const T* src, T* dst) const;
  template <class T>
  void copy_tiles(int64_t begin, int64_t end, const T* src, T* dst) const;
  template <class T>
  void run_as(const void* src, void* dst) const;

  std::vector<Dim> outer_;  // all dims but the innermost, outermost first
  Dim inner_{1, 1, 1};
  int64_t in_offset_, out_offset_;
  size_t esize_;
  int threads_;
  bool empty_ = false;      // nothing to copy
  bool tiled_ = false;      // outer_.back() is input-contiguous and inner_ is not
  int64_t tile_a_ = kTile;  // tile height along A when tiled_
  int64_t units_ = 0;       // rows, or (batch row, tile row) pairs when tiled_
  int64_t chunks_ = 1;      // parallel pieces of units_
};

StridedCopy::StridedCopy(std::vector<int64_t> shape, std::vector<int64_t> in_stride,
                         std::vector<int64_t> out_stride, int64_t in_offset, int64_t out_offset,
                         size_t esize, int threads)
    : in_offset_(in_offset), out_offset_(out_offset), esize_(esize), threads_(threads) {
  std::vector<Dim> dims;
  int64_t numel = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    numel *= shape[k];
    if (shape[k] == 1) continue;
    if (!dims.empty() && dims.back().in == in_stride[k] * shape[k] &&
        dims.back().out == out_stride[k] * shape[k]) {
      dims.back() = {dims.back().size * shape[k], in_stride[k], out_stride[k]};
    } else {
      dims.push_back({shape[k], in_stride[k], out_stride[k]});
    }
  }
  empty_ = numel == 0;
  if (!dims.empty()) {
    inner_ = dims.back();
    dims.pop_back();
  }
  outer_ = std::move(dims);
  tiled_ = !outer_.empty() && outer_.back().in == 1 && inner_.out == 1 && inner_.in != 1 &&
           inner_.in != 0;
  const int64_t rows = std::max<int64_t>(1, numel / std::max<int64_t>(1, inner_.size));
  if (tiled_) {
    tile_a_ = tile_height(outer_.back().out * static_cast<int64_t>(esize));
    units_ = rows / outer_.back().size * ((outer_.back().size + tile_a_ - 1) / tile_a_);
  } else {
    units_ = rows;
  }
  const int64_t bytes = numel * static_cast<int64_t>(esize);
  chunks_ = std::clamp<int64_t>(std::min(units_, bytes / kParallelBytes), 1, threads_);
}

// Rows [begin, end) of the outer index space, walked with an odometer.
template <class T>
void StridedCopy::copy_rows(int64_t begin, int64_t end, const T* src, T* dst) const {
  const size_t nd = outer_.size();
  std::array<int64_t, kMaxDims> idx{};
  int64_t in = in_offset_, out = out_offset_;
  int64_t r = begin;
  for (size_t d = nd; d-- > 0;) {
    idx[d] = r % outer_[d].size;
    r /= outer_[d].size;
    in += idx[d] * outer_[d].in;
    out += idx[d] * outer_[d].out;
  }
  const bool contiguous = inner_.in == 1 && inner_.out == 1;
  for (int64_t row = begin; row < end; ++row) {
    if (contiguous) {
      std::memcpy(dst + out, src + in, static_cast<size_t>(inner_.size) * sizeof(T));
    } else {
      for (int64_t j = 0; j < inner_.size; ++j) dst[out + j * inner_.out] = src[in + j * inner_.in];
    }
    for (size_t d = nd; d-- > 0;) {
      in += outer_[d].in;
      out += outer_[d].out;
      if (++idx[d] < outer_[d].size) break;
      in -= outer_[d].size * outer_[d].in;
      out -= outer_[d].size * outer_[d].out;
      idx[d] = 0;
    }
  }
}

// Units [begin, end) of (batch row, tile row); a tile row is tile_a_ rows of the
// input-contiguous dim A = outer_.back() against the whole inner dim, in tile_a_ x kTile tiles.
template <class T>
void StridedCopy::copy_tiles(int64_t begin, int64_t end, const T* src, T* dst) const {
  const Dim& a = outer_.back();
  const int64_t tile_rows = (a.size + tile_a_ - 1) / tile_a_;
  for (int64_t u = begin; u < end; ++u) {
    int64_t in = in_offset_, out = out_offset_;
    int64_t b = u / tile_rows;
    for (size_t d = outer_.size() - 1; d-- > 0;) {
      in += (b % outer_[d].size) * outer_[d].in;
      out += (b % outer_[d].size) * outer_[d].out;
      b /= outer_[d].size;
    }
    const int64_t i0 = (u % tile_rows) * tile_a_, i1 = std::min(a.size, i0 + tile_a_);
    for (int64_t j0 = 0; j0 < inner_.size; j0 += kTile) {
      const int64_t j1 = std::min(inner_.size, j0 + kTile);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) dst[out + i * a.out + j] = src[in + i + j * inner_.in];
    }
  }
}

template <class T>
void StridedCopy::run_as(const void* src, void* dst) const {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
#pragma omp parallel for num_threads(threads_) if (chunks_ > 1)
  for (int64_t c = 0; c < chunks_; ++c) {
    const int64_t lo = units_ * c / chunks_, hi = units_ * (c + 1) / chunks_;
    if (tiled_) {
      copy_tiles(lo, hi, s, d);
    } else {
      copy_rows(lo, hi, s, d);
    }
  }
}

void StridedCopy::run(const void* src, void* dst) const {
  if (empty_) return;
  if (outer_.empty() && inner_.in == 1 && inner_.out == 1) {  // one contiguous block
    parallel_memcpy(static_cast<std::byte*>(dst) + out_offset_ * esize_,
                    static_cast<const std::byte*>(src) + in_offset_ * esize_,
                    inner_.size * static_cast<int64_t>(esize_), threads_);
    return;
  }
  switch (esize_) {
    case 1: run_as<uint8_t>(src, dst); break;
    case 4: run_as<uint32_t>(src, dst); break;
    case 8: run_as<uint64_t>(src, dst); break;
    default: PT_CHECK(false, "element size " + std::to_string(esize_));
  }
}

// One or more strided copies from input `from[k]` to output `to[k]`: Transpose, Slice and
// Expand have one, Concat one per input, Split one per output.
class CopyKernel : public Kernel {
 public:
  struct Part {
    StridedCopy copy;
    size_t from, to;
  };
  explicit CopyKernel(std::vector<Part> parts) : parts_(std::move(parts)) {}
  void run(std::span<const Buffer> inputs, std::span<const Buffer> outputs, void*) override {
    for (const Part& p : parts_) p.copy.run(inputs[p.from].data, outputs[p.to].data);
  }

 private:
  std::vector<Part> parts_;
};

std::unique_ptr<Kernel> make_copy_kernel(std::vector<CopyKernel::Part> parts) {
  for (const auto& p : parts)
    if (!p.copy.valid()) return nullptr;
  return std::make_unique<CopyKernel>(std::move(parts));
}

// Input 0 and output 0 present, with one movable dtype.
bool same_movable_type(const KernelSpec& s) {
  return s.has_input(0) && !s.outputs.empty() && is_movable(s.inputs[0].dtype) &&
         s.outputs[0].dtype == s.inputs[0].dtype;
}

// Reshape, Flatten, Squeeze, Unsqueeze, Identity: the output holds the input's bytes.
class ReshapeKernel : public Kernel {
 public:
  ReshapeKernel(int64_t bytes, int threads) : bytes_(bytes), threads_(threads) {}
  void run(std::span<const Buffer> inputs, std::span<const Buffer> outputs, void*) override {
    parallel_memcpy(outputs[0].data, inputs[0].data, bytes_, threads_);  // no-op when aliased
  }

 private:
  int64_t bytes_;
  int threads_;
};

// Gather(data, indices, axis): with data viewed as [outer, n, inner] around `axis`,
//   out[o, i, :] = data[o, idx[i] (+ n if negative), :]   for every flat index i of `indices`.
// Indices are the user's data: each run checks them all before copying.
class GatherKernel : public Kernel {
 public:
  GatherKernel(std::string node, DType index_type, int64_t outer, int64_t n, int64_t count,
               int64_t row_bytes, int threads)
      : node_(std::move(node)), index_type_(index_type), outer_(outer), n_(n), count_(count),
        row_bytes_(row_bytes), threads_(threads) {}

  void run(std::span<const Buffer> inputs, std::span<const Buffer> outputs, void*) override {
    if (index_type_ == DType::kInt64) {
      gather(inputs[1].as<const int64_t>(), inputs[0].as<const std::byte>(),
             outputs[0].as<std::byte>());
    } else {
      gather(inputs[1].as<const int32_t>(), inputs[0].as<const std::byte>(),
             outputs[0].as<std::byte>());
    }
  }

 private:
  template <class I>
  void check(const I* idx) const {
    for (int64_t i = 0; i < count_; ++i) {
      if (idx[i] < -n_ || idx[i] >= n_)
        throw UserError("Gather node '" + node_ + "'",
                        "index " + std::to_string(idx[i]) + " out of range [-" +
                            std::to_string(n_) + ", " + std::to_string(n_) + ")",
                        "check the token ids against the vocabulary size");
    }
  }

  template <class I>
  void gather(const I* idx, const std::byte* data, std::byte* out) const {
    check(idx);
    const int64_t rows = outer_ * count_;
    if (rows * row_bytes_ == 0) return;  // an empty output
    const bool parallel = rows > 1 && rows * row_bytes_ >= kParallelBytes && threads_ > 1;
#pragma omp parallel for num_threads(threads_) if (parallel)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = r / count_, i = r % count_;
      const int64_t k = idx[i] < 0 ? idx[i] + n_ : idx[i];
      std::memcpy(out + r * row_bytes_, data + (o * n_ + k) * row_bytes_,
                  static_cast<size_t>(row_bytes_));
    }
  }

  std::string node_;
  DType index_type_;
  int64_t outer_, n_, count_, row_bytes_;
  int threads_;
};

// Output shape of Slice, and the copy, from constant starts/ends/axes/steps. ONNX's clamping:
// negative starts/ends count from the end; with step > 0 both clamp to [0, d], with step < 0
// start clamps to [0, d-1] and end to [-1, d-1]; count = ceil((end - start) / step), >= 0.
std::optional<StridedCopy> plan_slice(const KernelSpec& s) {
  const auto starts = constant_ints(s, 1), ends = constant_ints(s, 2);
  if (!starts || !ends || starts->size() != ends->size()) return std::nullopt;
  const std::vector<int64_t>& in_shape = s.inputs[0].shape;
  const size_t rank = in_shape.size();
  std::vector<int64_t> axes(starts->size()), steps(starts->size(), 1);
  for (size_t k = 0; k < axes.size(); ++k) axes[k] = static_cast<int64_t>(k);
  if (s.has_input(3)) {
    const auto a = constant_ints(s, 3);
    if (!a || a->size() != axes.size()) return std::nullopt;
    axes = *a;
  }
  if (s.has_input(4)) {
    const auto st = constant_ints(s, 4);
    if (!st || st->size() != steps.size()) return std::nullopt;
    steps = *st;
  }
  std::vector<int64_t> shape = in_shape, in_stride = strides_of(in_shape);
  std::vector<bool> seen(rank, false);
  int64_t offset = 0;
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t ax = normalize_axis(axes[k], rank);
    if (ax < 0 || seen[ax] || steps[k] == 0) return std::nullopt;
    seen[ax] = true;
    const int64_t d = in_shape[ax], step = steps[k];
    int64_t b = (*starts)[k], e = (*ends)[k];
    if (b < 0) b += d;
    if (e < 0) e += d;
    int64_t count;
    if (step > 0) {
      b = std::clamp<int64_t>(b, 0, d);
      e = std::clamp<int64_t>(e, 0, d);
      count = e > b ? (e - b + step - 1) / step : 0;
    } else {
      b = std::clamp<int64_t>(b, 0, d - 1);
      e = std::clamp<int64_t>(e, -1, d - 1);
      count = b > e ? (b - e - step - 1) / -step : 0;
    }
    shape[ax] = count;
    if (count > 0) offset += b * in_stride[ax];
    in_stride[ax] *= step;
  }
  if (shape != s.outputs[0].shape) return std::nullopt;
  return StridedCopy(shape, in_stride, strides_of(shape), offset, 0,
                     dtype_size(s.inputs[0].dtype), threads_of(s));
}

// Split sizes along `axis`, taken from the output types and checked against input 1 (opset
// 13) or the `split` attribute when either is given; empty on a mismatch.
std::vector<int64_t> split_sizes(const KernelSpec& s, size_t axis) {
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const TensorType& o : s.outputs) {
    if (o.dtype != s.inputs[0].dtype || o.shape.size() != s.inputs[0].shape.size()) return {};
    for (size_t k = 0; k < o.shape.size(); ++k)
      if (k != axis && o.shape[k] != s.inputs[0].shape[k]) return {};
    sizes.push_back(o.shape[axis]);
    total += o.shape[axis];
  }
  if (total != s.inputs[0].shape[axis]) return {};
  std::vector<int64_t> given = s.node.attr_ints("split");
  if (s.has_input(1)) {
    const auto c = constant_ints(s, 1);
    if (!c) return {};
    given = *c;
  }
  if (!given.empty() && given != sizes) return {};
  return sizes;
}

}  // namespace

std::unique_ptr<Kernel> make_reshape(const KernelSpec& s) {
  if (!same_movable_type(s) || s.inputs[0].numel() != s.outputs[0].numel()) return nullptr;
  return std::make_unique<ReshapeKernel>(s.inputs[0].bytes(), threads_of(s));
}

// Transpose(perm): out[i_0, ..., i_{r-1}] = in[j] with j[perm[k]] = i_k; perm defaults to
// reversed. A strided copy reading input stride perm[k] for output dim k.
std::unique_ptr<Kernel> make_transpose(const KernelSpec& s) {
  if (!same_movable_type(s)) return nullptr;
  const std::vector<int64_t>& in_shape = s.inputs[0].shape;
  const size_t rank = in_shape.size();
  std::vector<int64_t> perm = s.node.attr_ints("perm");
  if (perm.empty())
    for (size_t k = rank; k-- > 0;) perm.push_back(static_cast<int64_t>(k));
  if (perm.size() != rank) return nullptr;
  std::vector<bool> seen(rank, false);
  const std::vector<int64_t> in_stride = strides_of(in_shape);
  std::vector<int64_t> shape(rank), stride(rank);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t p = normalize_axis(perm[k], rank);
    if (p < 0 || seen[p]) return nullptr;
    seen[p] = true;
    shape[k] = in_shape[p];
    stride[k] = in_stride[p];
  }
  if (shape != s.outputs[0].shape) return nullptr;
  std::vector<CopyKernel::Part> parts;
  parts.push_back({StridedCopy(shape, stride, strides_of(shape), 0, 0,
                               dtype_size(s.inputs[0].dtype), threads_of(s)),
                   0, 0});
  return make_copy_kernel(std::move(parts));
}

// Concat(axis): output [outer, sum_k a_k, inner]; input k [outer, a_k, inner] is copied to
// output columns starting at a_0 + ... + a_{k-1}.
std::unique_ptr<Kernel> make_concat(const KernelSpec& s) {
  if (!same_movable_type(s)) return nullptr;
  const TensorType& out = s.outputs[0];
  if (!s.node.has_attr("axis")) return nullptr;  // required
  const int64_t axis = normalize_axis(s.node.attr_int("axis", 0), out.shape.size());
  if (axis < 0) return nullptr;
  const int64_t outer = product(out.shape, 0, axis);
  const int64_t inner = product(out.shape, axis + 1, out.shape.size());
  const int64_t out_row = out.shape[axis] * inner;
  std::vector<CopyKernel::Part> parts;
  int64_t at = 0;
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    const TensorType& in = s.inputs[k];
    if (in.dtype != out.dtype || in.shape.size() != out.shape.size()) return nullptr;
    for (size_t d = 0; d < in.shape.size(); ++d)
      if (d != static_cast<size_t>(axis) && in.shape[d] != out.shape[d]) return nullptr;
    const int64_t row = in.shape[axis] * inner;
    parts.push_back({StridedCopy({outer, row}, {row, 1}, {out_row, 1}, 0, at * inner,
                                 dtype_size(out.dtype), threads_of(s)),
                     k, 0});
    at += in.shape[axis];
  }
  if (at != out.shape[axis]) return nullptr;
  return make_copy_kernel(std::move(parts));
}

// Split(axis, split): input [outer, sum_k a_k, inner]; output k [outer, a_k, inner] is copied
// from input columns starting at a_0 + ... + a_{k-1}. Sizes come from the output types.
std::unique_ptr<Kernel> make_split(const KernelSpec& s) {
  if (!same_movable_type(s) || s.inputs[0].shape.empty()) return nullptr;
  const TensorType& in = s.inputs[0];
  const int64_t axis = normalize_axis(s.node.attr_int("axis", 0), in.shape.size());
  if (axis < 0) return nullptr;
  const std::vector<int64_t> sizes = split_sizes(s, static_cast<size_t>(axis));
  if (sizes.empty()) return nullptr;
  const int64_t outer = product(in.shape, 0, axis);
  const int64_t inner = product(in.shape, axis + 1, in.shape.size());
  const int64_t in_row = in.shape[axis] * inner;
  std::vector<CopyKernel::Part> parts;
  int64_t at = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t row = sizes[k] * inner;
    parts.push_back({StridedCopy({outer, row}, {in_row, 1}, {row, 1}, at * inner, 0,
                                 dtype_size(in.dtype), threads_of(s)),
                     0, k});
    at += sizes[k];
  }
  return make_copy_kernel(std::move(parts));
}

// Slice(data, starts, ends, axes, steps), inputs 1..4 constant: a strided view of data.
std::unique_ptr<Kernel> make_slice(const KernelSpec& s) {
  if (!same_movable_type(s)) return nullptr;
  std::optional<StridedCopy> copy = plan_slice(s);
  if (!copy) return nullptr;
  std::vector<CopyKernel::Part> parts;
  parts.push_back({std::move(*copy), 0, 0});
  return make_copy_kernel(std::move(parts));
}

// Gather(data, indices, axis): output = data.shape[:axis] + indices.shape + data.shape[axis+1:].
// Embeddings are data [V, D], indices [B, S] -> [B, S, D].
std::unique_ptr<Kernel> make_gather(const KernelSpec& s) {
  if (!same_movable_type(s) || !s.has_input(1) || s.inputs[0].shape.empty()) return nullptr;
  const TensorType &data = s.inputs[0], &idx = s.inputs[1];
  if (idx.dtype != DType::kInt64 && idx.dtype != DType::kInt32) return nullptr;
  const int64_t axis = normalize_axis(s.node.attr_int("axis", 0), data.shape.size());
  if (axis < 0) return nullptr;
  std::vector<int64_t> shape(data.shape.begin(), data.shape.begin() + axis);
  shape.insert(shape.end(), idx.shape.begin(), idx.shape.end());
  shape.insert(shape.end(), data.shape.begin() + axis + 1, data.shape.end());
  if (shape != s.outputs[0].shape) return nullptr;
  const int64_t row_bytes = product(data.shape, axis + 1, data.shape.size()) *
                            static_cast<int64_t>(dtype_size(data.dtype));
  return std::make_unique<GatherKernel>(s.node.name, idx.dtype, product(data.shape, 0, axis),
                                        data.shape[axis], idx.numel(), row_bytes, threads_of(s));
}

// Expand(input, shape): numpy broadcast of input to the output shape (= broadcast(input.shape,
// shape)); dims are aligned on the right and a size-1 input dim is read with stride 0.
std::unique_ptr<Kernel> make_expand(const KernelSpec& s) {
  if (!same_movable_type(s)) return nullptr;
  const std::vector<int64_t>& in_shape = s.inputs[0].shape;
  const std::vector<int64_t>& out_shape = s.outputs[0].shape;
  if (s.has_input(1)) {  // the output must be broadcast(input, shape)
    const auto target = constant_ints(s, 1);
    if (!target) return nullptr;
    const size_t rank = std::max(in_shape.size(), target->size());
    std::vector<int64_t> want(rank);
    for (size_t k = 0; k < rank; ++k) {
      const int64_t a = k + in_shape.size() >= rank ? in_shape[k + in_shape.size() - rank] : 1;
      const int64_t b = k + target->size() >= rank ? (*target)[k + target->size() - rank] : 1;
      if (a != b && a != 1 && b != 1) return nullptr;
      want[k] = a == 1 ? b : a;
    }
    if (want != out_shape) return nullptr;
  }
  if (out_shape.size() < in_shape.size()) return nullptr;
  const size_t lead = out_shape.size() - in_shape.size();
  const std::vector<int64_t> in_stride = strides_of(in_shape);
  std::vector<int64_t> stride(out_shape.size(), 0);
  for (size_t k = 0; k < in_shape.size(); ++k) {
    if (in_shape[k] != out_shape[lead + k] && in_shape[k] != 1) return nullptr;
    stride[lead + k] = in_shape[k] == 1 ? 0 : in_stride[k];
  }
  std::vector<CopyKernel::Part> parts;
  parts.push_back({StridedCopy(out_shape, stride, strides_of(out_shape), 0, 0,
                               dtype_size(s.inputs[0].dtype), threads_of(s)),
                   0, 0});
  return make_copy_kernel(std::move(parts));
}

}  // namespace pt::cpu
