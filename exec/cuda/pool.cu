// exec/cuda/pool.cu: device code of the window pooling kernels for the geometries cuDNN does not
// take (asymmetric pads, ceil_mode, dilations) and of both pooling gradients. Planes of up to
// three spatial dims, one thread per output element (forward) or per dX cell (backward: each
// cell gathers the windows holding it, in output order: no atomics, the same bits every run,
// and for MaxPoolGrad the same additions in the same order as the CPU kernel).
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "core/error.h"
#include "exec/cuda/device_util.cuh"
#include "exec/cuda/launch.h"

namespace pt::cuda {
namespace {

// Taps [lo, hi) of window o along dim d that fall inside the input, and the window's start.
struct Taps {
  int64_t start, lo, hi;
};

__device__ inline Taps taps(const PoolGeom& g, int d, int64_t o) {
  const int64_t s = o * g.stride[d] - g.pad[d], dil = g.dilation[d];
  Taps t{s, 0, 0};
  t.lo = s >= 0 ? 0 : (-s + dil - 1) / dil;
  t.hi = g.in[d] > s ? min(g.kernel[d], (g.in[d] - s + dil - 1) / dil) : 0;
  return t;
}

// Offset in the plane of the first maximum of window (o0, o1, o2), or -1 when it is empty.
__device__ int64_t first_max(const PoolGeom& g, const float* x, int64_t o0, int64_t o1,
                             int64_t o2) {
  const Taps a = taps(g, 0, o0), b = taps(g, 1, o1), c = taps(g, 2, o2);
  if (a.lo >= a.hi || b.lo >= b.hi || c.lo >= c.hi) return -1;
  int64_t best_at = -1;
  float best = 0.f;
  for (int64_t i = a.lo; i < a.hi; ++i)
    for (int64_t j = b.lo; j < b.hi; ++j) {
      const int64_t row = ((a.start + i * g.dilation[0]) * g.in[1] + b.start + j * g.dilation[1]) *
                          g.in[2];
      for (int64_t k = c.lo; k < c.hi; ++k) {
        const int64_t at = row + c.start + k * g.dilation[2];
        if (best_at < 0 || x[at] > best) {
          best = x[at];
          best_at = at;
        }
      }
    }
  return best_at;
}

__device__ inline int64_t plane_in(const PoolGeom& g) { return g.in[0] * g.in[1] * g.in[2]; }
__device__ inline int64_t plane_out(const PoolGeom& g) { return g.out[0] * g.out[1] * g.out[2]; }

__global__ void max_pool_kernel(PoolGeom g, const float* x, float* y) {
  const int64_t po = plane_out(g), pi = plane_in(g);
  PT_GRID_STRIDE(e, g.planes * po) {
    const int64_t p = e / po, o = e % po;
    const int64_t o2 = o % g.out[2], o1 = (o / g.out[2]) % g.out[1], o0 = o / (g.out[1] * g.out[2]);
    const float* xp = x + p * pi;
    const int64_t at = first_max(g, xp, o0, o1, o2);
    y[e] = at >= 0 ? xp[at] : -FLT_MAX;
  }
}

__device__ inline double divisor(const PoolGeom& g, bool include_pad, const Taps& a,
                                 const Taps& b, const Taps& c) {
  if (include_pad) return double(g.kernel[0] * g.kernel[1] * g.kernel[2]);
  return double((a.hi - a.lo) * (b.hi - b.lo) * (c.hi - c.lo));
}

__global__ void average_pool_kernel(PoolGeom g, bool include_pad, const float* x, float* y) {
  const int64_t po = plane_out(g), pi = plane_in(g);
  PT_GRID_STRIDE(e, g.planes * po) {
    const int64_t p = e / po, o = e % po;
    const int64_t o2 = o % g.out[2], o1 = (o / g.out[2]) % g.out[1], o0 = o / (g.out[1] * g.out[2]);
    const Taps a = taps(g, 0, o0), b = taps(g, 1, o1), c = taps(g, 2, o2);
    const float* xp = x + p * pi;
    double s = 0;
    for (int64_t i = a.lo; i < a.hi; ++i)
      for (int64_t j = b.lo; j < b.hi; ++j)
        for (int64_t k = c.lo; k < c.hi; ++k)
          s += xp[((a.start + i * g.dilation[0]) * g.in[1] + b.start + j * g.dilation[1]) * g.in[2] +
                  c.start + k * g.dilation[2]];
    const double n = divisor(g, include_pad, a, b, c);
    y[e] = n > 0 ? static_cast<float>(s / n) : 0.f;
  }
}

// Windows o along dim d holding input index i, ascending: o = (i + pad - k * dilation) / stride
// for k = kernel-1 down to 0, where that divides and lies in [0, out). Calls f(o).
template <class F>
__device__ inline void windows_holding(const PoolGeom& g, int d, int64_t i, F&& f) {
  for (int64_t k = g.kernel[d] - 1; k >= 0; --k) {
    const int64_t num = i + g.pad[d] - k * g.dilation[d];
    if (num < 0 || num % g.stride[d] != 0) continue;
    const int64_t o = num / g.stride[d];
    if (o < g.out[d]) f(o);
  }
}

__global__ void max_pool_grad_kernel(PoolGeom g, const float* dy, const float* x, float* dx) {
  const int64_t po = plane_out(g), pi = plane_in(g);
  PT_GRID_STRIDE(e, g.planes * pi) {
    const int64_t p = e / pi, cell = e % pi;
    const int64_t i2 = cell % g.in[2], i1 = (cell / g.in[2]) % g.in[1], i0 = cell / (g.in[1] * g.in[2]);
    const float* xp = x + p * pi;
    const float* dyp = dy + p * po;
    float acc = 0.f;
    windows_holding(g, 0, i0, [&](int64_t o0) {
      windows_holding(g, 1, i1, [&](int64_t o1) {
        windows_holding(g, 2, i2, [&](int64_t o2) {
          if (first_max(g, xp, o0, o1, o2) == cell) acc += dyp[(o0 * g.out[1] + o1) * g.out[2] + o2];
        });
      });
    });
    dx[e] = acc;
  }
}

__global__ void average_pool_grad_kernel(PoolGeom g, bool include_pad, const float* dy,
                                         float* dx) {
  const int64_t po = plane_out(g), pi = plane_in(g);
  PT_GRID_STRIDE(e, g.planes * pi) {
    const int64_t p = e / pi, cell = e % pi;
    const int64_t i2 = cell % g.in[2], i1 = (cell / g.in[2]) % g.in[1], i0 = cell / (g.in[1] * g.in[2]);
    const float* dyp = dy + p * po;
    double acc = 0;
    windows_holding(g, 0, i0, [&](int64_t o0) {
      windows_holding(g, 1, i1, [&](int64_t o1) {
        windows_holding(g, 2, i2, [&](int64_t o2) {
          const double n = divisor(g, include_pad, taps(g, 0, o0), taps(g, 1, o1), taps(g, 2, o2));
          if (n > 0) acc += dyp[(o0 * g.out[1] + o1) * g.out[2] + o2] / n;
        });
      });
    });
    dx[e] = static_cast<float>(acc);
  }
}

}  // namespace

void launch_max_pool(const PoolGeom& g, const float* x, float* y, cudaStream_t s) {
  const int64_t n = g.planes * g.out[0] * g.out[1] * g.out[2];
  if (n == 0) return;
  max_pool_kernel<<<grid_for(n), kThreads, 0, s>>>(g, x, y);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_average_pool(const PoolGeom& g, bool include_pad, const float* x, float* y,
                         cudaStream_t s) {
  const int64_t n = g.planes * g.out[0] * g.out[1] * g.out[2];
  if (n == 0) return;
  average_pool_kernel<<<grid_for(n), kThreads, 0, s>>>(g, include_pad, x, y);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_max_pool_grad(const PoolGeom& g, const float* dy, const float* x, float* dx,
                          cudaStream_t s) {
  const int64_t n = g.planes * g.in[0] * g.in[1] * g.in[2];
  if (n == 0) return;
  max_pool_grad_kernel<<<grid_for(n), kThreads, 0, s>>>(g, dy, x, dx);
  PT_CUDA_LAUNCH_CHECK();
}

void launch_average_pool_grad(const PoolGeom& g, bool include_pad, const float* dy, float* dx,
                              cudaStream_t s) {
  const int64_t n = g.planes * g.in[0] * g.in[1] * g.in[2];
  if (n == 0) return;
  average_pool_grad_kernel<<<grid_for(n), kThreads, 0, s>>>(g, include_pad, dy, dx);
  PT_CUDA_LAUNCH_CHECK();
}

}  // namespace pt::cuda
