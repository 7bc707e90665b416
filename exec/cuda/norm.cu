// exec/cuda/norm.cu: device code of LayerNormalization, LayerNormGrad and BatchNormalization's
// running statistics (cuDNN computes the batch statistics; see nn.cc). One block per row for
// the row statistics (two passes: mean, then squared deviations, as the CPU's), one thread per
// column and block of rows for the sums over rows (dScale, dBias; blocks as sum_splits says,
// then the blocks' partials in order); partial sums in double, fixed order.
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

// Block b of the rows: part_scale[b * inner + j] = sum_r dy * xhat, part_bias[...] = sum_r dy,
// rows in order (one block of all rows: straight into dscale and dbias as float).
__global__ void layer_norm_dparams_kernel(int64_t outer, int64_t inner, int64_t splits,
                                          const float* dy, const float* x, const float* mean,
                                          const float* inv_std, double* part_scale,
                                          double* part_bias, float* dscale, float* dbias) {
  const int64_t chunk = (outer + splits - 1) / splits;
  PT_GRID_STRIDE(i, inner * splits) {
    const int64_t j = i % inner, b = i / inner, end = min(outer, (b + 1) * chunk);
    double ss = 0, sb = 0;
    for (int64_t r = b * chunk; r < end; ++r) {
      const float d = dy[r * inner + j];
      ss += double(d) * double((x[r * inner + j] - mean[r]) * inv_std[r]);
      sb += d;
    }
    if (splits == 1) {
      if (dscale) dscale[j] = static_cast<float>(ss);
      if (dbias) dbias[j] = static_cast<float>(sb);
    } else {
      part_scale[i] = ss;
      part_bias[i] = sb;
    }
  }
}

// The blocks' partials of column j, in block order.
__global__ void layer_norm_dparams_sum_kernel(int64_t inner, int64_t splits, const double* part_scale,
                                              const double* part_bias, float* dscale, float* dbias) {
  PT_GRID_STRIDE(j, inner) {
    double ss = 0, sb = 0;
    for (int64_t b = 0; b < splits; ++b) {
      ss += part_scale[b * inner + j];
      sb += part_bias[b * inner + j];
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

size_t layer_norm_grad_scratch(int64_t outer, int64_t inner) {
  const int64_t splits = sum_splits(outer, inner);
  return splits > 1 ? 2 * sizeof(double) * size_t(splits * inner) : 0;
}

void launch_layer_norm_grad(int64_t outer, int64_t inner, const float* dy, const float* x,
                            const float* scale, const float* mean, const float* inv_std,
                            float* dx, float* dscale, float* dbias, void* scratch, cudaStream_t s) {
  if (dx && outer > 0) {
    layer_norm_dx_kernel<<<row_blocks(outer), kThreads, 0, s>>>(outer, inner, dy, x, scale, mean,
                                                                inv_std, dx);
    PT_CUDA_LAUNCH_CHECK();
  }
  if ((dscale || dbias) && inner > 0) {
    const int64_t splits = sum_splits(outer, inner);
    auto* part_scale = static_cast<double*>(scratch);
    double* part_bias = splits > 1 ? part_scale + splits * inner : nullptr;
    layer_norm_dparams_kernel<<<grid_for(inner * splits), kThreads, 0, s>>>(
        outer, inner, splits, dy, x, mean, inv_std, part_scale, part_bias, dscale, dbias);
    PT_CUDA_LAUNCH_CHECK();
    if (splits > 1) {
      layer_norm_dparams_sum_kernel<<<grid_for(inner), kThreads, 0, s>>>(inner, splits, part_scale,
                                                                        part_bias, dscale, dbias);
      PT_CUDA_LAUNCH_CHECK();
    }
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
