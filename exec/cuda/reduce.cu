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

__device__ inline int64_t kept_offset(const ReducePlan& p, int64_t o) {
  int64_t off = 0;
  for (int d = p.kept_rank - 1; d >= 0; --d) {
    off += (o % p.kept_dims[d]) * p.kept_strides[d];
    o /= p.kept_dims[d];
  }
  return off;
}

__device__ inline int64_t reduced_offset(const ReducePlan& p, int64_t r) {
  int64_t off = 0;
  for (int d = p.reduced_rank - 1; d >= 0; --d) {
    off += (r % p.reduced_dims[d]) * p.reduced_strides[d];
    r /= p.reduced_dims[d];
  }
  return off;
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
