// exec/kernel_geometry.h: the backend-neutral half of making a kernel. A factory (exec/cpu,
// exec/cuda) first checks a KernelSpec and works out its geometry here: which inputs and outputs
// are present, axes normalised, strides, numpy broadcasting, the dims a reduction folds, the
// matrices of MatMul and Gemm. Both backends plan from the same functions, so they accept the
// same specs and see the same shapes; each then adds only its own limits (dtypes, ranks, int
// sizes) and builds its kernel. The data-movement ops' geometry is in movement_geometry.h, the
// window ops' (Conv, pooling) in window.h.
//
// In: a KernelSpec (node, concrete input/output types, constant inputs). Out: plain data, or
// nullopt / false when the spec is outside what the op's kernels handle.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/ir.h"
#include "exec/kernel.h"

namespace pt {

using Dims = std::vector<int64_t>;

// ---- spec checks ----------------------------------------------------------------------------

// Output k present (its dtype defined).
bool wanted(const KernelSpec& s, size_t k);
// Inputs 0..inputs-1 and output 0 present.
bool has_io(const KernelSpec& s, size_t inputs);
// Every present input and output is float32, and output 0 is present.
bool float_io(const KernelSpec& s);

// ---- shape arithmetic -----------------------------------------------------------------------

// v[begin] * ... * v[end - 1]
int64_t product(const Dims& v, size_t begin, size_t end);
// axis in [-rank, rank) -> [0, rank); -1 when out of range.
int64_t normalize_axis(int64_t axis, size_t rank);
// Row-major strides, in elements.
Dims strides_of(const Dims& shape);
// `in` right-aligned to `rank` dims, padded with leading 1s; nullopt if it has more dims.
std::optional<Dims> align_to_rank(const Dims& in, size_t rank);
// Integer data (int64 or int32) of constant input i; nullopt when it is not constant.
std::optional<Dims> constant_ints(const KernelSpec& s, size_t i);
// Value of input k when it is a constant scalar of type T; nullopt when omitted or not.
template <class T>
std::optional<T> constant_scalar(const KernelSpec& s, size_t k) {
  const Tensor* c = s.has_input(k) ? s.constant(k) : nullptr;
  if (!c || c->type.dtype != dtype_of<T>() || c->type.numel() != 1) return std::nullopt;
  return c->as<T>()[0];
}

// ---- numpy broadcasting ---------------------------------------------------------------------

constexpr int kMaxBroadcastRank = 6;

// Up to three operands broadcast into one output: operand k's element at output position
// (i_0..i_{r-1}) is at sum_d i_d * strides[k][d], the stride 0 along dims it broadcasts. Adjacent
// dims that every operand walks the same way are merged, so a same-shape op is one flat dim and
// [B,H,S,S] + [1,1,S,S] is [B*H, S*S]; size-1 output dims are dropped (rank >= 1).
struct BroadcastGeometry {
  int rank = 1;
  std::array<int64_t, kMaxBroadcastRank> dims{};                    // merged output dims
  std::array<std::array<int64_t, kMaxBroadcastRank>, 3> strides{};  // [operand][dim], elements
  int64_t numel = 0;
};

// Inputs 0..n-1 (n <= 3) broadcast into output 0; nullopt when a shape does not broadcast to the
// output or the output's rank exceeds kMaxBroadcastRank.
std::optional<BroadcastGeometry> broadcast_geometry(const KernelSpec& s, int n);

// ---- ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd --------------------------------

// Which input dims a reduction folds (opset 13: axes as constant int64 input 1 or the `axes`
// attribute; empty axes fold every dim, or none with noop_with_empty_axes = 1); nullopt when the
// spec is outside that (an output dtype other than the input's, axes not constant, out of range
// or repeated, or an output shape other than keepdims asks for). The factories check the dtypes
// they take.
std::optional<std::vector<bool>> reduce_geometry(const KernelSpec& s);

// ---- MatMul, Gemm ---------------------------------------------------------------------------

// Numpy matmul of A (a0) and B (b0) into Y (y0): 1-D operands promoted (A: (K) -> (1, K),
// B: (K) -> (K, 1)), ranks aligned with leading 1s, batch dims broadcast.
struct MatmulGeometry {
  Dims a, b;      // promoted and aligned to rank r = max(rank A, rank B) (after promotion)
  Dims batch;     // the broadcast batch dims (r - 2 of them)
  int64_t m = 0, n = 0, k = 0;
  size_t rank() const { return a.size(); }
};
// nullopt when the shapes do not multiply or Y is not numpy's result shape.
std::optional<MatmulGeometry> matmul_geometry(const Dims& a0, const Dims& b0, const Dims& y0);

// Gemm: Y = alpha * A' @ B' + beta * C, A' = transA ? A^T : A (M, K), B' = transB ? B^T : B
// (K, N), C unidirectionally broadcast to (M, N) as a (c_rows, c_cols) matrix.
struct GemmGeometry {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.f;
  float beta = 0.f;                // 0 when C is omitted (or beta is 0): no C
  int64_t c_rows = 0, c_cols = 0;  // when beta != 0
  // C is a row bias of N with alpha = beta = 1 (torch's Linear).
  bool row_bias() const {
    return beta != 0.f && c_rows == 1 && c_cols == n && alpha == 1.f && beta == 1.f;
  }
};
// Inputs A, B (2-D) and C; nullopt when the shapes do not fit or C does not broadcast.
std::optional<GemmGeometry> gemm_geometry(const KernelSpec& s);

// CumSum(X, axis) with X viewed as [outer, n, inner] around the summed axis: each of the
// outer x inner lines is summed in order (backwards when reverse; exclusive leaves each element
// out of its own sum). nullopt when the axis is not a constant scalar within X's rank or Y is not
// X's type.
struct ScanGeometry {
  int64_t outer = 1, n = 1, inner = 1;
  bool exclusive = false, reverse = false;
};
std::optional<ScanGeometry> scan_geometry(const KernelSpec& s);

// FusedAttention and FusedAttentionGrad (core/pipetrain_ops.h): Q [batch, heads, queries, dim],
// K [batch, kv_heads, keys, dim], V [batch, kv_heads, keys, vdim], all float32, heads a multiple
// of kv_heads, at least one key; the mask float32 (added) or bool (false hides the key),
// broadcast to [batch, heads, queries, keys] by mask_stride (0 along the dims it broadcasts);
// scale (default 1/sqrt(dim)) and causal from the node.
struct AttentionGeometry {
  int64_t batch = 0, heads = 0, kv_heads = 0, queries = 0, keys = 0, dim = 0, vdim = 0;
  float scale = 1.f;
  bool causal = false;
  enum class Mask { kNone, kFloat, kBool } mask = Mask::kNone;
  int64_t mask_stride[4] = {0, 0, 0, 0};  // along b, h, i, j
};
// FusedAttention(Q, K, V, Mask?) -> (Y, LogSumExp?); nullopt outside the contract.
std::optional<AttentionGeometry> fused_attention_geometry(const KernelSpec& s);
// FusedAttentionGrad(dY, Q, K, V, Y, LogSumExp, Mask?) -> (dQ?, dK?, dV?), dK and dV both or
// neither; nullopt outside the contract.
std::optional<AttentionGeometry> fused_attention_grad_geometry(const KernelSpec& s);

}  // namespace pt
