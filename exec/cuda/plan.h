// exec/cuda/plan.h: host-side helpers the CUDA factories share: a kernel made of one run
// function, spec checks, constant inputs read at creation, and the plans of launch.h
// (broadcast strides, merged strided copies) computed once from shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "exec/cuda/launch.h"
#include "exec/kernel.h"

namespace pt::cuda {

using Dims = std::vector<int64_t>;

// A kernel whose run() is `run`; its scratch is scratch bytes of device memory in the arena.
using Args = std::span<const Buffer>;
using RunFn = std::function<void(std::span<const Buffer> in, std::span<const Buffer> out,
                                 void* scratch)>;
std::unique_ptr<Kernel> fn_kernel(RunFn run, size_t scratch_bytes = 0);

// Inputs 0..inputs-1 and output 0 present.
bool has_io(const KernelSpec& s, size_t inputs);
// Output k present.
bool wanted(const KernelSpec& s, size_t k);
// Every present input and output is float32, and output 0 is present.
bool float_io(const KernelSpec& s);

int64_t product(const Dims& v, size_t begin, size_t end);
// axis in [-rank, rank) -> [0, rank); -1 when out of range.
int64_t normalize_axis(int64_t axis, size_t rank);
Dims strides_of(const Dims& shape);
// Integer data (int64 or int32) of constant input i; nullopt when not constant.
std::optional<Dims> constant_ints(const KernelSpec& s, size_t i);
// Value of input k when it is a constant scalar of type T.
template <class T>
std::optional<T> constant_scalar(const KernelSpec& s, size_t k) {
  const Tensor* c = s.has_input(k) ? s.constant(k) : nullptr;
  if (!c || c->type.dtype != dtype_of<T>() || c->type.numel() != 1) return std::nullopt;
  return c->as<T>()[0];
}

// Numpy broadcasting of inputs 0..n-1 (n <= 3) into output 0, dims merged where every operand
// walks them alike; nullopt when a shape does not broadcast or the rank exceeds kMaxRank.
std::optional<Broadcast> make_broadcast(const KernelSpec& s, int n);

// A strided copy with size-1 dims dropped and neighbours contiguous on both sides merged;
// nullopt when more than kMaxCopyDims dims remain.
std::optional<StridedCopy> make_strided_copy(const Dims& shape, const Dims& in_stride,
                                             const Dims& out_stride, int64_t in_offset,
                                             int64_t out_offset, size_t esize);

// The element size of a dtype the movement kernels carry (1, 2, 4, 8), else 0.
int movable_size(DType t);

}  // namespace pt::cuda
