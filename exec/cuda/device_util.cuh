// exec/cuda/device_util.cuh: helpers the .cu files share: launch sizes for grid-stride loops and
// a block-wide sum in a fixed order (so every result is the same from run to run).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "exec/cuda/cuda_check.h"
#include "exec/cuda/cuda_context.h"

namespace pt::cuda {

constexpr int kThreads = 256;

// Blocks for n elements in a grid-stride loop: enough to fill the device, at most 65535 * 8.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{65535} * 8));
}

#define PT_GRID_STRIDE(i, n)                                                                 \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);    \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Sum of v over the block (blockDim.x == kThreads), returned to every thread. A fixed tree:
// the same order on every run. `shared` holds kThreads values.
template <class T>
__device__ T block_sum(T v, T* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const T total = shared[0];
  __syncthreads();
  return total;
}

// Maximum of v over the block, the same way.
__device__ inline float block_max(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s)
      shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const float m = shared[0];
  __syncthreads();
  return m;
}

// Records a fault; the first writer's value and position stay.
__device__ inline void report_fault(DeviceFault* f, long long value, long long at) {
  if (atomicExch(&f->flag, 1) == 0) {
    f->value = value;
    f->at = at;
  }
}

}  // namespace pt::cuda
