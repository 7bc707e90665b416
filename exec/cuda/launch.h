// exec/cuda/launch.h: the CUDA kernels' launchers, the one boundary between the host code that
// plans a kernel (factories in *.cc, compiled by the C++ compiler) and the device code
// (*.cu, compiled by nvcc). Plans are plain structs filled once when a kernel is made; a
// launcher enqueues on `stream` and returns. Element types come as DType and are dispatched
// inside the .cu files; the *_supported() queries say which combinations have a kernel, so a
// factory declines the rest (and the backend reports the node as unsupported).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/ir.h"
#include "exec/cuda/cuda_context.h"
#include "exec/kernel_geometry.h"
#include "exec/parameter_update.h"

namespace pt::cuda {

// ---- element-wise (elementwise.cu) ----------------------------------------------------------

constexpr int kMaxRank = 6;

// Numpy broadcasting of up to three operands into one output (as the CPU's): operand k's element
// at output position (i_0..i_{r-1}) is at sum_d i_d * strides[k][d] (0 along broadcast dims).
struct Broadcast {
  int rank = 1;
  int64_t numel = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[3][kMaxRank] = {};
};

enum class BinaryOp {
  kAdd, kSub, kMul, kDiv, kPow, kMin, kMax, kFmod, kFloorMod,  // y of a's dtype
  kEqual, kLess, kGreater, kLessEqual, kGreaterEqual, kAnd, kOr, kXor  // y bool
};
bool binary_supported(BinaryOp op, DType a, DType b);
bool binary_gives_bool(BinaryOp op);
// y = op(a, b); y has a's dtype (bool for the comparisons and And, Or, Xor). Min and Max: NaN
// wins; Fmod: truncated remainder, FloorMod: floored (x mod 0 = 0 for integers, NaN for floats).
void launch_binary(BinaryOp op, DType a, DType b, const Broadcast& bc, const void* pa,
                   const void* pb, void* py, cudaStream_t stream);
// y = op(op(a, b), c) for Min and Max of three inputs (binary_supported(op, t, t)).
void launch_ternary(BinaryOp op, DType t, const Broadcast& bc, const void* a, const void* b,
                    const void* c, void* y, cudaStream_t stream);
bool where_supported(DType t);
void launch_where(DType t, const Broadcast& bc, const void* cond, const void* x, const void* z,
                  void* y, cudaStream_t stream);

enum class UnaryOp {
  kSqrt, kNeg, kReciprocal, kRelu, kErf, kGeluErf, kGeluTanh, kTanh, kSigmoid, kSin, kCos,
  kAbs, kFloor, kCeil, kExp, kNot
};
bool unary_supported(UnaryOp op, DType t);
void launch_unary(UnaryOp op, DType t, int64_t n, const void* x, void* y, cudaStream_t stream);
// y = h(x) = max(0, min(1, alpha x + beta)), or x * h(x) when swish (HardSigmoid, HardSwish).
void launch_hard_sigmoid(int64_t n, float alpha, float beta, bool swish, const float* x, float* y,
                         cudaStream_t stream);
// y[i] = isnan(x[i]), fp32 -> bool.
void launch_is_nan(int64_t n, const float* x, bool* y, cudaStream_t stream);
// CumSum over x viewed as [outer, n, inner] (scan.cu): one thread per line, summed in order.
void launch_cumsum(int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse,
                   const float* x, float* y, cudaStream_t stream);

// A Clip bound: none (no bound), a value fixed at creation, or a device scalar read by the
// kernel (ptr != null).
struct ClipBound {
  double value = 0;
  const void* ptr = nullptr;
  bool none = false;
};
bool clip_supported(DType t);
void launch_clip(DType t, int64_t n, const void* x, ClipBound lo, ClipBound hi, void* y,
                 cudaStream_t stream);
bool cast_supported(DType from, DType to);
void launch_cast(DType from, DType to, int64_t n, const void* x, void* y, cudaStream_t stream);
void launch_fill_bytes(void* y, unsigned char value, int64_t bytes, cudaStream_t stream);

// Y[i, j] = C[i or 0, j or 0] for Y (m, n) and C (c_rows, c_cols), a dim of 1 broadcast.
void launch_broadcast_matrix(int64_t m, int64_t n, int64_t c_rows, int64_t c_cols,
                             const float* c, float* y, cudaStream_t stream);

// SeededDropout (core/pipetrain_ops.h): mask[i] = u(key, stream, i) >= ratio,
// y[i] = mask[i] ? x[i] * scale : 0, with the generator the spec defines (the same bits as the
// CPU's); key is a device int64 scalar; mask may be null.
void launch_seeded_dropout(int64_t n, float ratio, float scale, int64_t stream_id, const float* x,
                           const int64_t* key, float* y, bool* mask, cudaStream_t stream);
// SeededBernoulli (core/pipetrain_ops.h): y[i] = u(key, stream, i) < p[i] ? 1 : 0, the same
// generator and bits as the CPU's.
void launch_seeded_bernoulli(int64_t n, int64_t stream_id, const float* p, const int64_t* key,
                             float* y, cudaStream_t stream);

// Gradients of the pipetrain domain (core/pipetrain_ops.h), float32, dY/saved/dX of one shape.
enum class GradOp { kRelu, kErf, kGeluErf, kGeluTanh };
void launch_unary_grad(GradOp op, int64_t n, const float* dy, const float* saved, float* dx,
                       cudaStream_t stream);
// dX = dY where lo < X < hi, else 0.
void launch_clip_grad(int64_t n, const float* dy, const float* x, ClipBound lo, ClipBound hi,
                      float* dx, cudaStream_t stream);

// ---- data movement (movement.cu) ------------------------------------------------------------

constexpr int kMaxCopyDims = 8;

// For every index i over dims: dst[out_offset + sum i_k out_stride_k] =
// src[in_offset + sum i_k in_stride_k], in elements of esize (1, 2, 4 or 8) bytes.
struct StridedCopy {
  int rank = 0;
  int64_t numel = 0;
  int64_t dims[kMaxCopyDims] = {};
  int64_t in_stride[kMaxCopyDims] = {};
  int64_t out_stride[kMaxCopyDims] = {};
  int64_t in_offset = 0, out_offset = 0;
  int esize = 4;
};
void launch_strided_copy(const StridedCopy& p, const void* src, void* dst, cudaStream_t stream);

// Gather: data [outer, n, inner] (elements of esize bytes), indices (int64 or int32, count):
// out[o, i, :] = data[o, idx[i] (+ n if negative), :]. Out-of-range indices go to `fault`.
void launch_gather(DType index, int esize, int64_t outer, int64_t n, int64_t count, int64_t inner,
                   const void* data, const void* idx, void* out, DeviceFault* fault,
                   cudaStream_t stream);
// GatherGrad: dd = 0; dd[o, idx[i], :] += dy[o, i, :] in index order (one thread per column).
void launch_gather_grad(DType index, int64_t outer, int64_t n, int64_t count, int64_t inner,
                        const float* dy, const void* idx, float* dd, DeviceFault* fault,
                        cudaStream_t stream);

// Pad (constant mode): y[i] = x[i - begin] where inside x, else the value (value_ptr when not
// null: a device scalar; else the esize low bytes of value_bits).
struct PadPlan {
  int rank = 0;
  int64_t numel = 0;
  int64_t in_dims[kMaxCopyDims] = {};
  int64_t out_dims[kMaxCopyDims] = {};
  int64_t begin[kMaxCopyDims] = {};
  int esize = 4;
};
void launch_pad(const PadPlan& p, const void* x, const void* value_ptr, uint64_t value_bits,
                void* y, cudaStream_t stream);

// Trilu over [matrices, n, m] (elements of esize bytes): y = x where j - i >= k (upper) or
// j - i <= k (lower), else zero bytes. k: k_ptr (a device int64 scalar) when not null, else k.
void launch_trilu(int esize, int64_t matrices, int64_t n, int64_t m, bool upper, int64_t k,
                  const int64_t* k_ptr, const void* x, void* y, cudaStream_t stream);

// ---- reductions (reduce.cu) -----------------------------------------------------------------

// Sums over many rows for few outputs (a bias gradient: [8192, 1024] summed over rows) are split
// into this many blocks of consecutive rows so that enough threads run: one thread per output
// and block sums its rows in order into a double partial (scratch), then one thread per output
// sums the partials in order. The split depends on the shape alone, so the bits do too. 1: none.
int64_t sum_splits(int64_t rows, int64_t outputs);

// y[o] = scale * sum_r x[kept_offset(o) + reduced_offset(r)], every sum in a fixed order.
struct ReducePlan {
  int kept_rank = 0, reduced_rank = 0;
  int64_t kept_dims[kMaxRank] = {}, kept_strides[kMaxRank] = {};
  int64_t reduced_dims[kMaxRank] = {}, reduced_strides[kMaxRank] = {};
  int64_t out_numel = 1, count = 1;
  float scale = 1.f;
  bool inner_reduced = false;  // the input's innermost dim is reduced: a block per output
  int64_t splits = 1;          // inner kept: sum_splits(count, out_numel)
  size_t scratch_bytes() const { return splits > 1 ? sizeof(double) * size_t(splits * out_numel) : 0; }
};
void launch_reduce(const ReducePlan& p, const float* x, float* y, void* scratch, cudaStream_t stream);
// ReduceMax, ReduceMin, ReduceProd over the plan's reduced dims (scale, splits unused): one thread
// per output walking its elements in order; NaN wins max and min. t: float32, float64, int32,
// int64, and bool for max and min (any, all).
enum class ReduceWalk { kMax, kMin, kProd };
bool reduce_walk_supported(ReduceWalk op, DType t);  // Max and Min also of bool
void launch_reduce_walk(ReduceWalk op, DType t, const ReducePlan& p, const void* x, void* y,
                        cudaStream_t stream);

// ---- normalisation (norm.cu) ----------------------------------------------------------------

// LayerNormalization over rows of `inner`: y = (x - mean) * inv_std * scale + bias; mean and
// inv_std (one per row) written when not null. bias may be null.
void launch_layer_norm(int64_t outer, int64_t inner, float epsilon, const float* x,
                       const float* scale, const float* bias, float* y, float* mean,
                       float* inv_std, cudaStream_t stream);
// LayerNormGrad (core/pipetrain_ops.h); any of dx, dscale, dbias may be null. dScale and dBias
// are sums over the `outer` rows, split as sum_splits says; scratch holds
// layer_norm_grad_scratch(outer, inner) bytes.
size_t layer_norm_grad_scratch(int64_t outer, int64_t inner);
void launch_layer_norm_grad(int64_t outer, int64_t inner, const float* dy, const float* x,
                            const float* scale, const float* mean, const float* inv_std,
                            float* dx, float* dscale, float* dbias, void* scratch,
                            cudaStream_t stream);
// BatchNormalization's running statistics (ONNX: biased batch variance):
//   out_mean = in_mean * momentum + batch_mean * (1 - momentum)
//   out_var  = in_var * momentum + unbiased_var * (count - 1) / count * (1 - momentum)
// out_mean / out_var may be null.
void launch_batch_norm_running(int64_t channels, int64_t count, float momentum,
                               const float* in_mean, const float* in_var,
                               const float* batch_mean, const float* unbiased_var,
                               float* out_mean, float* out_var, cudaStream_t stream);

// ---- pooling (pool.cu) ----------------------------------------------------------------------

// A window op over planes of up to 3 spatial dims (leading dims of size 1 fill the rest):
// window o of dim d starts at o * stride - pad and has taps at start + k * dilation, k < kernel.
struct PoolGeom {
  int64_t planes = 1;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, kernel[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1}, dilation[3] = {1, 1, 1}, pad[3] = {0, 0, 0};
};
void launch_max_pool(const PoolGeom& g, const float* x, float* y, cudaStream_t stream);
// Average over the taps inside the input, divided by their count or, with include_pad, by the
// kernel's size.
void launch_average_pool(const PoolGeom& g, bool include_pad, const float* x, float* y,
                         cudaStream_t stream);
// MaxPoolGrad: each dY element to the first maximum of its window (row-major; padding never
// wins), gathered per dX cell in output order (deterministic).
void launch_max_pool_grad(const PoolGeom& g, const float* dy, const float* x, float* dx,
                          cudaStream_t stream);
void launch_average_pool_grad(const PoolGeom& g, bool include_pad, const float* dy, float* dx,
                              cudaStream_t stream);

// ---- attention (attention.cu) ---------------------------------------------------------------

// FusedAttention's geometry is kernel_geometry.h's AttentionGeometry, as the CPU kernel's.
constexpr int64_t kMaxAttentionDim = 256;
// Whether the kernels take g: dim and vdim up to kMaxAttentionDim, and their tiles in the
// device's shared memory.
bool attention_supported(const AttentionGeometry& g);
// Y [batch, heads, queries, vdim] and, where lse is not null, LogSumExp [batch, heads, queries].
void launch_fused_attention(const AttentionGeometry& g, const float* q, const float* k, const float* v,
                            const void* mask, float* y, float* lse, cudaStream_t stream);
// FusedAttentionGrad: dq may be null; dk and dv both or neither. scratch holds
// fused_attention_grad_scratch(g) bytes (delta_i = dY_i . Y_i).
size_t fused_attention_grad_scratch(const AttentionGeometry& g);
void launch_fused_attention_grad(const AttentionGeometry& g, const float* dy, const float* q, const float* k,
                                 const float* v, const float* y, const float* lse, const void* mask,
                                 float* dq, float* dk, float* dv, void* scratch, cudaStream_t stream);
// fp32 to bf16 (bf16 true) or fp16 (round to nearest even) and back, n elements: the copies
// cuDNN's attention reads and writes (cudnn_attention.cc).
void launch_to_half(const float* x, void* y, int64_t n, bool bf16, cudaStream_t stream);
void launch_from_half(const void* x, float* y, int64_t n, bool bf16, cudaStream_t stream);

// ---- loss (loss.cu) -------------------------------------------------------------------------

// SoftmaxCrossEntropy over rows of `classes`: row_loss (scratch, rows doubles), then
// loss[0] = scale[0] * sum of row_loss in row order. Bad targets go to `fault`.
void launch_softmax_cross_entropy(int64_t rows, int64_t classes, int64_t ignore_index,
                                  const float* logits, const int64_t* target, const float* scale,
                                  double* row_loss, float* loss, DeviceFault* fault,
                                  cudaStream_t stream);
void launch_softmax_cross_entropy_grad(int64_t rows, int64_t classes, int64_t ignore_index,
                                       const float* dloss, const float* logits,
                                       const int64_t* target, const float* scale, float* dlogits,
                                       DeviceFault* fault, cudaStream_t stream);

// ---- parameter updates (update.cu) ----------------------------------------------------------

// Sum of squares of x[0..n) in double, in a fixed order: block b of squares_blocks(n) sums
// elements [b * kSquaresChunk, (b + 1) * kSquaresChunk) into partial[b]; then one block adds
// the partials into *out. The same bits on every run.
constexpr int64_t kSquaresChunk = 16384;
inline int64_t squares_blocks(int64_t n) { return (n + kSquaresChunk - 1) / kSquaresChunk; }
void launch_sum_squares(const float* x, int64_t n, double* partial, double* out, cudaStream_t stream);
// One tensor by the rules of exec/parameter_update.h (b null without momentum).
void launch_sgd_update(float* p, const float* g, float* b, int64_t n, const SgdScalars& s,
                       cudaStream_t stream);
void launch_adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                         const AdamWScalars& s, cudaStream_t stream);

}  // namespace pt::cuda
