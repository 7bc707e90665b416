// exec/movement_geometry.h: the backend-neutral geometry of the data-movement ops (Transpose,
// Slice, Expand, Concat, Split, Gather, GatherGrad, constant-mode Pad), worked out from a
// KernelSpec once: which elements go where, as strided copies or index arithmetic. The CPU
// (exec/cpu/movement*.cc) and CUDA (exec/cuda/movement.cc) factories plan from here, so both
// accept the same specs and move the same elements; each checks its own dtypes first and runs the
// copies its own way.
//
// In: a KernelSpec whose input 0 and output 0 are present with one dtype (each backend's
// `same_movable_type`) where a function says so. Out: plain data, or nullopt when the spec is
// outside what the op's kernels handle.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "exec/kernel_geometry.h"

namespace pt {

// A strided copy from input `from` to output `to`: for every index i over `shape`,
//   out[out_offset + sum_k i_k * out_stride_k] = in[in_offset + sum_k i_k * in_stride_k]
// (offsets and strides in elements; strides may be 0 (broadcast) or negative).
struct CopyGeometry {
  Dims shape, in_stride, out_stride;
  int64_t in_offset = 0, out_offset = 0;
  size_t from = 0, to = 0;
};

// One dim of a copy: extent, input and output strides.
struct CopyDim {
  int64_t size, in, out;
};
// The copy's dims, outermost first, with size-1 dims dropped and neighbours that are contiguous
// on both sides merged (the same elements in the same order, in fewer, longer dims).
std::vector<CopyDim> merge_copy_dims(const Dims& shape, const Dims& in_stride,
                                     const Dims& out_stride);

// Transpose(perm): out[i_0, ..., i_{r-1}] = in[j] with j[perm[k]] = i_k; perm defaults to
// reversed. Output dim k reads input stride perm[k].
std::optional<CopyGeometry> transpose_geometry(const KernelSpec& s);

// Slice(data, starts, ends, axes?, steps?), inputs 1..4 constant, with ONNX's clamping: negative
// starts/ends count from the end; with step > 0 both clamp to [0, d], with step < 0 start clamps
// to [0, d-1] and end to [-1, d-1]; count = ceil((end - start) / step), >= 0.
std::optional<CopyGeometry> slice_geometry(const KernelSpec& s);

// Tile(repeats): out has dims r_k * d_k; viewed as [r_0, d_0, r_1, d_1, ...] it reads the input
// at strides [0, s_0, 0, s_1, ...]. repeats must be a constant giving the output's shape.
std::optional<CopyGeometry> tile_geometry(const KernelSpec& s);

// Expand(input, shape): numpy broadcast of input to the output shape (= broadcast(input.shape,
// shape) when the shape is constant); a size-1 input dim is read with stride 0.
std::optional<CopyGeometry> expand_geometry(const KernelSpec& s);

// Concat(axis): output [outer, sum_k a_k, inner]; input k [outer, a_k, inner] is copied to output
// columns starting at a_0 + ... + a_{k-1}. One copy per input.
std::optional<std::vector<CopyGeometry>> concat_geometry(const KernelSpec& s);

// Split(axis, split): input [outer, sum_k a_k, inner]; output k [outer, a_k, inner] is copied from
// input columns starting at a_0 + ... + a_{k-1}. Sizes come from the output types, checked
// against input 1 (opset 13) or the `split` attribute when either is given. One copy per output.
std::optional<std::vector<CopyGeometry>> split_geometry(const KernelSpec& s);

// Gather(data, indices, axis) and GatherGrad(dY, indices): data viewed as [outer, n, inner]
// around `axis`, `count` indices (int64 or int32, index_type);
//   Gather:     out[o, i, :] = data[o, idx[i] (+ n if negative), :]
//   GatherGrad: dData = 0; dData[o, idx[i] (+ n if negative), :] += dY[o, i, :]
// Indices are the user's data: kernels check them against [-n, n) when they run.
struct GatherGeometry {
  int64_t outer = 1, n = 0, count = 0, inner = 1;
  DType index_type = DType::kInt64;
};
// Gather: output = data.shape[:axis] + indices.shape + data.shape[axis+1:].
std::optional<GatherGeometry> gather_geometry(const KernelSpec& s);
// GatherGrad(dY, Indices) -> dData, axis (default 0), data_shape; float32 dY and dData.
std::optional<GatherGeometry> gather_grad_geometry(const KernelSpec& s);

// Pad(data, pads, constant_value?, axes?) in constant mode (opset 13+ form), pads and axes
// constant, constant_value (if given) a scalar of data's dtype, constant or fed at run time.
// The pads at the beginning of every dim (negative ones crop); nullopt unless the pads give the
// output's shape.
std::optional<Dims> pad_geometry(const KernelSpec& s);

}  // namespace pt
