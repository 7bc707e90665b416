// exec/cpu/attention.cc: FusedAttention and FusedAttentionGrad (core/pipetrain_ops.h has their
// math) as tiled loops that never hold the S x T scores: the forward keeps each query row's
// running max, sum and output while it walks the keys a tile at a time (online softmax) and
// writes Y and the row's log-sum-exp; the backward recomputes each tile's probabilities from the
// log-sum-exp (FlashAttention-2's algorithm). A (block of 32 query rows, tile of 64 keys) pair is
// the unit: its products (scores, dY V^T, P V, dS K, P^T dY, dS^T Q) run as register-blocked
// small products, a few rows by up to 64 columns of sums held in registers (lane_math.h's 16-lane
// types: one copy per ISA, each with a block its registers hold). Work is split over (batch, head,
// 128 query rows) for Y; the backward runs whole kv heads per thread where there are at least two per
// thread (each pair visited once for dQ, dK and dV), else dQ per (batch, head, query tile) and
// dK, dV per (batch, kv head, key tile). Every sum is taken in one fixed order within one work
// item, so the bits do not depend on the thread count or on the split. Causal programs skip the
// key tiles wholly above the diagonal.
//
//   Q [B, H, S, D], K [B, Hkv, T, D], V [B, Hkv, T, Dv], H = G * Hkv (head h reads kv head h / G)
//   s_ij = scale * q_i . k_j + mask_ij (mask_ij = -inf where causal and j > i, or where a bool
//          mask is false), p_ij = exp(s_ij - lse_i), y_i = sum_j p_ij v_j
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/vector_clones.h"
#include "exec/kernel_geometry.h"

namespace pt::cpu {
namespace {

constexpr int64_t kQueryTile = 32;  // query rows per block
constexpr int64_t kForwardRows = 4 * kQueryTile;  // query rows per work item of the forward (each
                                                  // key tile loaded once for its blocks)
constexpr int64_t kKeyTile = 64;    // keys per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The register block of each ISA's copy of the products: R rows of sums by up to C Lanes (16 C
// columns) each, kept in registers over the inner dimension beside a row of the other operand.
// AVX-512 (32 zmm): 4 rows x 64 columns in 16 registers. AVX2 (16 ymm): 4 x 16 in 8 (4 x 64 in
// 64-byte vectors spilled every sum: the score block 42 us against 0.95 on AVX-512). Baseline
// (16 xmm): 2 x 16 in 8. Each sum runs over the inner dimension in order whatever the block, so
// the block leaves every bit where it is.
template <class Isa>
struct BlockShape {
  static constexpr int kRows = std::is_same_v<Isa, IsaBaseline> ? 2 : 4;
  static constexpr int kCols = std::is_same_v<Isa, IsaAvx512> ? 4 : 1;
};

// The first w of 16 floats (1 <= w <= 16): the rest of v zero, and not written back.
template <class L>
[[gnu::always_inline]] inline void load_part(L& v, const float* p, int64_t w) {
  if (w == kLanes) return load16(v, p);
  float t[kLanes] = {};
  std::memcpy(t, p, static_cast<size_t>(w) * sizeof(float));
  load16(v, t);
}
template <class L>
[[gnu::always_inline]] inline void store_part(float* p, const L& v, int64_t w) {
  if (w == kLanes) return store16(p, v);
  float t[kLanes];
  store16(t, v);
  std::memcpy(p, t, static_cast<size_t>(w) * sizeof(float));
}

inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// exp(x), 0 below the smallest normal float's log and at -inf.
inline float exp_or_zero(float x) { return x < -87.33f ? 0.f : exp_poly(x); }

// The attention's geometry, its attributes and its mask's strides (kernel_geometry.h), and the
// copy of the vector loops this kernel runs.
struct Geometry : AttentionGeometry {
  VectorIsa isa = VectorIsa::kBaseline;

  int64_t group() const { return heads / kv_heads; }
  // Keys row i sees at most: [0, key_end(i)).
  int64_t key_end(int64_t i) const { return causal ? std::min(keys, i + 1) : keys; }
  int64_t query_tiles() const { return (queries + kQueryTile - 1) / kQueryTile; }
  int64_t forward_items_per_head() const { return (queries + kForwardRows - 1) / kForwardRows; }
  int64_t key_tiles() const { return (keys + kKeyTile - 1) / kKeyTile; }
  // Row strides of the padded copies (whole Lanes, so that a row's loads stay inside it).
  int64_t dp() const { return padded(dim); }
  int64_t dvp() const { return padded(vdim); }
};

// One thread's scratch, carved from `floats(g)` floats in this order.
struct Scratch {
  float *kt, *vt;  // the key tile's K and V transposed: dim x kKeyTile, vdim x kKeyTile (keys past the tile 0)
  float *kp, *vp;  // its K and V rows padded: kKeyTile x dp, kKeyTile x dvp
  float *s, *ds;   // a query block's scores (then probabilities) and their gradient: kQueryTile x kKeyTile
  float *qp, *dyp; // the block's Q and dY rows padded: kQueryTile x dp, kQueryTile x dvp
  float *dk, *dv;  // the key tile's dK and dV sums: kKeyTile x dp, kKeyTile x dvp
  float *m, *l;    // the running max and sum of each row of a forward work item
  float* msum;     // dY summed over the fully masked rows: vdim

  static int64_t floats(const Geometry& g) {
    return (g.dim + g.vdim) * kKeyTile + 2 * kKeyTile * (g.dp() + g.dvp()) + 2 * kQueryTile * kKeyTile +
           kQueryTile * (g.dp() + g.dvp()) + 2 * kForwardRows + g.vdim;
  }
  Scratch(const Geometry& g, float* at) {
    auto take = [&at](int64_t n) {
      float* p = at;
      at += n;
      return p;
    };
    kt = take(g.dim * kKeyTile);
    vt = take(g.vdim * kKeyTile);
    kp = take(kKeyTile * g.dp());
    vp = take(kKeyTile * g.dvp());
    s = take(kQueryTile * kKeyTile);
    ds = take(kQueryTile * kKeyTile);
    qp = take(kQueryTile * g.dp());
    dyp = take(kQueryTile * g.dvp());
    dk = take(kKeyTile * g.dp());
    dv = take(kKeyTile * g.dvp());
    m = take(kForwardRows);
    l = take(kForwardRows);
    msum = take(g.vdim);
  }
};

// A row's mask: where element (b, h, i, 0) of the broadcast mask is, and its step along j.
struct MaskRow {
  const void* base = nullptr;
  int64_t step = 0;
  Geometry::Mask kind = Geometry::Mask::kNone;
};

MaskRow mask_row(const Geometry& g, const void* mask, int64_t b, int64_t h, int64_t i) {
  if (g.mask == Geometry::Mask::kNone) return {};
  const int64_t off = b * g.mask_stride[0] + h * g.mask_stride[1] + i * g.mask_stride[2];
  if (g.mask == Geometry::Mask::kFloat) return {static_cast<const float*>(mask) + off, g.mask_stride[3], g.mask};
  return {static_cast<const bool*>(mask) + off, g.mask_stride[3], g.mask};
}

// dst[c][r] = src[r][c] for r in [0, rows), c in [0, cols): a tile of K or V, rows of stride
// `cols`, into kKeyTile-wide columns (the products then run along the keys); columns past `rows`
// are 0.
void transpose_tile(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t c = 0; c < cols; ++c) std::fill(dst + c * kKeyTile + rows, dst + (c + 1) * kKeyTile, 0.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * kKeyTile + r] = src[r * cols + c];
}

// dst[r][c] = src[r][c] for r in [0, rows), rows of `cols` floats into rows of `ld` (padded with 0).
void pad_rows(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(src + r * cols, src + (r + 1) * cols, dst + r * ld);
    std::fill(dst + r * ld + cols, dst + (r + 1) * ld, 0.f);
  }
}

// The three products of a (query block, key tile) pair, each an R-row block with its sums in
// registers (R x up to C Lanes) over the inner dimension, taken in order: a row's result does
// not depend on the block it is made in, so any split of rows or columns gives the same bits.
//
// out_r[0 : 16 C] = sum_d a_r[d] bt[d][0 : 16 C]  (a rows of stride lda, len terms; bt rows of
// kKeyTile, out rows of kKeyTile)
template <class L, int R, int C>
[[gnu::always_inline]] inline void dots_block(const float* a, int64_t lda, const float* bt, int64_t len, float* out) {
  L acc[R][C] = {};
  for (int64_t d = 0; d < len; ++d) {
    L b[C];
    for (int v = 0; v < C; ++v) load16(b[v], bt + d * kKeyTile + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const float ar = a[r * lda + d];
      for (int v = 0; v < C; ++v) acc[r][v] += ar * b[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < C; ++v) store16(out + r * kKeyTile + v * kLanes, acc[r][v]);
}

// acc_r[0 : width] += sum_j w_r[j] x_j[0 : width] over j in [0, n) (w rows of kKeyTile; x rows of
// stride ldx, padded to whole Lanes; acc rows of stride ldc, width <= 16 C, only width written).
template <class L, int R, int C>
[[gnu::always_inline]] inline void weighted_block(const float* w, int64_t n, const float* x, int64_t ldx, float* acc,
                                                  int64_t ldc, int64_t width) {
  L c[R][C];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < C; ++v)
      load_part(c[r][v], acc + r * ldc + v * kLanes, std::min<int64_t>(kLanes, width - v * kLanes));
  for (int64_t j = 0; j < n; ++j) {
    L xv[C];
    for (int v = 0; v < C; ++v) load16(xv[v], x + j * ldx + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const float wr = w[r * kKeyTile + j];
      for (int v = 0; v < C; ++v) c[r][v] += wr * xv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < C; ++v)
      store_part(acc + r * ldc + v * kLanes, c[r][v], std::min<int64_t>(kLanes, width - v * kLanes));
}

// acc_j[0 : 16 C] += sum_i w_i[j] x_i over i in [0, n), for the R columns j of w from its pointer
// (w rows of kKeyTile; x rows of stride ldx, padded; acc rows of stride ldc, padded scratch).
template <class L, int R, int C>
[[gnu::always_inline]] inline void transposed_block(const float* w, int64_t n, const float* x, int64_t ldx, float* acc,
                                                    int64_t ldc) {
  L c[R][C];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < C; ++v) load16(c[r][v], acc + r * ldc + v * kLanes);
  for (int64_t i = 0; i < n; ++i) {
    L xv[C];
    for (int v = 0; v < C; ++v) load16(xv[v], x + i * ldx + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const float wr = w[i * kKeyTile + r];
      for (int v = 0; v < C; ++v) c[r][v] += wr * xv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < C; ++v) store16(acc + r * ldc + v * kLanes, c[r][v]);
}

// The blocks' dispatch below is written out in templates, not lambdas: a lambda is a function of
// its own, compiled for the baseline target, where these helpers are inlined into each ISA's copy
// of their caller.
//
// Rows [0, R) of out = a @ bt over all kKeyTile columns, 16 C at a time.
template <class Isa, int R>
[[gnu::always_inline]] inline void dots_rows(const float* a, int64_t lda, const float* bt, int64_t len, float* out) {
  constexpr int C = BlockShape<Isa>::kCols;
  for (int64_t c0 = 0; c0 < kKeyTile; c0 += C * kLanes)
    dots_block<typename Isa::Lanes, R, C>(a, lda, bt + c0, len, out + c0);
}

// weighted_block over the `lanes` Lanes (1 <= lanes <= C) its width needs.
template <class L, int R, int C>
[[gnu::always_inline]] inline void weighted_lanes(int64_t lanes, const float* w, int64_t n, const float* x,
                                                  int64_t ldx, float* acc, int64_t ldc, int64_t width) {
  if constexpr (C > 1)
    if (lanes < C) return weighted_lanes<L, R, C - 1>(lanes, w, n, x, ldx, acc, ldc, width);
  weighted_block<L, R, C>(w, n, x, ldx, acc, ldc, width);
}
template <class L, int R, int C>
[[gnu::always_inline]] inline void transposed_lanes(int64_t lanes, const float* w, int64_t n, const float* x,
                                                    int64_t ldx, float* acc, int64_t ldc) {
  if constexpr (C > 1)
    if (lanes < C) return transposed_lanes<L, R, C - 1>(lanes, w, n, x, ldx, acc, ldc);
  transposed_block<L, R, C>(w, n, x, ldx, acc, ldc);
}

// acc rows [0, R) += w @ x over columns [0, width), in chunks of up to 16 C columns.
template <class Isa, int R>
[[gnu::always_inline]] inline void weighted_rows(const float* w, int64_t n, const float* x, int64_t ldx, float* acc,
                                                 int64_t ldc, int64_t width) {
  constexpr int C = BlockShape<Isa>::kCols;
  for (int64_t c0 = 0; c0 < width; c0 += C * kLanes) {
    const int64_t cw = std::min<int64_t>(C * kLanes, width - c0);
    weighted_lanes<typename Isa::Lanes, R, C>((cw + kLanes - 1) / kLanes, w, n, x + c0, ldx, acc + c0, ldc, cw);
  }
}

// acc rows [0, R) (the columns of w from its pointer) += w^T @ x over columns [0, width) (whole
// Lanes), in chunks of up to 16 C columns.
template <class Isa, int R>
[[gnu::always_inline]] inline void transposed_rows(const float* w, int64_t n, const float* x, int64_t ldx, float* acc,
                                                   int64_t ldc, int64_t width) {
  constexpr int C = BlockShape<Isa>::kCols;
  for (int64_t c0 = 0; c0 < width; c0 += C * kLanes)
    transposed_lanes<typename Isa::Lanes, R, C>(std::min<int64_t>(C * kLanes, width - c0) / kLanes, w, n, x + c0,
                                                ldx, acc + c0, ldc);
}

// The last `left` rows (0 <= left <= R) as one block of `left` rows.
template <class Isa, int R>
[[gnu::always_inline]] inline void dots_rest(int64_t left, const float* a, int64_t lda, const float* bt, int64_t len,
                                             float* out) {
  if constexpr (R > 0) {
    if (left == R) return dots_rows<Isa, R>(a, lda, bt, len, out);
    dots_rest<Isa, R - 1>(left, a, lda, bt, len, out);
  }
}
template <class Isa, int R>
[[gnu::always_inline]] inline void weighted_rest(int64_t left, const float* w, int64_t n, const float* x, int64_t ldx,
                                                 float* acc, int64_t ldc, int64_t width) {
  if constexpr (R > 0) {
    if (left == R) return weighted_rows<Isa, R>(w, n, x, ldx, acc, ldc, width);
    weighted_rest<Isa, R - 1>(left, w, n, x, ldx, acc, ldc, width);
  }
}
template <class Isa, int R>
[[gnu::always_inline]] inline void transposed_rest(int64_t left, const float* w, int64_t n, const float* x,
                                                   int64_t ldx, float* acc, int64_t ldc, int64_t width) {
  if constexpr (R > 0) {
    if (left == R) return transposed_rows<Isa, R>(w, n, x, ldx, acc, ldc, width);
    transposed_rest<Isa, R - 1>(left, w, n, x, ldx, acc, ldc, width);
  }
}

// out (rows x kKeyTile) = a (rows x len, stride lda) @ bt (len x kKeyTile), on isa's copy.
void rows_times_tile(VectorIsa isa, const float* a, int64_t lda, int64_t rows, const float* bt, int64_t len,
                     float* out) {
  on_vector_isa(isa, [&](auto on) __attribute__((always_inline)) {
    using Isa = decltype(on);
    constexpr int R = BlockShape<Isa>::kRows;
    int64_t r = 0;
    for (; r + R <= rows; r += R) dots_rows<Isa, R>(a + r * lda, lda, bt, len, out + r * kKeyTile);
    dots_rest<Isa, R - 1>(rows - r, a + r * lda, lda, bt, len, out + r * kKeyTile);
  });
}

// acc (rows x width, stride ldc) += w (rows x n, rows of kKeyTile) @ x (n x width, stride ldx,
// padded), on isa's copy.
void add_weighted_rows(VectorIsa isa, const float* w, int64_t rows, int64_t n, const float* x, int64_t ldx,
                       float* acc, int64_t ldc, int64_t width) {
  on_vector_isa(isa, [&](auto on) __attribute__((always_inline)) {
    using Isa = decltype(on);
    constexpr int R = BlockShape<Isa>::kRows;
    int64_t r = 0;
    for (; r + R <= rows; r += R) weighted_rows<Isa, R>(w + r * kKeyTile, n, x, ldx, acc + r * ldc, ldc, width);
    weighted_rest<Isa, R - 1>(rows - r, w + r * kKeyTile, n, x, ldx, acc + r * ldc, ldc, width);
  });
}

// acc (cols x width, stride ldc, padded) += w^T @ x: w (n x cols, rows of kKeyTile), x (n x width,
// stride ldx, padded); width a whole number of Lanes; on isa's copy.
void add_transposed_weighted(VectorIsa isa, const float* w, int64_t n, int64_t cols, const float* x, int64_t ldx,
                             float* acc, int64_t ldc, int64_t width) {
  on_vector_isa(isa, [&](auto on) __attribute__((always_inline)) {
    using Isa = decltype(on);
    constexpr int R = BlockShape<Isa>::kRows;
    int64_t j = 0;
    for (; j + R <= cols; j += R) transposed_rows<Isa, R>(w + j, n, x, ldx, acc + j * ldc, ldc, width);
    transposed_rest<Isa, R - 1>(cols - j, w + j, n, x, ldx, acc + j * ldc, ldc, width);
  });
}

// Rows [i0, i0 + nq) of one (b, h)'s scores against the key tile at j0 (`tile` keys), their dot
// products already in s: s_ij = scale * q_i . k_j + mask_ij up to the row's last key, -inf past
// it and where a bool mask is false.
PT_VECTOR_CLONES void finish_scores(const Geometry& g, const void* mask, int64_t b, int64_t h, int64_t i0, int64_t nq,
                                    int64_t j0, int64_t tile, float* s) {
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t i = i0 + r, n = std::max<int64_t>(0, std::min(tile, g.key_end(i) - j0));
    float* row = s + r * kKeyTile;
    const MaskRow m = mask_row(g, mask, b, h, i);
    if (m.kind == Geometry::Mask::kFloat) {
      const float* mk = static_cast<const float*>(m.base) + j0 * m.step;
      for (int64_t j = 0; j < n; ++j) row[j] = row[j] * g.scale + mk[j * m.step];
    } else if (m.kind == Geometry::Mask::kBool) {
      const bool* mk = static_cast<const bool*>(m.base) + j0 * m.step;
      for (int64_t j = 0; j < n; ++j) row[j] = mk[j * m.step] ? row[j] * g.scale : kNegInf;
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) row[j] *= g.scale;
    }
    for (int64_t j = n; j < kKeyTile; ++j) row[j] = kNegInf;
  }
}

// Pointers into one (b, h) slice.
struct Heads {
  const float *q, *k, *v;
};
Heads heads_at(const Geometry& g, const float* q, const float* k, const float* v, int64_t b, int64_t h) {
  const int64_t kvh = b * g.kv_heads + h / g.group();
  return {q + (b * g.heads + h) * g.queries * g.dim, k + kvh * g.keys * g.dim, v + kvh * g.keys * g.vdim};
}

// sum_j row[j] over a tile of kKeyTile: 16 lanes (lane k: row[k] + row[k + 16] + ...) added in
// lane order, the same on every ISA's copy (the order of an OpenMP simd reduction in 64-byte
// registers, so the AVX-512 bits are those of such a reduction).
template <class L>
[[gnu::always_inline]] inline float tile_sum(const float* row) {
  L lanes = {}, v;
  for (int64_t j = 0; j < kKeyTile; j += kLanes) {
    load16(v, row + j);
    lanes += v;
  }
  float t[kLanes];
  store16(t, lanes);
  float sum = 0.f;
  for (float x : t) sum += x;
  return sum;
}

// The online softmax's step for rows [0, nq) of a block over one key tile: s holds the scores and
// becomes exp(s - m_new); y's rows (stride vdim) are rescaled to the new max, m and l updated.
void online_softmax(const Geometry& g, int64_t nq, float* s, float* m, float* l, float* y) {
  on_vector_isa(g.isa, [&](auto on) __attribute__((always_inline)) {
    for (int64_t r = 0; r < nq; ++r) {
      float* row = s + r * kKeyTile;
      // lane_math's max, which starts from -inf: an OpenMP max reduction starts its lanes from the
      // float's lowest finite value under clang, so a masked row came out -FLT_MAX, not -inf.
      const float tile_max = row_max<typename decltype(on)::Lanes>(row, kKeyTile);
      const float m_new = std::max(m[r], tile_max);
      if (m_new == kNegInf) {  // every key so far masked: nothing added
        std::fill(row, row + kKeyTile, 0.f);
        continue;
      }
      const float rescale = exp_or_zero(m[r] - m_new);
      float* acc = y + r * g.vdim;
#pragma omp simd
      for (int64_t c = 0; c < g.vdim; ++c) acc[c] *= rescale;
#pragma omp simd
      for (int64_t j = 0; j < kKeyTile; ++j) row[j] = exp_or_zero(row[j] - m_new);
      l[r] = l[r] * rescale + tile_sum<typename decltype(on)::Lanes>(row);
      m[r] = m_new;
    }
  });
}

// One work item of the forward: query rows [i0, i1) of head h in batch b (up to kForwardRows),
// in blocks of kQueryTile, each key tile loaded once for them. Y's rows hold the running output;
// m and l the running max and sum per row. A row whose every key is masked (-inf) gets the mean
// of V over all T keys and lse -inf: what the unfused Softmax gives it (its exp(-inf - -inf)
// clamps to one value for every key).
void forward_rows(const Geometry& g, const float* q, const float* k, const float* v, const void* mask, float* y,
                  float* lse, int64_t b, int64_t h, int64_t i0, int64_t i1, const Scratch& w) {
  const Heads hd = heads_at(g, q, k, v, b, h);
  const int64_t nq = i1 - i0;
  float* yb = y + ((b * g.heads + h) * g.queries + i0) * g.vdim;
  std::fill(w.m, w.m + nq, kNegInf);
  std::fill(w.l, w.l + nq, 0.f);
  std::fill(yb, yb + nq * g.vdim, 0.f);
  const int64_t tiles_end = g.causal ? std::min(g.keys, i1) : g.keys;
  for (int64_t j0 = 0; j0 < tiles_end; j0 += kKeyTile) {
    const int64_t tile = std::min(kKeyTile, g.keys - j0);
    transpose_tile(hd.k + j0 * g.dim, tile, g.dim, w.kt);
    pad_rows(hd.v + j0 * g.vdim, tile, g.vdim, g.dvp(), w.vp);
    for (int64_t r0 = 0; r0 < nq; r0 += kQueryTile) {
      const int64_t rows = std::min(kQueryTile, nq - r0);
      if (g.causal && j0 >= i0 + r0 + rows) continue;  // this block sees no key of the tile
      rows_times_tile(g.isa, hd.q + (i0 + r0) * g.dim, g.dim, rows, w.kt, g.dim, w.s);
      finish_scores(g, mask, b, h, i0 + r0, rows, j0, tile, w.s);
      online_softmax(g, rows, w.s, w.m + r0, w.l + r0, yb + r0 * g.vdim);
      add_weighted_rows(g.isa, w.s, rows, tile, w.vp, g.dvp(), yb + r0 * g.vdim, g.vdim, g.vdim);
    }
  }
  for (int64_t r = 0; r < nq; ++r) {
    float* out = yb + r * g.vdim;
    float row_lse = kNegInf;
    if (w.m[r] == kNegInf) {  // fully masked: the mean of V over all keys
      for (int64_t j = 0; j < g.keys; ++j)
        for (int64_t c = 0; c < g.vdim; ++c) out[c] += hd.v[j * g.vdim + c];
      const float inv = 1.f / static_cast<float>(g.keys);
      for (int64_t c = 0; c < g.vdim; ++c) out[c] *= inv;
    } else {
      const float inv = 1.f / w.l[r];
#pragma omp simd
      for (int64_t c = 0; c < g.vdim; ++c) out[c] *= inv;
      row_lse = w.m[r] + std::log(w.l[r]);
    }
    if (lse) lse[(b * g.heads + h) * g.queries + i0 + r] = row_lse;
  }
}

// The backward's row sums delta_i = dy_i . y_i, per (b, h, i), summed in double: delta is what
// makes sum_j ds_ij vanish (the gradient of a shift shared by every key, a key bias's, is zero),
// so its own rounding is kept out of that noise.
PT_VECTOR_CLONES void row_deltas(const float* dy, const float* y, int64_t r0, int64_t r1, int64_t vdim, float* delta) {
  for (int64_t r = r0; r < r1; ++r) {
    double sum = 0.0;
    for (int64_t c = 0; c < vdim; ++c) sum += double(dy[r * vdim + c]) * double(y[r * vdim + c]);
    delta[r] = static_cast<float>(sum);
  }
}

// What the backward reads.
struct GradInputs {
  const float *dy, *q, *k, *v, *lse, *delta;
  const void* mask;
};

// Rows [i0, i0 + nq) of head h in batch b against the key tile at j0 (its K and V transposed in
// w.kt, w.vt): w.s = p_ij = exp(s_ij - lse_i), w.ds = p_ij (dy_i . v_j - delta_i); both 0 on a
// fully masked row (lse -inf: no gradient reaches its scores) and past the row's last key.
PT_VECTOR_CLONES void block_gradients(const Geometry& g, const GradInputs& in, int64_t b, int64_t h, int64_t i0,
                                      int64_t nq, int64_t j0, int64_t tile, const Scratch& w) {
  const int64_t row0 = (b * g.heads + h) * g.queries + i0;
  rows_times_tile(g.isa, in.q + row0 * g.dim, g.dim, nq, w.kt, g.dim, w.s);
  finish_scores(g, in.mask, b, h, i0, nq, j0, tile, w.s);
  rows_times_tile(g.isa, in.dy + row0 * g.vdim, g.vdim, nq, w.vt, g.vdim, w.ds);
  for (int64_t r = 0; r < nq; ++r) {
    float *p = w.s + r * kKeyTile, *ds = w.ds + r * kKeyTile;
    const float lse = in.lse[row0 + r], delta = in.delta[row0 + r];
    if (lse == kNegInf) {
      std::fill(p, p + kKeyTile, 0.f);
      std::fill(ds, ds + kKeyTile, 0.f);
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < kKeyTile; ++j) {
      p[j] = exp_or_zero(p[j] - lse);
      ds[j] = p[j] * (ds[j] - delta);
    }
  }
}

// The key tile at j0 of kv head kvh (keys [j0, j0 + tile)) made ready: K and V transposed and,
// for dQ, K's rows padded.
void load_key_tile(const Geometry& g, const GradInputs& in, int64_t b, int64_t kvh, int64_t j0, int64_t tile,
                   bool for_dq, const Scratch& w) {
  const int64_t kv_row0 = (b * g.kv_heads + kvh) * g.keys + j0;
  transpose_tile(in.k + kv_row0 * g.dim, tile, g.dim, w.kt);
  transpose_tile(in.v + kv_row0 * g.vdim, tile, g.vdim, w.vt);
  if (for_dq) pad_rows(in.k + kv_row0 * g.dim, tile, g.dim, g.dp(), w.kp);
}

// The key tile at j0 of kv head kvh in batch b, over every query row of the heads reading it
// in order (blocks of kQueryTile from row 0, causal ones from the block holding row j0): with
// dq, adds the tile's share of dQ (dq_i += sum_j ds_ij k_j, unscaled); with dk and dv, makes the
// tile's dK and dV: dv_j = sum_i p_ij dy_i, dk_j = scale * sum_i ds_ij q_i. A fully masked row adds
// dy_i / T to every key's dv (its probabilities are uniform) and nothing to dk.
void key_tile_pass(const Geometry& g, const GradInputs& in, float* dq, float* dk, float* dv, int64_t b, int64_t kvh,
                   int64_t j0, const Scratch& w) {
  const int64_t tile = std::min(kKeyTile, g.keys - j0);
  load_key_tile(g, in, b, kvh, j0, tile, dq != nullptr, w);
  if (dk) {
    std::fill(w.dk, w.dk + kKeyTile * g.dp(), 0.f);
    std::fill(w.dv, w.dv + kKeyTile * g.dvp(), 0.f);
    std::fill(w.msum, w.msum + g.vdim, 0.f);
  }
  bool any_masked = false;
  for (int64_t h = kvh * g.group(); h < (kvh + 1) * g.group(); ++h) {
    const int64_t row0 = (b * g.heads + h) * g.queries;
    for (int64_t i0 = g.causal ? j0 / kQueryTile * kQueryTile : 0; i0 < g.queries; i0 += kQueryTile) {
      const int64_t nq = std::min(kQueryTile, g.queries - i0);
      block_gradients(g, in, b, h, i0, nq, j0, tile, w);
      if (dq) add_weighted_rows(g.isa, w.ds, nq, tile, w.kp, g.dp(), dq + (row0 + i0) * g.dim, g.dim, g.dim);
      if (!dk) continue;
      pad_rows(in.dy + (row0 + i0) * g.vdim, nq, g.vdim, g.dvp(), w.dyp);
      pad_rows(in.q + (row0 + i0) * g.dim, nq, g.dim, g.dp(), w.qp);
      add_transposed_weighted(g.isa, w.s, nq, tile, w.dyp, g.dvp(), w.dv, g.dvp(), g.dvp());
      add_transposed_weighted(g.isa, w.ds, nq, tile, w.qp, g.dp(), w.dk, g.dp(), g.dp());
    }
    if (!dk) continue;
    for (int64_t i = 0; i < g.queries; ++i) {
      if (in.lse[row0 + i] != kNegInf) continue;
      any_masked = true;
      const float* dyi = in.dy + (row0 + i) * g.vdim;
      for (int64_t c = 0; c < g.vdim; ++c) w.msum[c] += dyi[c];
    }
  }
  if (!dk) return;
  const int64_t kv_row0 = (b * g.kv_heads + kvh) * g.keys + j0;
  const float inv = 1.f / static_cast<float>(g.keys);
  for (int64_t j = 0; j < tile; ++j) {
    for (int64_t c = 0; c < g.dim; ++c) dk[(kv_row0 + j) * g.dim + c] = w.dk[j * g.dp() + c] * g.scale;
    for (int64_t c = 0; c < g.vdim; ++c)
      dv[(kv_row0 + j) * g.vdim + c] = any_masked ? w.dv[j * g.dvp() + c] + w.msum[c] * inv : w.dv[j * g.dvp() + c];
  }
}

// dQ of query rows [i0, i1) of head h in batch b: dq_i = scale * sum_j ds_ij k_j over the key
// tiles in order (the same blocks, tiles and order as key_tile_pass, so the same bits).
void query_tile_pass(const Geometry& g, const GradInputs& in, float* dq, int64_t b, int64_t h, int64_t i0, int64_t i1,
                     const Scratch& w) {
  const int64_t row0 = (b * g.heads + h) * g.queries + i0, nq = i1 - i0;
  float* dqb = dq + row0 * g.dim;
  std::fill(dqb, dqb + nq * g.dim, 0.f);
  const int64_t tiles_end = g.causal ? std::min(g.keys, i1) : g.keys;
  for (int64_t j0 = 0; j0 < tiles_end; j0 += kKeyTile) {
    const int64_t tile = std::min(kKeyTile, g.keys - j0);
    load_key_tile(g, in, b, h / g.group(), j0, tile, true, w);
    block_gradients(g, in, b, h, i0, nq, j0, tile, w);
    add_weighted_rows(g.isa, w.ds, nq, tile, w.kp, g.dp(), dqb, g.dim, g.dim);
  }
  for (int64_t x = 0; x < nq * g.dim; ++x) dqb[x] *= g.scale;
}

// The whole backward of kv head kvh in batch b on one thread: its key tiles in order, each
// adding its share of dQ to the query rows of the heads reading it, then dQ scaled.
void kv_head_pass(const Geometry& g, const GradInputs& in, float* dq, float* dk, float* dv, int64_t b, int64_t kvh,
                  const Scratch& w) {
  const int64_t rows = g.group() * g.queries;
  float* dqb = dq ? dq + (b * g.heads + kvh * g.group()) * g.queries * g.dim : nullptr;
  if (dqb) std::fill(dqb, dqb + rows * g.dim, 0.f);
  for (int64_t j0 = 0; j0 < g.keys; j0 += kKeyTile) key_tile_pass(g, in, dq, dk, dv, b, kvh, j0, w);
  if (dqb)
    for (int64_t x = 0; x < rows * g.dim; ++x) dqb[x] *= g.scale;
}

// fn(thread, item) over [0, items) on `threads` threads; an item's result does not depend on
// which thread runs it.
template <class Fn>
void for_items(int64_t items, int threads, Fn fn) {
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (items > 1)
  for (int64_t w = 0; w < items; ++w) fn(omp_get_thread_num(), w);
}

// FusedAttention(Q, K, V, Mask?) -> (Y, LogSumExp?)
class FusedAttention final : public Kernel {
 public:
  FusedAttention(Geometry g, int threads) : g_(g), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const void* mask = in.size() > 3 && in[3].present() ? in[3].data : nullptr;
    float* lse = out.size() > 1 && out[1].present() ? out[1].as<float>() : nullptr;
    const int64_t tiles = g_.forward_items_per_head();
    for_items(g_.batch * g_.heads * tiles, threads_, [&](int t, int64_t w) {
      const int64_t i0 = (w % tiles) * kForwardRows, bh = w / tiles;
      forward_rows(g_, in[0].as<const float>(), in[1].as<const float>(), in[2].as<const float>(), mask,
                   out[0].as<float>(), lse, bh / g_.heads, bh % g_.heads, i0, std::min(g_.queries, i0 + kForwardRows),
                   Scratch(g_, static_cast<float*>(scratch) + t * Scratch::floats(g_)));
    });
  }
  size_t scratch_bytes() const override { return static_cast<size_t>(threads_ * Scratch::floats(g_)) * sizeof(float); }

 private:
  Geometry g_;
  int threads_;
};

// FusedAttentionGrad(dY, Q, K, V, Y, LogSumExp, Mask?) -> (dQ, dK, dV). With at least two kv
// heads (over the batch) per thread, each runs whole kv heads, every (query block, key tile) pair
// visited once for dQ, dK and dV together; with fewer, dQ is made per query tile and dK, dV per
// key tile (each pair visited twice, more items to share). Both take every sum in one order, so
// the bits are the same either way and on any thread count.
class FusedAttentionGrad final : public Kernel {
 public:
  FusedAttentionGrad(Geometry g, int threads) : g_(g), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float *dy = in[0].as<const float>(), *y = in[4].as<const float>();
    auto* delta = static_cast<float*>(scratch);
    const GradInputs gi{dy,           in[1].as<const float>(), in[2].as<const float>(), in[3].as<const float>(),
                        in[5].as<const float>(), delta, in.size() > 6 && in[6].present() ? in[6].data : nullptr};
    float* per_thread = delta + rows();
    const int64_t rows_total = rows();
    for_items((rows_total + 255) / 256, threads_, [&](int, int64_t w) {
      row_deltas(dy, y, w * 256, std::min(rows_total, (w + 1) * 256), g_.vdim, delta);
    });
    float* dq = out[0].present() ? out[0].as<float>() : nullptr;
    // dK and dV come both or neither (the factory's check).
    float *dk = out[1].present() ? out[1].as<float>() : nullptr, *dv = dk ? out[2].as<float>() : nullptr;
    auto at = [&](int t) { return Scratch(g_, per_thread + t * Scratch::floats(g_)); };
    const int64_t kv_items = g_.batch * g_.kv_heads;
    if (threads_ == 1 || kv_items >= 2 * threads_) {
      for_items(kv_items, threads_, [&](int t, int64_t w) {
        kv_head_pass(g_, gi, dq, dk, dv, w / g_.kv_heads, w % g_.kv_heads, at(t));
      });
      return;
    }
    const int64_t qtiles = g_.query_tiles();
    if (dq)
      for_items(g_.batch * g_.heads * qtiles, threads_, [&](int t, int64_t w) {
        const int64_t i0 = (w % qtiles) * kQueryTile, bh = w / qtiles;
        query_tile_pass(g_, gi, dq, bh / g_.heads, bh % g_.heads, i0, std::min(g_.queries, i0 + kQueryTile), at(t));
      });
    if (!dk) return;
    const int64_t ktiles = g_.key_tiles();
    for_items(kv_items * ktiles, threads_, [&](int t, int64_t w) {
      const int64_t bkv = w / ktiles;
      key_tile_pass(g_, gi, nullptr, dk, dv, bkv / g_.kv_heads, bkv % g_.kv_heads, (w % ktiles) * kKeyTile, at(t));
    });
  }
  size_t scratch_bytes() const override {
    return static_cast<size_t>(rows() + threads_ * Scratch::floats(g_)) * sizeof(float);
  }

 private:
  int64_t rows() const { return g_.batch * g_.heads * g_.queries; }

  Geometry g_;
  int threads_;
};

}  // namespace

// FusedAttention(Q, K, V, Mask?) -> (Y, LogSumExp?), scale, causal.
std::unique_ptr<Kernel> make_fused_attention(const KernelSpec& s) {
  const std::optional<AttentionGeometry> g = fused_attention_geometry(s);
  if (!g) return nullptr;
  return std::make_unique<FusedAttention>(Geometry{*g, vector_isa()}, s.cpu->threads);
}

// FusedAttentionGrad(dY, Q, K, V, Y, LogSumExp, Mask?) -> (dQ?, dK, dV), scale, causal.
std::unique_ptr<Kernel> make_fused_attention_grad(const KernelSpec& s) {
  const std::optional<AttentionGeometry> g = fused_attention_grad_geometry(s);
  if (!g) return nullptr;
  return std::make_unique<FusedAttentionGrad>(Geometry{*g, vector_isa()}, s.cpu->threads);
}

}  // namespace pt::cpu
