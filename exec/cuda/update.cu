// exec/cuda/update.cu: device code and launchers of the parameter updates (launch.h): the
// gradient norm's sums of squares and the SGD and AdamW rules of exec/parameter_update.h (the
// element functions the host loops of train/optimizer.cc call too), one thread per element in
// a grid-stride loop.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "exec/cuda/device_util.cuh"
#include "exec/cuda/launch.h"

namespace pt::cuda {
namespace {

// Block b: its chunk of x, each thread a fixed stride of it, then the block's fixed tree.
__global__ void squares_partial_kernel(const float* x, int64_t n, double* partial) {
  __shared__ double shared[kThreads];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSquaresChunk;
  const int64_t end = begin + kSquaresChunk < n ? begin + kSquaresChunk : n;
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) s += static_cast<double>(x[i]) * x[i];
  const double total = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// One block: thread t adds partials t, t + kThreads, ... in order, then the fixed tree.
__global__ void squares_total_kernel(const double* partial, int64_t blocks, double* out) {
  __shared__ double shared[kThreads];
  double s = 0;
  for (int64_t i = threadIdx.x; i < blocks; i += kThreads) s += partial[i];
  const double total = block_sum(s, shared);
  if (threadIdx.x == 0) *out = total;
}

__global__ void sgd_kernel(float* p, const float* g, float* b, int64_t n, SgdScalars s) {
  PT_GRID_STRIDE(i, n) {
    float unused = 0;
    p[i] = sgd_element(p[i], g[i], s.momentum ? b[i] : unused, s);
  }
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamWScalars s) {
  PT_GRID_STRIDE(i, n) p[i] = adamw_element(p[i], g[i], m[i], v[i], s);
}

}  // namespace

void launch_sum_squares(const float* x, int64_t n, double* partial, double* out, cudaStream_t stream) {
  const int64_t blocks = squares_blocks(n);
  if (blocks == 0) {
    PT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  squares_partial_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n, partial);
  PT_CUDA_LAUNCH_CHECK();
  squares_total_kernel<<<1, kThreads, 0, stream>>>(partial, blocks, out);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_sgd_update(float* p, const float* g, float* b, int64_t n, const SgdScalars& s,
                       cudaStream_t stream) {
  if (n == 0) return;
  sgd_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, g, b, n, s);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                         const AdamWScalars& s, cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, g, m, v, n, s);
  PT_CUDA_LAUNCH_CHECK();
}

}  // namespace pt::cuda
