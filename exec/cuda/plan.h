// exec/cuda/plan.h: host-side helpers the CUDA factories share: a kernel made of one run
// function, and the plans of launch.h (broadcast strides, merged strided copies) filled once
// from the backend-neutral geometry of exec/kernel_geometry.h and exec/movement_geometry.h
// (whose spec checks and shape helpers the factories use as the CPU's do).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "exec/cuda/launch.h"
#include "exec/kernel.h"
#include "exec/kernel_geometry.h"
#include "exec/movement_geometry.h"

namespace pt::cuda {

// A kernel whose run() is `run`; its scratch is scratch bytes of device memory in the arena.
using Args = std::span<const Buffer>;
using RunFn = std::function<void(std::span<const Buffer> in, std::span<const Buffer> out,
                                 void* scratch)>;
std::unique_ptr<Kernel> fn_kernel(RunFn run, size_t scratch_bytes = 0);

// Numpy broadcasting of inputs 0..n-1 (n <= 3) into output 0 (broadcast_geometry); nullopt when
// a shape does not broadcast or the rank exceeds kMaxRank.
std::optional<Broadcast> make_broadcast(const KernelSpec& s, int n);

// A strided copy with size-1 dims dropped and neighbours contiguous on both sides merged
// (merge_copy_dims); nullopt when more than kMaxCopyDims dims remain.
std::optional<StridedCopy> make_strided_copy(const CopyGeometry& g, size_t esize);

// The element size of a dtype the movement kernels carry (1, 2, 4, 8), else 0.
int movable_size(DType t);

}  // namespace pt::cuda
