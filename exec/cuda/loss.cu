// exec/cuda/loss.cu: device code of the fused loss of the pipetrain domain
// (core/pipetrain_ops.h): SoftmaxCrossEntropy and its gradient on Logits seen as rows of C
// classes, one block per row (row max, then the sum of exp(x - max) in double). The loss adds the
// row losses in a fixed order in one block: the same bits on every run.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "core/error.h"
#include "exec/cuda/device_util.cuh"
#include "exec/cuda/launch.h"

namespace pt::cuda {
namespace {

// m = max of the row, returns sum_j exp(x[j] - m) (every thread gets both).
__device__ double row_exp_sum(const float* row, int64_t c, float* m_out, float* fshared,
                              double* dshared) {
  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_max(m, fshared);
  double s = 0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += exp(double(row[j] - m));
  *m_out = m;
  return block_sum(s, dshared);
}

// True when the row's target is valid or ignored; a bad one is reported.
__device__ bool check_target(int64_t t, int64_t row, int64_t classes, int64_t ignore,
                             DeviceFault* fault) {
  if (t == ignore || (t >= 0 && t < classes)) return true;
  if (threadIdx.x == 0) report_fault(fault, t, row);
  return false;
}

__global__ void sce_rows_kernel(int64_t rows, int64_t classes, int64_t ignore, const float* x,
                                const int64_t* target, double* row_loss, DeviceFault* fault) {
  __shared__ float fshared[kThreads];
  __shared__ double dshared[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = target[r];
    if (!check_target(t, r, classes, ignore, fault) || t == ignore) {
      if (threadIdx.x == 0) row_loss[r] = 0;
      continue;
    }
    const float* row = x + r * classes;
    float m;
    const double s = row_exp_sum(row, classes, &m, fshared, dshared);
    if (threadIdx.x == 0) row_loss[r] = double(m) + log(s) - double(row[t]);
  }
}

__global__ void sce_total_kernel(int64_t rows, const double* row_loss, const float* scale,
                                 float* loss) {
  __shared__ double shared[kThreads];
  double s = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += row_loss[r];
  const double total = block_sum(s, shared);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(double(scale[0]) * total);
}

__global__ void sce_grad_kernel(int64_t rows, int64_t classes, int64_t ignore, const float* dloss,
                                const float* x, const int64_t* target, const float* scale,
                                float* dx, DeviceFault* fault) {
  __shared__ float fshared[kThreads];
  __shared__ double dshared[kThreads];
  const float k = dloss[0] * scale[0];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = target[r];
    float* d = dx + r * classes;
    if (!check_target(t, r, classes, ignore, fault) || t == ignore) {
      for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) d[j] = 0.f;
      continue;
    }
    const float* row = x + r * classes;
    float m;
    const double s = row_exp_sum(row, classes, &m, fshared, dshared);
    const double f = double(k) / s;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
      d[j] = static_cast<float>(exp(double(row[j] - m)) * f - (j == t ? double(k) : 0.0));
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 65535 * 8));
}

}  // namespace

void launch_softmax_cross_entropy(int64_t rows, int64_t classes, int64_t ignore_index,
                                  const float* logits, const int64_t* target, const float* scale,
                                  double* row_loss, float* loss, DeviceFault* fault,
                                  cudaStream_t s) {
  if (rows > 0) {
    sce_rows_kernel<<<row_blocks(rows), kThreads, 0, s>>>(rows, classes, ignore_index, logits,
                                                          target, row_loss, fault);
    PT_CUDA_LAUNCH_CHECK();
  }
  sce_total_kernel<<<1, kThreads, 0, s>>>(rows, row_loss, scale, loss);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_softmax_cross_entropy_grad(int64_t rows, int64_t classes, int64_t ignore_index,
                                       const float* dloss, const float* logits,
                                       const int64_t* target, const float* scale, float* dlogits,
                                       DeviceFault* fault, cudaStream_t s) {
  if (rows == 0) return;
  sce_grad_kernel<<<row_blocks(rows), kThreads, 0, s>>>(rows, classes, ignore_index, dloss, logits,
                                                        target, scale, dlogits, fault);
  PT_CUDA_LAUNCH_CHECK();
}

}  // namespace pt::cuda
