// exec/cuda/attention.cu: device code of FusedAttention and FusedAttentionGrad in fp32
// (core/pipetrain_ops.h), FlashAttention-2's algorithm as the CPU's (exec/cpu/attention.cc):
//   forward   a block per (batch x head, tile of kRows queries); key tiles of kCols in shared
//             memory, each row's running max and sum (online softmax), Y and LogSumExp out,
//             never the scores;
//   backward  delta_i = dY_i . Y_i (a warp per row); dK and dV by a block per (batch x kv head,
//             key tile), walking every query of every head that reads the tile; dQ by a block
//             per (batch x head, query tile), walking the key tiles. Scores and probabilities are
//             recomputed from Q, K and LogSumExp. No atomics: every sum has one owner and a
//             fixed order, so every run gives the same bits.
// A fully masked row (every score -inf) gets the mean of V over all keys and LogSumExp -inf in
// the forward, p = 1/T and no gradient through its scores in the backward, as the CPU kernel.
// Threads: kThreads (256); within a tile, row r is served by the 16 threads r * 16 .. r * 16 + 15
// (half a warp), each holding every 16th column of the row's output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "exec/cuda/device_util.cuh"
#include "exec/cuda/launch.h"

namespace pt::cuda {
namespace {

constexpr int kRows = 16;         // queries per tile
constexpr int kCols = 32;         // keys per tile
constexpr int kLanesPerRow = 16;  // threads per query row (kRows * kLanesPerRow == kThreads)
constexpr int kMaxColumns = kMaxAttentionDim / kLanesPerRow;  // a thread's share of a row's outputs
static_assert(kRows * kLanesPerRow == kThreads);

// The score of query i (head h of batch b) and key j: scale * q . k + mask, -inf where causal
// hides j or a bool mask is false, or past the last key.
__device__ float score(const AttentionGeometry& g, const float* q, const float* k, int dim, int64_t b, int64_t h,
                       int64_t i, int64_t j, const void* mask) {
  if (j >= g.keys || (g.causal && j > i)) return -INFINITY;
  float dot = 0.f;
  for (int d = 0; d < dim; ++d) dot += q[d] * k[d];
  float s = g.scale * dot;
  if (g.mask != AttentionGeometry::Mask::kNone) {
    const int64_t at = b * g.mask_stride[0] + h * g.mask_stride[1] + i * g.mask_stride[2] + j * g.mask_stride[3];
    if (g.mask == AttentionGeometry::Mask::kFloat) s += static_cast<const float*>(mask)[at];
    else if (!static_cast<const bool*>(mask)[at]) s = -INFINITY;
  }
  return s;
}

// Max and sum over the 16 threads serving one row (lanes xor 1..8 stay in the half warp).
__device__ float row_max(float v) {
  for (int o = kLanesPerRow / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, kLanesPerRow));
  return v;
}
__device__ float row_sum(float v) {
  for (int o = kLanesPerRow / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, kLanesPerRow);
  return v;
}

// Rows [row0, row0 + n) of a [rows, width] matrix into shared memory, zeros past `rows`.
__device__ void load_rows(float* dst, const float* src, int64_t row0, int64_t rows, int n, int width) {
  for (int e = threadIdx.x; e < n * width; e += blockDim.x) {
    const int r = e / width;
    dst[e] = row0 + r < rows ? src[(row0 + r) * width + e % width] : 0.f;
  }
}

// Y and LogSumExp of kRows queries of one head. Shared: Q [kRows][dim], K [kCols][dim],
// V [kCols][vdim], P [kRows][kCols].
__global__ void attention_forward(AttentionGeometry g, const float* q, const float* k, const float* v, const void* mask,
                                  float* y, float* lse) {
  extern __shared__ float smem[];
  const int dim = static_cast<int>(g.dim), vdim = static_cast<int>(g.vdim);
  float* qs = smem;
  float* ks = qs + kRows * dim;
  float* vs = ks + kCols * dim;
  float* ps = vs + kCols * vdim;
  const int64_t bh = blockIdx.x, b = bh / g.heads, h = bh % g.heads;
  const int64_t kv = b * g.kv_heads + h / (g.heads / g.kv_heads);
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int r = threadIdx.x / kLanesPerRow, lane = threadIdx.x % kLanesPerRow;
  const int64_t i = i0 + r;
  const float* kh = k + kv * g.keys * dim;
  const float* vh = v + kv * g.keys * vdim;
  load_rows(qs, q + bh * g.queries * dim, i0, g.queries, kRows, dim);
  float m = -INFINITY, l = 0.f, acc[kMaxColumns];
  for (int c = 0; c < kMaxColumns; ++c) acc[c] = 0.f;
  // Causal: the tile's last query sees keys up to its own index.
  const int64_t key_end = g.causal && i0 + kRows < g.keys ? i0 + kRows : g.keys;
  for (int64_t j0 = 0; j0 < key_end; j0 += kCols) {
    __syncthreads();  // the previous tile's K, V and P are read
    load_rows(ks, kh, j0, g.keys, kCols, dim);
    load_rows(vs, vh, j0, g.keys, kCols, vdim);
    __syncthreads();
    float s[kCols / kLanesPerRow];
    float tile_max = -INFINITY;
    for (int t = 0; t < kCols / kLanesPerRow; ++t) {
      const int c = lane + t * kLanesPerRow;
      s[t] = i < g.queries ? score(g, qs + r * dim, ks + c * dim, dim, b, h, i, j0 + c, mask) : -INFINITY;
      tile_max = fmaxf(tile_max, s[t]);
    }
    const float m_new = fmaxf(m, row_max(tile_max));
    // Nothing seen yet (m_new -inf): probabilities 0 and the sums stay as they are.
    const float alpha = m_new == -INFINITY ? 1.f : expf(m - m_new);
    float sum = 0.f;
    for (int t = 0; t < kCols / kLanesPerRow; ++t) {
      const float p = m_new == -INFINITY ? 0.f : expf(s[t] - m_new);
      ps[r * kCols + lane + t * kLanesPerRow] = p;
      sum += p;
    }
    l = l * alpha + row_sum(sum);
    m = m_new;
    __syncwarp();
    for (int c = 0; c < kMaxColumns; ++c) {
      const int d = lane + c * kLanesPerRow;
      if (d >= vdim) break;
      float a = acc[c] * alpha;
      for (int j = 0; j < kCols; ++j) a += ps[r * kCols + j] * vs[j * vdim + d];
      acc[c] = a;
    }
  }
  if (i >= g.queries) return;
  float* yi = y + (bh * g.queries + i) * vdim;
  if (m == -INFINITY) {  // fully masked: the mean of V over every key
    for (int c = 0; c < kMaxColumns; ++c) {
      const int d = lane + c * kLanesPerRow;
      if (d >= vdim) break;
      float total = 0.f;
      for (int64_t j = 0; j < g.keys; ++j) total += vh[j * vdim + d];
      yi[d] = total / static_cast<float>(g.keys);
    }
    if (lse && lane == 0) lse[bh * g.queries + i] = -INFINITY;
    return;
  }
  for (int c = 0; c < kMaxColumns; ++c) {
    const int d = lane + c * kLanesPerRow;
    if (d >= vdim) break;
    yi[d] = acc[c] / l;
  }
  if (lse && lane == 0) lse[bh * g.queries + i] = m + logf(l);
}

// delta[row] = dY[row] . Y[row]: a warp per row, lanes in a fixed order.
__global__ void attention_delta(int64_t rows, int64_t vdim, const float* dy, const float* y, float* delta) {
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    float sum = 0.f;
    for (int64_t d = lane; d < vdim; d += 32) sum += dy[row * vdim + d] * y[row * vdim + d];
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) delta[row] = sum;
  }
}

// For row r of a query tile against the key tile in shared memory: P and dS into ps and dss
// (kRows x kCols). p_ij = exp(s_ij - LogSumExp_i), 1/T on a fully masked row; ds_ij = p_ij
// (dY_i . v_j - delta_i), 0 on a fully masked row.
__device__ void probabilities(const AttentionGeometry& g, const float* qs, const float* dys, const float* ks,
                              const float* vs, const float* lses, const float* deltas, const void* mask, int64_t b,
                              int64_t h, int64_t i0, int64_t j0, float* ps, float* dss) {
  const int dim = static_cast<int>(g.dim), vdim = static_cast<int>(g.vdim);
  const int r = threadIdx.x / kLanesPerRow, lane = threadIdx.x % kLanesPerRow;
  const int64_t i = i0 + r;
  for (int t = 0; t < kCols / kLanesPerRow; ++t) {
    const int c = lane + t * kLanesPerRow;
    float p = 0.f, ds = 0.f;
    if (i < g.queries && j0 + c < g.keys) {
      if (lses[r] == -INFINITY) {
        p = 1.f / static_cast<float>(g.keys);
      } else {
        const float s = score(g, qs + r * dim, ks + c * dim, dim, b, h, i, j0 + c, mask);
        p = s == -INFINITY ? 0.f : expf(s - lses[r]);
        float dp = 0.f;
        for (int d = 0; d < vdim; ++d) dp += dys[r * vdim + d] * vs[c * vdim + d];
        ds = p * (dp - deltas[r]);
      }
    }
    ps[r * kCols + c] = p;
    dss[r * kCols + c] = ds;
  }
}

// The backward's tiles in shared memory (grad_shared's bytes): K [kCols][dim], V [kCols][vdim],
// Q [kRows][dim], dY [kRows][vdim], P and dS [kRows][kCols], LogSumExp and delta [kRows].
struct GradTiles {
  float *ks, *vs, *qs, *dys, *ps, *dss, *lses, *deltas;
  __device__ GradTiles(float* smem, int dim, int vdim) {
    ks = smem;
    vs = ks + kCols * dim;
    qs = vs + kCols * vdim;
    dys = qs + kRows * dim;
    ps = dys + kRows * vdim;
    dss = ps + kRows * kCols;
    lses = dss + kRows * kCols;
    deltas = lses + kRows;
  }
  // Query tile i0 of head bh: its Q, dY, LogSumExp and delta rows (zeros past the last query).
  __device__ void load_queries(const AttentionGeometry& g, int64_t bh, int64_t i0, const float* q, const float* dy,
                               const float* lse, const float* delta) {
    const int dim = static_cast<int>(g.dim), vdim = static_cast<int>(g.vdim);
    load_rows(qs, q + bh * g.queries * dim, i0, g.queries, kRows, dim);
    load_rows(dys, dy + bh * g.queries * vdim, i0, g.queries, kRows, vdim);
    if (threadIdx.x < kRows) {
      const int64_t i = i0 + threadIdx.x;
      lses[threadIdx.x] = i < g.queries ? lse[bh * g.queries + i] : 0.f;
      deltas[threadIdx.x] = i < g.queries ? delta[bh * g.queries + i] : 0.f;
    }
  }
};

// dK and dV of one key tile of one kv head: every query tile of every head reading it. Thread t
// owns key t / 8 and columns t % 8 + 8 c of its dK and dV.
constexpr int kKeyLanes = kThreads / kCols;  // 8 threads per key
constexpr int kMaxKeyColumns = kMaxAttentionDim / kKeyLanes;
__global__ void attention_grad_kv(AttentionGeometry g, const float* dy, const float* q, const float* k, const float* v,
                                  const float* lse, const float* delta, const void* mask, float* dk, float* dv) {
  extern __shared__ float smem[];
  const int dim = static_cast<int>(g.dim), vdim = static_cast<int>(g.vdim);
  GradTiles t(smem, dim, vdim);
  const int64_t bkv = blockIdx.x, b = bkv / g.kv_heads, hk = bkv % g.kv_heads;
  const int64_t group = g.heads / g.kv_heads;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * kCols;
  load_rows(t.ks, k + bkv * g.keys * dim, j0, g.keys, kCols, dim);
  load_rows(t.vs, v + bkv * g.keys * vdim, j0, g.keys, kCols, vdim);
  const int c = threadIdx.x / kKeyLanes, lane = threadIdx.x % kKeyLanes;
  float dk_acc[kMaxKeyColumns], dv_acc[kMaxKeyColumns];
  for (int e = 0; e < kMaxKeyColumns; ++e) dk_acc[e] = dv_acc[e] = 0.f;
  // Causal without a mask: no row is fully masked, and queries before j0 see none of these keys.
  const int64_t i_start = g.causal && g.mask == AttentionGeometry::Mask::kNone ? j0 / kRows * kRows : 0;
  for (int64_t hh = hk * group; hh < (hk + 1) * group; ++hh) {
    const int64_t bh = b * g.heads + hh;
    for (int64_t i0 = i_start; i0 < g.queries; i0 += kRows) {
      __syncthreads();
      t.load_queries(g, bh, i0, q, dy, lse, delta);
      __syncthreads();
      probabilities(g, t.qs, t.dys, t.ks, t.vs, t.lses, t.deltas, mask, b, hh, i0, j0, t.ps, t.dss);
      __syncthreads();
      for (int e = 0; e < kMaxKeyColumns; ++e) {
        const int d = lane + e * kKeyLanes;
        if (d < vdim) {
          float a = dv_acc[e];
          for (int rr = 0; rr < kRows; ++rr) a += t.ps[rr * kCols + c] * t.dys[rr * vdim + d];
          dv_acc[e] = a;
        }
        if (d < dim) {
          float a = dk_acc[e];
          for (int rr = 0; rr < kRows; ++rr) a += t.dss[rr * kCols + c] * t.qs[rr * dim + d];
          dk_acc[e] = a;
        }
      }
    }
  }
  if (j0 + c >= g.keys) return;
  for (int e = 0; e < kMaxKeyColumns; ++e) {
    const int d = lane + e * kKeyLanes;
    if (d < vdim) dv[(bkv * g.keys + j0 + c) * vdim + d] = dv_acc[e];
    if (d < dim) dk[(bkv * g.keys + j0 + c) * dim + d] = g.scale * dk_acc[e];
  }
}

// dQ of one query tile of one head: every key tile. Thread layout as the forward's.
__global__ void attention_grad_q(AttentionGeometry g, const float* dy, const float* q, const float* k, const float* v,
                                 const float* lse, const float* delta, const void* mask, float* dq) {
  extern __shared__ float smem[];
  const int dim = static_cast<int>(g.dim), vdim = static_cast<int>(g.vdim);
  GradTiles t(smem, dim, vdim);
  const int64_t bh = blockIdx.x, b = bh / g.heads, h = bh % g.heads;
  const int64_t kv = b * g.kv_heads + h / (g.heads / g.kv_heads);
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int r = threadIdx.x / kLanesPerRow, lane = threadIdx.x % kLanesPerRow;
  t.load_queries(g, bh, i0, q, dy, lse, delta);
  float acc[kMaxColumns];
  for (int e = 0; e < kMaxColumns; ++e) acc[e] = 0.f;
  // A fully masked row has no gradient through its scores, so causal tiles past the diagonal
  // (whose p may be 1/T there) add nothing to dQ.
  const int64_t key_end = g.causal && i0 + kRows < g.keys ? i0 + kRows : g.keys;
  for (int64_t j0 = 0; j0 < key_end; j0 += kCols) {
    __syncthreads();
    load_rows(t.ks, k + kv * g.keys * dim, j0, g.keys, kCols, dim);
    load_rows(t.vs, v + kv * g.keys * vdim, j0, g.keys, kCols, vdim);
    __syncthreads();
    probabilities(g, t.qs, t.dys, t.ks, t.vs, t.lses, t.deltas, mask, b, h, i0, j0, t.ps, t.dss);
    __syncthreads();
    for (int e = 0; e < kMaxColumns; ++e) {
      const int d = lane + e * kLanesPerRow;
      if (d >= dim) break;
      float a = acc[e];
      for (int j = 0; j < kCols; ++j) a += t.dss[r * kCols + j] * t.ks[j * dim + d];
      acc[e] = a;
    }
  }
  const int64_t i = i0 + r;
  if (i >= g.queries) return;
  for (int e = 0; e < kMaxColumns; ++e) {
    const int d = lane + e * kLanesPerRow;
    if (d >= dim) break;
    dq[(bh * g.queries + i) * dim + d] = g.scale * acc[e];
  }
}

size_t forward_shared(const AttentionGeometry& g) {
  return sizeof(float) * static_cast<size_t>(kRows * g.dim + kCols * (g.dim + g.vdim) + kRows * kCols);
}
size_t grad_shared(const AttentionGeometry& g) {
  return sizeof(float) *
         static_cast<size_t>(kCols * (g.dim + g.vdim) + kRows * (g.dim + g.vdim) + 2 * kRows * kCols + 2 * kRows);
}

// Allows a kernel the shared memory it asks for past the default 48 KiB.
template <class Fn>
void allow_shared(Fn* kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    PT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

unsigned tiles(int64_t n, int per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace

bool attention_supported(const AttentionGeometry& g) {
  if (g.dim <= 0 || g.vdim <= 0 || g.dim > kMaxAttentionDim || g.vdim > kMaxAttentionDim) return false;
  if (g.batch * g.heads > 2147483647 || tiles(g.queries, kRows) > 65535 || tiles(g.keys, kCols) > 65535) return false;
  int device = 0, most = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return false;
  return std::max(forward_shared(g), grad_shared(g)) <= static_cast<size_t>(most);
}

void launch_fused_attention(const AttentionGeometry& g, const float* q, const float* k, const float* v, const void* mask,
                            float* y, float* lse, cudaStream_t stream) {
  if (g.batch * g.heads == 0 || g.queries == 0) return;
  const size_t shared = forward_shared(g);
  allow_shared(attention_forward, shared);
  const dim3 grid(static_cast<unsigned>(g.batch * g.heads), tiles(g.queries, kRows));
  attention_forward<<<grid, kThreads, shared, stream>>>(g, q, k, v, mask, y, lse);
  PT_CUDA_LAUNCH_CHECK();
}

size_t fused_attention_grad_scratch(const AttentionGeometry& g) {
  return sizeof(float) * static_cast<size_t>(g.batch * g.heads * g.queries);
}

void launch_fused_attention_grad(const AttentionGeometry& g, const float* dy, const float* q, const float* k,
                                 const float* v, const float* y, const float* lse, const void* mask, float* dq,
                                 float* dk, float* dv, void* scratch, cudaStream_t stream) {
  const int64_t rows = g.batch * g.heads * g.queries;
  float* delta = static_cast<float*>(scratch);
  const size_t shared = grad_shared(g);
  if (rows > 0) {
    attention_delta<<<grid_for(rows * 32), kThreads, 0, stream>>>(rows, g.vdim, dy, y, delta);
    PT_CUDA_LAUNCH_CHECK();
  }
  if (dk && dv && g.batch * g.kv_heads > 0) {
    allow_shared(attention_grad_kv, shared);
    const dim3 grid(static_cast<unsigned>(g.batch * g.kv_heads), tiles(g.keys, kCols));
    attention_grad_kv<<<grid, kThreads, shared, stream>>>(g, dy, q, k, v, lse, delta, mask, dk, dv);
    PT_CUDA_LAUNCH_CHECK();
  }
  if (dq && rows > 0) {
    allow_shared(attention_grad_q, shared);
    const dim3 grid(static_cast<unsigned>(g.batch * g.heads), tiles(g.queries, kRows));
    attention_grad_q<<<grid, kThreads, shared, stream>>>(g, dy, q, k, v, lse, delta, mask, dq);
    PT_CUDA_LAUNCH_CHECK();
  }
}

// ---- 16-bit copies for cuDNN's attention (cudnn_attention.cc) --------------------------------

namespace {

template <class Half>
__device__ Half narrow(float x);
template <>
__device__ __nv_bfloat16 narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __half narrow<__half>(float x) { return __float2half_rn(x); }

template <class Half>
__global__ void round_to_half(int64_t n, const float* x, Half* y) {
  PT_GRID_STRIDE(i, n) y[i] = narrow<Half>(x[i]);
}

template <class Half>
__global__ void widen_half(int64_t n, const Half* x, float* y) {
  PT_GRID_STRIDE(i, n) y[i] = static_cast<float>(x[i]);
}

}  // namespace

void launch_to_half(const float* x, void* y, int64_t n, bool bf16, cudaStream_t stream) {
  if (n <= 0) return;
  if (bf16) round_to_half<<<grid_for(n), kThreads, 0, stream>>>(n, x, static_cast<__nv_bfloat16*>(y));
  else round_to_half<<<grid_for(n), kThreads, 0, stream>>>(n, x, static_cast<__half*>(y));
  PT_CUDA_LAUNCH_CHECK();
}

void launch_from_half(const void* x, float* y, int64_t n, bool bf16, cudaStream_t stream) {
  if (n <= 0) return;
  if (bf16) widen_half<<<grid_for(n), kThreads, 0, stream>>>(n, static_cast<const __nv_bfloat16*>(x), y);
  else widen_half<<<grid_for(n), kThreads, 0, stream>>>(n, static_cast<const __half*>(x), y);
  PT_CUDA_LAUNCH_CHECK();
}

}  // namespace pt::cuda
