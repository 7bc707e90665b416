// exec/cpu/attention.cc: FusedAttention and FusedAttentionGrad (core/pipetrain_ops.h has their
// math) as tiled loops that never hold the S x T scores: the forward keeps each query row's
// running max, sum and output while it walks the keys a tile at a time (online softmax) and
// writes Y and the row's log-sum-exp; the backward recomputes each tile's probabilities from the
// log-sum-exp (FlashAttention-2's algorithm). Work is split over (batch, head, query tile) for Y
// and dQ, and over (batch, kv head, key tile) for dK and dV, which walk every query row of their
// heads in one fixed order: no sum is split between threads, so the bits do not depend on the
// thread count. Causal programs skip the key tiles wholly above the diagonal.
//
//   Q [B, H, S, D], K [B, Hkv, T, D], V [B, Hkv, T, Dv], H = G * Hkv (head h reads kv head h / G)
//   s_ij = scale * q_i . k_j + mask_ij (mask_ij = -inf where causal and j > i, or where a bool
//          mask is false), p_ij = exp(s_ij - lse_i), y_i = sum_j p_ij v_j
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/vector_clones.h"

namespace pt::cpu {
namespace {

constexpr int64_t kQueryTile = 32;  // query rows per work item
constexpr int64_t kKeyTile = 64;    // keys per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x), 0 below the smallest normal float's log and at -inf.
inline float exp_or_zero(float x) { return x < -87.33f ? 0.f : exp_poly(x); }

// The attention's geometry, its attributes and its mask's strides (0 where the mask broadcasts).
struct Geometry {
  int64_t batch = 0, heads = 0, kv_heads = 0, queries = 0, keys = 0, dim = 0, vdim = 0;
  float scale = 1.f;
  bool causal = false;
  enum class Mask { kNone, kFloat, kBool } mask = Mask::kNone;
  int64_t mask_stride[4] = {0, 0, 0, 0};  // along b, h, i, j

  int64_t group() const { return heads / kv_heads; }
  // Keys row i sees at most: [0, key_end(i)).
  int64_t key_end(int64_t i) const { return causal ? std::min(keys, i + 1) : keys; }
  int64_t query_tiles() const { return (queries + kQueryTile - 1) / kQueryTile; }
  int64_t key_tiles() const { return (keys + kKeyTile - 1) / kKeyTile; }
  // Floats of one thread's scratch: K and V tiles transposed, two rows of a tile, the running
  // max and sum of a query tile, and a row of V's width.
  int64_t thread_floats() const { return (dim + vdim) * kKeyTile + 2 * kKeyTile + 2 * kQueryTile + vdim; }
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
// `cols`, into kKeyTile-wide columns (the vector loops then run along the keys).
void transpose_tile(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * kKeyTile + r] = src[r * cols + c];
}

// out[j] = a . bt[:, j] for j in [0, n) (bt a tile transposed, `len` rows of kKeyTile).
PT_VECTOR_CLONES void tile_dots(const float* a, const float* bt, int64_t len, int64_t n, float* out) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = 0.f;
  for (int64_t d = 0; d < len; ++d) {
    const float ad = a[d];
    const float* row = bt + d * kKeyTile;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) out[j] += ad * row[j];
  }
}

// s[j] = scale * q . k_{j0 + j} + mask for j in [0, n), kt the key tile transposed; -inf where
// a bool mask is false.
PT_VECTOR_CLONES void tile_scores(const float* q, const float* kt, int64_t dim, int64_t n, float scale,
                                  const MaskRow& m, int64_t j0, float* s) {
  tile_dots(q, kt, dim, n, s);
  if (m.kind == Geometry::Mask::kFloat) {
    const float* mk = static_cast<const float*>(m.base) + j0 * m.step;
    for (int64_t j = 0; j < n; ++j) s[j] = s[j] * scale + mk[j * m.step];
  } else if (m.kind == Geometry::Mask::kBool) {
    const bool* mk = static_cast<const bool*>(m.base) + j0 * m.step;
    for (int64_t j = 0; j < n; ++j) s[j] = mk[j * m.step] ? s[j] * scale : kNegInf;
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] *= scale;
  }
}

// y[:] += a * x[:] over len floats.
inline void axpy(float a, const float* x, int64_t len, float* y) {
#pragma omp simd
  for (int64_t c = 0; c < len; ++c) y[c] += a * x[c];
}

// acc[:] += sum_j w[j] * rows[j][:] over j in [0, n), rows of `len` floats, in j order.
PT_VECTOR_CLONES void add_weighted_rows(const float* w, const float* rows, int64_t n, int64_t len, float* acc) {
  for (int64_t j = 0; j < n; ++j) axpy(w[j], rows + j * len, len, acc);
}

// rows[j][:] += w[j] * x[:] for j in [0, n): one query row's share of a key tile's dK or dV.
PT_VECTOR_CLONES void add_outer(const float* w, const float* x, int64_t n, int64_t len, float* rows) {
  for (int64_t j = 0; j < n; ++j) axpy(w[j], x, len, rows + j * len);
}

// Pointers into one (b, h) slice.
struct Heads {
  const float *q, *k, *v;
};
Heads heads_at(const Geometry& g, const float* q, const float* k, const float* v, int64_t b, int64_t h) {
  const int64_t kvh = b * g.kv_heads + h / g.group();
  return {q + (b * g.heads + h) * g.queries * g.dim, k + kvh * g.keys * g.dim, v + kvh * g.keys * g.vdim};
}

// One work item of the forward: query rows [i0, i1) of head h in batch b. Y's rows hold the
// running output; m and l the running max and sum per row. A row whose every key is masked (-inf)
// gets the mean of V over all T keys and lse -inf: what the unfused Softmax gives it (its
// exp(-inf - -inf) clamps to one value for every key).
PT_VECTOR_CLONES void forward_rows(const Geometry& g, const float* q, const float* k, const float* v,
                                   const void* mask, float* y, float* lse, int64_t b, int64_t h, int64_t i0,
                                   int64_t i1, float* scratch) {
  const Heads hd = heads_at(g, q, k, v, b, h);
  float* kt = scratch;
  float* s = kt + g.dim * kKeyTile;
  float* m = s + kKeyTile;
  float* l = m + kQueryTile;
  float* yb = y + (b * g.heads + h) * g.queries * g.vdim;
  for (int64_t i = i0; i < i1; ++i) {
    m[i - i0] = kNegInf;
    l[i - i0] = 0.f;
    std::fill(yb + i * g.vdim, yb + (i + 1) * g.vdim, 0.f);
  }
  const int64_t tiles_end = g.causal ? std::min(g.keys, i1) : g.keys;
  for (int64_t j0 = 0; j0 < tiles_end; j0 += kKeyTile) {
    const int64_t tile = std::min(kKeyTile, g.keys - j0);
    transpose_tile(hd.k + j0 * g.dim, tile, g.dim, kt);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = std::min(tile, g.key_end(i) - j0);
      if (n <= 0) continue;
      tile_scores(hd.q + i * g.dim, kt, g.dim, n, g.scale, mask_row(g, mask, b, h, i), j0, s);
      float tile_max = kNegInf;
      for (int64_t j = 0; j < n; ++j) tile_max = std::max(tile_max, s[j]);
      const float m_old = m[i - i0], m_new = std::max(m_old, tile_max);
      if (m_new == kNegInf) continue;  // every key so far masked
      const float rescale = exp_or_zero(m_old - m_new);
      float* acc = yb + i * g.vdim;
#pragma omp simd
      for (int64_t c = 0; c < g.vdim; ++c) acc[c] *= rescale;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) s[j] = exp_or_zero(s[j] - m_new);
      float sum = 0.f;
      for (int64_t j = 0; j < n; ++j) sum += s[j];
      l[i - i0] = l[i - i0] * rescale + sum;
      m[i - i0] = m_new;
      add_weighted_rows(s, hd.v + j0 * g.vdim, n, g.vdim, acc);
    }
  }
  for (int64_t i = i0; i < i1; ++i) {
    float* out = yb + i * g.vdim;
    float row_lse = kNegInf;
    if (m[i - i0] == kNegInf) {  // fully masked: the mean of V over all keys
      for (int64_t j = 0; j < g.keys; ++j)
        for (int64_t c = 0; c < g.vdim; ++c) out[c] += hd.v[j * g.vdim + c];
      const float inv = 1.f / static_cast<float>(g.keys);
      for (int64_t c = 0; c < g.vdim; ++c) out[c] *= inv;
    } else {
      const float inv = 1.f / l[i - i0];
#pragma omp simd
      for (int64_t c = 0; c < g.vdim; ++c) out[c] *= inv;
      row_lse = m[i - i0] + std::log(l[i - i0]);
    }
    if (lse) lse[(b * g.heads + h) * g.queries + i] = row_lse;
  }
}

// p[j] = exp(s[j] - lse), dp[j] = dy . v_j, ds[j] = p[j] * (dp[j] - delta) over a tile of n
// keys (s in place of p, dp in place of ds), for query row i; false when the row is fully masked
// (lse -inf: no gradient reaches its scores).
PT_VECTOR_CLONES bool tile_probabilities(const Geometry& g, const float* q, const float* dy, const float* kt,
                                         const float* vt, const MaskRow& mk, int64_t j0, int64_t n, float lse,
                                         float delta, float* p, float* ds) {
  if (lse == kNegInf) return false;
  tile_scores(q, kt, g.dim, n, g.scale, mk, j0, p);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) p[j] = exp_or_zero(p[j] - lse);
  tile_dots(dy, vt, g.vdim, n, ds);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - delta);
  return true;
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

// dQ for query rows [i0, i1) of head h in batch b: dq_i = scale * sum_j ds_ij k_j, over key
// tiles in order.
PT_VECTOR_CLONES void grad_query_rows(const Geometry& g, const float* dy, const float* q, const float* k,
                                      const float* v, const float* lse, const float* delta, const void* mask,
                                      float* dq, int64_t b, int64_t h, int64_t i0, int64_t i1, float* scratch) {
  const Heads hd = heads_at(g, q, k, v, b, h);
  float* kt = scratch;
  float* vt = kt + g.dim * kKeyTile;
  float* p = vt + g.vdim * kKeyTile;
  float* ds = p + kKeyTile;
  const int64_t row0 = (b * g.heads + h) * g.queries;
  float* dqb = dq + row0 * g.dim;
  std::fill(dqb + i0 * g.dim, dqb + i1 * g.dim, 0.f);
  const int64_t tiles_end = g.causal ? std::min(g.keys, i1) : g.keys;
  for (int64_t j0 = 0; j0 < tiles_end; j0 += kKeyTile) {
    const int64_t tile = std::min(kKeyTile, g.keys - j0);
    transpose_tile(hd.k + j0 * g.dim, tile, g.dim, kt);
    transpose_tile(hd.v + j0 * g.vdim, tile, g.vdim, vt);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = std::min(tile, g.key_end(i) - j0);
      if (n <= 0 || !tile_probabilities(g, hd.q + i * g.dim, dy + (row0 + i) * g.vdim, kt, vt,
                                        mask_row(g, mask, b, h, i), j0, n, lse[row0 + i], delta[row0 + i], p, ds))
        continue;
      add_weighted_rows(ds, hd.k + j0 * g.dim, n, g.dim, dqb + i * g.dim);
    }
  }
  for (int64_t x = i0 * g.dim; x < i1 * g.dim; ++x) dqb[x] *= g.scale;
}

// dK and dV for keys [j0, j0 + tile) of kv head kvh in batch b: over the heads that read it and
// their query rows, in order, dv_j += p_ij dy_i, dk_j += scale * ds_ij q_i. A fully masked row
// adds dy_i / T to every key's dv (its probabilities are uniform) and nothing to dk.
PT_VECTOR_CLONES void grad_key_tile(const Geometry& g, const float* dy, const float* q, const float* k,
                                    const float* v, const float* lse, const float* delta, const void* mask,
                                    float* dk, float* dv, int64_t b, int64_t kvh, int64_t j0, float* scratch) {
  const int64_t tile = std::min(kKeyTile, g.keys - j0);
  const int64_t kv_row0 = (b * g.kv_heads + kvh) * g.keys + j0;
  float* dkt = dk + kv_row0 * g.dim;
  float* dvt = dv + kv_row0 * g.vdim;
  std::fill(dkt, dkt + tile * g.dim, 0.f);
  std::fill(dvt, dvt + tile * g.vdim, 0.f);
  float* kt = scratch;
  float* vt = kt + g.dim * kKeyTile;
  float* p = vt + g.vdim * kKeyTile;
  float* ds = p + kKeyTile;
  float* msum = ds + kKeyTile;  // the sum of dy over the fully masked rows
  std::fill(msum, msum + g.vdim, 0.f);
  bool any_masked = false;
  transpose_tile(k + kv_row0 * g.dim, tile, g.dim, kt);
  transpose_tile(v + kv_row0 * g.vdim, tile, g.vdim, vt);
  for (int64_t h = kvh * g.group(); h < (kvh + 1) * g.group(); ++h) {
    const int64_t row0 = (b * g.heads + h) * g.queries;
    const float* qb = q + row0 * g.dim;
    for (int64_t i = g.causal ? j0 : 0; i < g.queries; ++i) {
      const float* dyi = dy + (row0 + i) * g.vdim;
      const int64_t n = std::min(tile, g.key_end(i) - j0);
      if (n <= 0) continue;
      if (!tile_probabilities(g, qb + i * g.dim, dyi, kt, vt, mask_row(g, mask, b, h, i), j0, n, lse[row0 + i],
                              delta[row0 + i], p, ds))
        continue;
      add_outer(p, dyi, n, g.vdim, dvt);
      add_outer(ds, qb + i * g.dim, n, g.dim, dkt);
    }
    for (int64_t i = 0; i < g.queries; ++i) {
      if (lse[row0 + i] != kNegInf) continue;
      any_masked = true;
      const float* dyi = dy + (row0 + i) * g.vdim;
      for (int64_t c = 0; c < g.vdim; ++c) msum[c] += dyi[c];
    }
  }
  for (int64_t x = 0; x < tile * g.dim; ++x) dkt[x] *= g.scale;
  if (!any_masked) return;
  const float inv = 1.f / static_cast<float>(g.keys);
  for (int64_t j = 0; j < tile; ++j)
    for (int64_t c = 0; c < g.vdim; ++c) dvt[j * g.vdim + c] += msum[c] * inv;
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
    const int64_t tiles = g_.query_tiles();
    for_items(g_.batch * g_.heads * tiles, threads_, [&](int t, int64_t w) {
      const int64_t i0 = (w % tiles) * kQueryTile, bh = w / tiles;
      forward_rows(g_, in[0].as<const float>(), in[1].as<const float>(), in[2].as<const float>(), mask,
                   out[0].as<float>(), lse, bh / g_.heads, bh % g_.heads, i0, std::min(g_.queries, i0 + kQueryTile),
                   static_cast<float*>(scratch) + t * g_.thread_floats());
    });
  }
  size_t scratch_bytes() const override { return static_cast<size_t>(threads_ * g_.thread_floats()) * sizeof(float); }

 private:
  Geometry g_;
  int threads_;
};

// FusedAttentionGrad(dY, Q, K, V, Y, LogSumExp, Mask?) -> (dQ, dK, dV)
class FusedAttentionGrad final : public Kernel {
 public:
  FusedAttentionGrad(Geometry g, int threads) : g_(g), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float *dy = in[0].as<const float>(), *q = in[1].as<const float>(), *k = in[2].as<const float>(),
                *v = in[3].as<const float>(), *y = in[4].as<const float>(), *lse = in[5].as<const float>();
    const void* mask = in.size() > 6 && in[6].present() ? in[6].data : nullptr;
    auto* delta = static_cast<float*>(scratch);
    auto* per_thread = delta + rows();
    const int64_t rows_total = rows();
    for_items((rows_total + 255) / 256, threads_, [&](int, int64_t w) {
      row_deltas(dy, y, w * 256, std::min(rows_total, (w + 1) * 256), g_.vdim, delta);
    });
    const int64_t qtiles = g_.query_tiles();
    if (out[0].present())
      for_items(g_.batch * g_.heads * qtiles, threads_, [&](int t, int64_t w) {
        const int64_t i0 = (w % qtiles) * kQueryTile, bh = w / qtiles;
        grad_query_rows(g_, dy, q, k, v, lse, delta, mask, out[0].as<float>(), bh / g_.heads, bh % g_.heads, i0,
                        std::min(g_.queries, i0 + kQueryTile), per_thread + t * g_.thread_floats());
      });
    if (!out[1].present()) return;  // dK and dV come both or neither (the factory's check)
    const int64_t ktiles = g_.key_tiles();
    float *dk = out[1].as<float>(), *dv = out[2].as<float>();
    for_items(g_.batch * g_.kv_heads * ktiles, threads_, [&](int t, int64_t w) {
      const int64_t bkv = w / ktiles;
      grad_key_tile(g_, dy, q, k, v, lse, delta, mask, dk, dv,
                    bkv / g_.kv_heads, bkv % g_.kv_heads, (w % ktiles) * kKeyTile, per_thread + t * g_.thread_floats());
    });
  }
  size_t scratch_bytes() const override {
    return static_cast<size_t>(rows() + threads_ * g_.thread_floats()) * sizeof(float);
  }

 private:
  int64_t rows() const { return g_.batch * g_.heads * g_.queries; }

  Geometry g_;
  int threads_;
};

// g from Q, K, V (inputs q_at, +1, +2) and the optional mask (input mask_at); false when the
// types are outside the op's contract.
bool make_geometry(const KernelSpec& s, size_t q_at, size_t mask_at, Geometry& g) {
  if (!s.has_input(q_at) || !s.has_input(q_at + 1) || !s.has_input(q_at + 2)) return false;
  const TensorType &q = s.inputs[q_at], &k = s.inputs[q_at + 1], &v = s.inputs[q_at + 2];
  for (const TensorType* t : {&q, &k, &v})
    if (t->dtype != DType::kFloat32 || t->shape.size() != 4) return false;
  g.batch = q.shape[0];
  g.heads = q.shape[1];
  g.queries = q.shape[2];
  g.dim = q.shape[3];
  g.kv_heads = k.shape[1];
  g.keys = k.shape[2];
  g.vdim = v.shape[3];
  if (k.shape[0] != g.batch || k.shape[3] != g.dim || v.shape[0] != g.batch || v.shape[1] != g.kv_heads ||
      v.shape[2] != g.keys || g.kv_heads <= 0 || g.heads % g.kv_heads != 0 || g.keys <= 0)
    return false;
  g.scale = s.node.attr_float("scale", 1.f / std::sqrt(static_cast<float>(g.dim)));
  g.causal = s.node.attr_int("causal", 0) != 0;
  if (!s.has_input(mask_at)) return true;
  const TensorType& m = s.inputs[mask_at];
  if (m.dtype == DType::kFloat32) g.mask = Geometry::Mask::kFloat;
  else if (m.dtype == DType::kBool) g.mask = Geometry::Mask::kBool;
  else return false;
  if (m.shape.size() > 4) return false;
  const int64_t full[4] = {g.batch, g.heads, g.queries, g.keys};
  int64_t stride = 1;
  for (int64_t a = 3, r = static_cast<int64_t>(m.shape.size()) - 1; a >= 0; --a, --r) {
    const int64_t dim = r >= 0 ? m.shape[r] : 1;
    if (dim != 1 && dim != full[a]) return false;
    g.mask_stride[a] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
  return true;
}

}  // namespace

// FusedAttention(Q, K, V, Mask?) -> (Y, LogSumExp?), scale, causal.
std::unique_ptr<Kernel> make_fused_attention(const KernelSpec& s) {
  Geometry g;
  if (s.inputs.size() < 3 || s.inputs.size() > 4 || s.outputs.empty() || s.outputs.size() > 2 ||
      !make_geometry(s, 0, 3, g))
    return nullptr;
  if (s.outputs[0] != TensorType{DType::kFloat32, {g.batch, g.heads, g.queries, g.vdim}}) return nullptr;
  if (s.outputs.size() > 1 && s.outputs[1].dtype != DType::kUndefined &&
      s.outputs[1] != TensorType{DType::kFloat32, {g.batch, g.heads, g.queries}})
    return nullptr;
  return std::make_unique<FusedAttention>(g, s.cpu->threads);
}

// FusedAttentionGrad(dY, Q, K, V, Y, LogSumExp, Mask?) -> (dQ?, dK, dV), scale, causal.
std::unique_ptr<Kernel> make_fused_attention_grad(const KernelSpec& s) {
  Geometry g;
  if (s.inputs.size() < 6 || s.inputs.size() > 7 || s.outputs.size() != 3 || !make_geometry(s, 1, 6, g))
    return nullptr;
  const TensorType y{DType::kFloat32, {g.batch, g.heads, g.queries, g.vdim}};
  if (s.inputs[0] != y || s.inputs[4] != y || s.inputs[5] != TensorType{DType::kFloat32, {g.batch, g.heads, g.queries}})
    return nullptr;
  // dK and dV both or neither (one key tile pass makes both).
  for (size_t o = 0; o < 3; ++o)
    if (s.outputs[o].dtype != DType::kUndefined && s.outputs[o] != s.inputs[o + 1]) return nullptr;
  if ((s.outputs[1].dtype == DType::kUndefined) != (s.outputs[2].dtype == DType::kUndefined)) return nullptr;
  return std::make_unique<FusedAttentionGrad>(g, s.cpu->threads);
}

}  // namespace pt::cpu
