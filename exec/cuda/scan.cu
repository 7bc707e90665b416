// exec/cuda/scan.cu: device code of CumSum, float32: x viewed as [outer, n, inner] around the
// summed axis, one thread per (outer, inner) line adding its n elements in order, so every run
// gives the CPU's bits (consecutive threads read consecutive addresses when inner > 1).
#include <cuda_runtime.h>

#include <cstdint>

#include "exec/cuda/device_util.cuh"
#include "exec/cuda/launch.h"

namespace pt::cuda {
namespace {

__global__ void cumsum_kernel(int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse,
                              const float* x, float* y) {
  PT_GRID_STRIDE(line, outer * inner) {
    const int64_t base = (line / inner) * n * inner + line % inner;
    float sum = 0.f;
    for (int64_t step = 0; step < n; ++step) {
      const int64_t at = base + (reverse ? n - 1 - step : step) * inner;
      const float v = x[at];
      if (exclusive) y[at] = sum;
      sum += v;
      if (!exclusive) y[at] = sum;
    }
  }
}

}  // namespace

void launch_cumsum(int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse,
                   const float* x, float* y, cudaStream_t s) {
  if (outer * inner == 0 || n == 0) return;
  cumsum_kernel<<<grid_for(outer * inner), kThreads, 0, s>>>(outer, n, inner, exclusive, reverse, x, y);
  PT_CUDA_LAUNCH_CHECK();
}

}  // namespace pt::cuda
