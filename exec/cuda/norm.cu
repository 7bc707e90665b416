// exec/cuda/norm.cu: device code of LayerNormalization, LayerNormGrad and BatchNormalization's
// running statistics (cuDNN computes the batch statistics; see nn.cc). One block per row for
// the row statistics (two passes: mean, then squared deviations, as the CPU's), one thread per
// column for the sums over rows (dScale, dBias); partial sums in double, fixed order.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "exec/cuda/device_util.cuh"
#include "exec/cuda/launch.h"

namespace pt::cuda {
namespace {

__global__ void layer_norm_kernel(int64_t outer, int64_t inner, float eps, const float* x,
                                  const float* scale, const float* bias, float* y, float* mean_out,
                                  float* inv_std_out) {
  __shared__ double shared[kThreads];
  for (int64_t r = blockIdx.x; r < outer; r += gridDim.x) {
    const float* row = x + r * inner;
    double s = 0;
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) s += row[j];
    const float mean = static_cast<float>(block_sum(s, shared) / double(inner));
    double dev = 0;
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
      const double d = double(row[j] - mean);
      dev += d * d;
    }
    const float var = static_cast<float>(block_sum(dev, shared) / double(inner));
    const float inv_std = 1.f / sqrtf(var + eps);
    float* out = y + r * inner;
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x)
      out[j] = (row[j] - mean) * inv_std * scale[j] + (bias ? bias[j] : 0.f);
    if (threadIdx.x == 0) {
      if (mean_out) mean_out[r] = mean;
      if (inv_std_out) inv_std_out[r] = inv_std;
    }
  }
}

// dX per row: xhat = (x - mean) * istd, g = dy * scale,
//   dX = istd * (g - mean_A(g) - xhat * mean_A(g * xhat)).
__global__ void layer_norm_dx_kernel(int64_t outer, int64_t inner, const float* dy,
                                     const float* x, const float* scale, const float* mean,
                                     const float* inv_std, float* dx) {
  __shared__ double shared[kThreads];
  for (int64_t r = blockIdx.x; r < outer; r += gridDim.x) {
    const float* d = dy + r * inner;
    const float* xr = x + r * inner;
    const float m = mean[r], is = inv_std[r];
    double sg = 0, sgx = 0;
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
      const float g = d[j] * scale[j];
      sg += g;
      sgx += double(g) * double((xr[j] - m) * is);
    }
    const float mg = static_cast<float>(block_sum(sg, shared) / double(inner));
    const float mgx = static_cast<float>(block_sum(sgx, shared) / double(inner));
    float* out = dx + r * inner;
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
      const float xhat = (xr[j] - m) * is;
      out[j] = is * (d[j] * scale[j] - mg - xhat * mgx);
    }
  }
}

// dScale[j] = sum_r dy * xhat, dBias[j] = sum_r dy, rows in order.
__global__ void layer_norm_dparams_kernel(int64_t outer, int64_t inner, const float* dy,
                                          const float* x, const float* mean, const float* inv_std,
                                          float* dscale, float* dbias) {
  PT_GRID_STRIDE(j, inner) {
    double ss = 0, sb = 0;
    for (int64_t r = 0; r < outer; ++r) {
      const float d = dy[r * inner + j];
      ss += double(d) * double((x[r * inner + j] - mean[r]) * inv_std[r]);
      sb += d;
    }
    if (dscale) dscale[j] = static_cast<float>(ss);
    if (dbias) dbias[j] = static_cast<float>(sb);
  }
}

__global__ void batch_norm_running_kernel(int64_t channels, int64_t count, float momentum,
                                          const float* in_mean, const float* in_var,
                                          const float* batch_mean, const float* unbiased_var,
                                          float* out_mean, float* out_var) {
  PT_GRID_STRIDE(c, channels) {
    if (out_mean) out_mean[c] = in_mean[c] * momentum + batch_mean[c] * (1.f - momentum);
    if (out_var) {
      const float biased =
          count > 1 ? static_cast<float>(double(unbiased_var[c]) * double(count - 1) / double(count))
                    : 0.f;
      out_var[c] = in_var[c] * momentum + biased * (1.f - momentum);
    }
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 65535 * 8));
}

}  // namespace

void launch_layer_norm(int64_t outer, int64_t inner, float epsilon, const float* x,
                       const float* scale, const float* bias, float* y, float* mean,
                       float* inv_std, cudaStream_t s) {
  if (outer == 0) return;
  layer_norm_kernel<<<row_blocks(outer), kThreads, 0, s>>>(outer, inner, epsilon, x, scale, bias,
                                                           y, mean, inv_std);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_layer_norm_grad(int64_t outer, int64_t inner, const float* dy, const float* x,
                            const float* scale, const float* mean, const float* inv_std,
                            float* dx, float* dscale, float* dbias, cudaStream_t s) {
  if (dx && outer > 0) {
    layer_norm_dx_kernel<<<row_blocks(outer), kThreads, 0, s>>>(outer, inner, dy, x, scale, mean,
                                                                inv_std, dx);
    PT_CUDA_LAUNCH_CHECK();
  }
  if ((dscale || dbias) && inner > 0) {
    layer_norm_dparams_kernel<<<grid_for(inner), kThreads, 0, s>>>(outer, inner, dy, x, mean,
                                                                   inv_std, dscale, dbias);
    PT_CUDA_LAUNCH_CHECK();
  }
}

void launch_batch_norm_running(int64_t channels, int64_t count, float momentum,
                               const float* in_mean, const float* in_var,
                               const float* batch_mean, const float* unbiased_var,
                               float* out_mean, float* out_var, cudaStream_t s) {
  if (channels == 0 || (!out_mean && !out_var)) return;
  batch_norm_running_kernel<<<grid_for(channels), kThreads, 0, s>>>(
      channels, count, momentum, in_mean, in_var, batch_mean, unbiased_var, out_mean, out_var);
  PT_CUDA_LAUNCH_CHECK();
}

}  // namespace pt::cuda
