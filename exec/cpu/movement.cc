// exec/cpu/movement.cc: the data-movement kernels (see cpu_kernels.h): reshapes as copies,
// Transpose, Concat, Split, Slice, Expand (strided copies planned in the factory from the
// geometry of exec/movement_geometry.h) and Gather (rows picked by indices read at run time).
// The reductions are in reduce.cc.
//
// Every op here moves bytes without reading them, so one kernel serves float32, int32, int64 and
// bool (element sizes 4, 4, 8, 1).
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/parallel.h"
#include "exec/movement_geometry.h"

namespace pt::cpu {
namespace {

constexpr int64_t kParallelBytes = 1 << 16;  // below this a copy runs on the calling thread
constexpr size_t kMaxDims = 16;              // dims of a copy plan after merging
constexpr int64_t kTile = 32;                // side of a transpose tile, in elements

bool is_movable(DType t) {
  return t == DType::kFloat32 || t == DType::kInt64 || t == DType::kInt32 || t == DType::kBool;
}

int threads_of(const KernelSpec& s) { return s.cpu ? std::max(1, s.cpu->threads) : 1; }

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
  parallel_for(chunks, threads, chunks > 1, [&](int64_t c) {
    const int64_t lo = bytes * c / chunks, hi = bytes * (c + 1) / chunks;
    std::memcpy(d + lo, s + lo, static_cast<size_t>(hi - lo));
  });
}

// Copies a strided view (CopyGeometry, exec/movement_geometry.h): for every index i over `shape`,
//   dst[out_offset + sum_k i_k * out_stride_k] = src[in_offset + sum_k i_k * in_stride_k]
// (offsets and strides in elements of esize bytes; strides may be 0 (broadcast) or negative).
// The constructor drops size-1 dims and merges neighbours that are contiguous on both sides
// (merge_copy_dims), so the innermost dim ("a row") is as long as possible: a memcpy when both
// its strides are 1, a strided loop otherwise, and tiles of up to 32x32 when the dim next to it
// is contiguous on the input side (a transpose of the last two dims, NCHW -> NHWC, ...).
// [B,S,H,D] -> [B,H,S,D] keeps D contiguous: rows of D floats, each a memcpy.
class StridedCopy {
 public:
  StridedCopy(const CopyGeometry& g, size_t esize, int threads);
  bool valid() const { return outer_.size() < kMaxDims; }
  void run(const void* src, void* dst) const;

 private:
  using Dim = CopyDim;  // extent; input and output strides
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

StridedCopy::StridedCopy(const CopyGeometry& g, size_t esize, int threads)
    : in_offset_(g.in_offset), out_offset_(g.out_offset), esize_(esize), threads_(threads) {
  std::vector<Dim> dims = merge_copy_dims(g.shape, g.in_stride, g.out_stride);
  const int64_t numel = product(g.shape, 0, g.shape.size());
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

#if defined(__x86_64__)
// An 8 x 8 block of 4-byte elements transposed in registers: row r of src (8 contiguous
// elements, rows src_stride apart) becomes column r of dst (rows dst_stride apart). AVX only; the
// caller checks the CPU has it. Only moves bits (loads, shuffles, stores), so any 4-byte type
// goes through as float.
__attribute__((target("avx"))) void transpose_8x8(const uint32_t* src, int64_t src_stride,
                                                   uint32_t* dst, int64_t dst_stride) {
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + k * src_stride));
  for (int k = 0; k < 8; k += 2) {  // interleave row pairs: (0,1) (2,3) (4,5) (6,7)
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {  // 2 x 2 blocks of pairs within each 128-bit half
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {  // the halves: rows 0-3 from the low ones, 4-7 from the high
    t[k] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x20);
    t[k + 4] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x31);
  }
  for (int k = 0; k < 8; ++k) _mm256_storeu_ps(reinterpret_cast<float*>(dst + k * dst_stride), t[k]);
}
const bool kHasAvx = __builtin_cpu_supports("avx");
#endif

// Units [begin, end) of (batch row, tile row); a tile row is tile_a_ rows of the
// input-contiguous dim A = outer_.back() against the whole inner dim, in tile_a_ x kTile tiles.
// 4-byte elements go through 8 x 8 blocks in registers where the CPU has AVX (4.5x faster on
// attention's key transpose); the rest of a tile, and other sizes, element by element.
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
      int64_t jb = j0, ib = i0;  // the blocks cover [i0, ib) x [j0, jb)
#if defined(__x86_64__)
      if constexpr (sizeof(T) == 4) {
        if (kHasAvx) {
          ib = i0 + (i1 - i0) / 8 * 8;
          jb = j0 + (j1 - j0) / 8 * 8;
          for (int64_t j = j0; j < jb; j += 8)
            for (int64_t i = i0; i < ib; i += 8)
              transpose_8x8(src + in + i + j * inner_.in, inner_.in, dst + out + i * a.out + j, a.out);
        }
      }
#endif
      for (int64_t j = j0; j < j1; ++j)  // beside the blocks every row, under them the rest
        for (int64_t i = j < jb ? ib : i0; i < i1; ++i) dst[out + i * a.out + j] = src[in + i + j * inner_.in];
    }
  }
}

template <class T>
void StridedCopy::run_as(const void* src, void* dst) const {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  parallel_for(chunks_, threads_, chunks_ > 1, [&](int64_t c) {
    const int64_t lo = units_ * c / chunks_, hi = units_ * (c + 1) / chunks_;
    if (tiled_) {
      copy_tiles(lo, hi, s, d);
    } else {
      copy_rows(lo, hi, s, d);
    }
  });
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

}  // namespace

std::function<void(const float*, float*)> matrix_transpose(int64_t rows, int64_t cols, int threads) {
  const CopyGeometry g{{cols, rows}, {1, cols}, {rows, 1}};
  auto copy = std::make_shared<const StridedCopy>(g, sizeof(float), threads);
  return [copy](const float* src, float* dst) { copy->run(src, dst); };
}

namespace {

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

// The kernel running `copies` on elements of the spec's dtype (input 0's); nullptr when a copy
// keeps too many dims after merging, or when there are no copies (the geometry was nullopt).
std::unique_ptr<Kernel> make_copy_kernel(const KernelSpec& s,
                                         const std::optional<std::vector<CopyGeometry>>& copies) {
  if (!copies) return nullptr;
  std::vector<CopyKernel::Part> parts;
  for (const CopyGeometry& g : *copies) {
    parts.push_back({StridedCopy(g, dtype_size(s.inputs[0].dtype), threads_of(s)), g.from, g.to});
    if (!parts.back().copy.valid()) return nullptr;
  }
  return std::make_unique<CopyKernel>(std::move(parts));
}

std::unique_ptr<Kernel> make_copy_kernel(const KernelSpec& s,
                                         const std::optional<CopyGeometry>& copy) {
  if (!copy) return nullptr;
  const std::optional<std::vector<CopyGeometry>> copies = std::vector<CopyGeometry>{*copy};
  return make_copy_kernel(s, copies);
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
    parallel_for(rows, threads_, parallel, [&](int64_t r) {
      const int64_t o = r / count_, i = r % count_;
      const int64_t k = idx[i] < 0 ? idx[i] + n_ : idx[i];
      std::memcpy(out + r * row_bytes_, data + (o * n_ + k) * row_bytes_,
                  static_cast<size_t>(row_bytes_));
    });
  }

  std::string node_;
  DType index_type_;
  int64_t outer_, n_, count_, row_bytes_;
  int threads_;
};

}  // namespace

std::unique_ptr<Kernel> make_reshape(const KernelSpec& s) {
  if (!same_movable_type(s) || s.inputs[0].numel() != s.outputs[0].numel()) return nullptr;
  return std::make_unique<ReshapeKernel>(s.inputs[0].bytes(), threads_of(s));
}

// Transpose, Slice, Expand: one strided copy; Concat: one per input; Split: one per output.
// Their geometry is exec/movement_geometry.h's.
std::unique_ptr<Kernel> make_transpose(const KernelSpec& s) {
  return same_movable_type(s) ? make_copy_kernel(s, transpose_geometry(s)) : nullptr;
}

std::unique_ptr<Kernel> make_slice(const KernelSpec& s) {
  return same_movable_type(s) ? make_copy_kernel(s, slice_geometry(s)) : nullptr;
}

std::unique_ptr<Kernel> make_expand(const KernelSpec& s) {
  return same_movable_type(s) ? make_copy_kernel(s, expand_geometry(s)) : nullptr;
}

std::unique_ptr<Kernel> make_concat(const KernelSpec& s) {
  return same_movable_type(s) ? make_copy_kernel(s, concat_geometry(s)) : nullptr;
}

std::unique_ptr<Kernel> make_split(const KernelSpec& s) {
  return same_movable_type(s) ? make_copy_kernel(s, split_geometry(s)) : nullptr;
}

std::unique_ptr<Kernel> make_tile(const KernelSpec& s) {
  return same_movable_type(s) ? make_copy_kernel(s, tile_geometry(s)) : nullptr;
}

namespace {

// Trilu(x, k?) {upper}: over the last two dims (rows n, columns m) of x, element (i, j) is kept
// where j - i >= k (upper) or j - i <= k (lower), else zero: the same bytes or all-zero bytes
// (0, 0.0 or false in every dtype). k: a constant, or read from input 1 each run.
class TriluKernel final : public Kernel {
 public:
  TriluKernel(int64_t matrices, int64_t n, int64_t m, size_t esize, bool upper, std::optional<int64_t> k)
      : matrices_(matrices), n_(n), m_(m), esize_(esize), upper_(upper), k_(k) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const int64_t k = k_ ? *k_ : in[1].as<const int64_t>()[0];
    const auto* x = in[0].as<const std::byte>();
    auto* y = out[0].as<std::byte>();
    for (int64_t b = 0; b < matrices_; ++b)
      for (int64_t i = 0; i < n_; ++i) {
        // Row i keeps columns [lo, hi): upper j >= i + k, lower j <= i + k.
        const int64_t lo = upper_ ? std::clamp<int64_t>(i + k, 0, m_) : 0;
        const int64_t hi = upper_ ? m_ : std::clamp<int64_t>(i + k + 1, 0, m_);
        const size_t row = static_cast<size_t>((b * n_ + i) * m_) * esize_;
        std::memset(y + row, 0, static_cast<size_t>(m_) * esize_);
        if (hi > lo)
          std::memcpy(y + row + static_cast<size_t>(lo) * esize_, x + row + static_cast<size_t>(lo) * esize_,
                      static_cast<size_t>(hi - lo) * esize_);
      }
  }

 private:
  int64_t matrices_, n_, m_;
  size_t esize_;
  bool upper_;
  std::optional<int64_t> k_;
};

}  // namespace

// Trilu(x: T, k?: int64 scalar) -> y: T, x of rank >= 2, any movable T.
std::unique_ptr<Kernel> make_trilu(const KernelSpec& s) {
  if (!same_movable_type(s) || s.outputs[0].shape != s.inputs[0].shape || s.inputs[0].shape.size() < 2)
    return nullptr;
  std::optional<int64_t> k = 0;
  if (s.has_input(1)) {
    if (s.inputs[1].dtype != DType::kInt64 || s.inputs[1].numel() != 1) return nullptr;
    const Tensor* c = s.constant(1);
    k = c ? std::optional<int64_t>(c->as<int64_t>()[0]) : std::nullopt;
  }
  const Dims& d = s.inputs[0].shape;
  const int64_t n = d[d.size() - 2], m = d.back();
  const int64_t matrices = n * m == 0 ? 0 : s.inputs[0].numel() / (n * m);
  return std::make_unique<TriluKernel>(matrices, n, m, dtype_size(s.inputs[0].dtype),
                                       s.node.attr_int("upper", 1) != 0, k);
}

// Gather(data, indices, axis): output = data.shape[:axis] + indices.shape + data.shape[axis+1:].
// Embeddings are data [V, D], indices [B, S] -> [B, S, D].
std::unique_ptr<Kernel> make_gather(const KernelSpec& s) {
  if (!same_movable_type(s)) return nullptr;
  const auto g = gather_geometry(s);
  if (!g) return nullptr;
  const int64_t row_bytes = g->inner * static_cast<int64_t>(dtype_size(s.inputs[0].dtype));
  return std::make_unique<GatherKernel>(s.node.name, g->index_type, g->outer, g->n, g->count,
                                        row_bytes, threads_of(s));
}

}  // namespace pt::cpu
