// exec/cuda/reduce.cu: device code of ReduceSum/ReduceMean (and GlobalAveragePool), float32,
// partial sums in double and every sum in a fixed order (the same bits on every run).
//   innermost input dim reduced: one block per output, its threads striding over the reduced
//     elements (consecutive threads read consecutive addresses), then a block tree;
//   innermost dim kept: one thread per output walking the reduced elements in order
//     (consecutive threads read consecutive addresses).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "exec/cuda/device_util.cuh"
#include "exec/cuda/launch.h"

namespace pt::cuda {
namespace {

// Offset of flat index i (row-major over dims[0..rank)) in elements `strides` apart.
__device__ inline int64_t offset_of(const int64_t* dims, const int64_t* strides, int rank,
                                    int64_t i) {
  int64_t off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    off += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off;
}

__device__ inline int64_t kept_offset(const ReducePlan& p, int64_t o) {
  return offset_of(p.kept_dims, p.kept_strides, p.kept_rank, o);
}

__device__ inline int64_t reduced_offset(const ReducePlan& p, int64_t r) {
  return offset_of(p.reduced_dims, p.reduced_strides, p.reduced_rank, r);
}

__global__ void reduce_block_kernel(ReducePlan p, const float* x, float* y) {
  __shared__ double shared[kThreads];
  for (int64_t o = blockIdx.x; o < p.out_numel; o += gridDim.x) {
    const float* base = x + kept_offset(p, o);
    double s = 0;
    for (int64_t r = threadIdx.x; r < p.count; r += blockDim.x) s += base[reduced_offset(p, r)];
    const double total = block_sum(s, shared);
    if (threadIdx.x == 0) y[o] = static_cast<float>(total * p.scale);
  }
}

__global__ void reduce_thread_kernel(ReducePlan p, const float* x, float* y) {
  PT_GRID_STRIDE(o, p.out_numel) {
    const float* base = x + kept_offset(p, o);
    double s = 0;
    for (int64_t r = 0; r < p.count; ++r) s += base[reduced_offset(p, r)];
    y[o] = static_cast<float>(s * p.scale);
  }
}

}  // namespace

void launch_reduce(const ReducePlan& p, const float* x, float* y, cudaStream_t s) {
  if (p.out_numel == 0) return;
  if (p.inner_reduced) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(p.out_numel, 65535 * 8));
    reduce_block_kernel<<<blocks, kThreads, 0, s>>>(p, x, y);
  } else {
    reduce_thread_kernel<<<grid_for(p.out_numel), kThreads, 0, s>>>(p, x, y);
  }
  PT_CUDA_LAUNCH_CHECK();
}

}  // namespace pt::cuda
