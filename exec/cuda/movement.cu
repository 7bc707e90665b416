// exec/cuda/movement.cu: device code and launchers of the data-movement family (launch.h):
// one strided copy (Transpose, Slice, Expand, Concat, Split, the padding of Conv inputs), Gather
// and its gradient, and constant-mode Pad. Every kernel moves elements of 1, 2, 4 or 8 bytes
// (the strided copy 16 where rows allow) without reading them as numbers, except GatherGrad,
// which adds floats.
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "core/error.h"
#include "exec/cuda/device_util.cuh"
#include "exec/cuda/launch.h"

namespace pt::cuda {
namespace {

// Unsigned element types by size.
template <int kSize> struct Elem;
template <> struct Elem<1> { using type = uint8_t; };
template <> struct Elem<2> { using type = uint16_t; };
template <> struct Elem<4> { using type = uint32_t; };
template <> struct Elem<8> { using type = uint64_t; };
template <> struct Elem<16> { using type = uint4; };

template <class F>
void by_size(int esize, F&& f) {
  switch (esize) {
    case 1: f(Elem<1>{}); break;
    case 2: f(Elem<2>{}); break;
    case 4: f(Elem<4>{}); break;
    case 8: f(Elem<8>{}); break;
    default: PT_CHECK(false, "element size " + std::to_string(esize));
  }
}

// Index arithmetic in Idx (uint32_t below 2^31 elements, as elementwise.cu's offsets); the
// outermost dim needs no division.
template <class Idx, class T>
__global__ void strided_copy_kernel(StridedCopy p, const T* src, T* dst) {
  PT_GRID_STRIDE(i, p.numel) {
    Idx rest = static_cast<Idx>(i);
    int64_t in = p.in_offset, out = p.out_offset;
    for (int d = p.rank - 1; d > 0; --d) {
      const Idx n = static_cast<Idx>(p.dims[d]);
      const Idx q = rest / n, k = rest - q * n;
      rest = q;
      in += static_cast<int64_t>(k) * p.in_stride[d];
      out += static_cast<int64_t>(k) * p.out_stride[d];
    }
    in += static_cast<int64_t>(rest) * p.in_stride[0];
    out += static_cast<int64_t>(rest) * p.out_stride[0];
    dst[out] = src[in];
  }
}

// The same copy in elements of `wide` bytes (8 or 16), when the innermost dim is contiguous on
// both sides and every offset, stride, row and pointer falls on that size: a Transpose that
// keeps its last dim (heads split and merged) then moves 16 bytes per thread.
std::optional<StridedCopy> widened(const StridedCopy& p, const void* src, const void* dst,
                                   int wide) {
  const int inner = p.rank - 1;
  if (p.rank < 1 || p.in_stride[inner] != 1 || p.out_stride[inner] != 1 || wide <= p.esize)
    return std::nullopt;
  const int64_t f = wide / p.esize;
  const auto fits = [&](int64_t v) { return v % f == 0; };
  if (!fits(p.dims[inner]) || !fits(p.in_offset) || !fits(p.out_offset) ||
      reinterpret_cast<uintptr_t>(src) % wide != 0 || reinterpret_cast<uintptr_t>(dst) % wide != 0)
    return std::nullopt;
  for (int d = 0; d < inner; ++d)
    if (!fits(p.in_stride[d]) || !fits(p.out_stride[d])) return std::nullopt;
  StridedCopy w = p;
  w.esize = wide;
  w.numel = p.numel / f;
  w.dims[inner] = p.dims[inner] / f;
  w.in_offset = p.in_offset / f;
  w.out_offset = p.out_offset / f;
  for (int d = 0; d < inner; ++d) {
    w.in_stride[d] = p.in_stride[d] / f;
    w.out_stride[d] = p.out_stride[d] / f;
  }
  return w;
}

template <class T, class I>
__global__ void gather_kernel(int64_t outer, int64_t n, int64_t count, int64_t inner,
                              const T* data, const I* idx, T* out, DeviceFault* fault) {
  PT_GRID_STRIDE(e, outer * count * inner) {
    const int64_t j = e % inner, r = e / inner;
    const int64_t i = r % count, o = r / count;
    int64_t k = static_cast<int64_t>(idx[i]);
    if (k < -n || k >= n) {
      report_fault(fault, k, i);
      out[e] = T(0);
      continue;
    }
    if (k < 0) k += n;
    out[e] = data[(o * n + k) * inner + j];
  }
}

// One thread per (o, column j): zeroes dd[o, :, j], then adds dy[o, i, j] at idx[i] for i in
// order: each element is written by one thread, its rows added in index order (as the CPU's).
template <class I>
__global__ void gather_grad_kernel(int64_t outer, int64_t n, int64_t count, int64_t inner,
                                   const float* dy, const I* idx, float* dd, DeviceFault* fault) {
  PT_GRID_STRIDE(u, outer * inner) {
    const int64_t o = u / inner, j = u % inner;
    float* col = dd + o * n * inner + j;
    for (int64_t k = 0; k < n; ++k) col[k * inner] = 0.f;
    const float* src = dy + o * count * inner + j;
    for (int64_t i = 0; i < count; ++i) {
      int64_t k = static_cast<int64_t>(idx[i]);
      if (k < -n || k >= n) {
        report_fault(fault, k, i);
        continue;
      }
      if (k < 0) k += n;
      col[k * inner] += src[i * inner];
    }
  }
}

template <class T>
__global__ void pad_kernel(PadPlan p, const T* x, const T* value_ptr, T value, T* y) {
  const T v = value_ptr ? *value_ptr : value;
  PT_GRID_STRIDE(i, p.numel) {
    int64_t rest = i, in = 0, in_stride = 1;
    bool inside = true;
    for (int d = p.rank - 1; d >= 0; --d) {
      const int64_t k = rest % p.out_dims[d] - p.begin[d];
      rest /= p.out_dims[d];
      inside = inside && k >= 0 && k < p.in_dims[d];
      in += k * in_stride;
      in_stride *= p.in_dims[d];
    }
    y[i] = inside ? x[in] : v;
  }
}

// Trilu: element (i, j) of each [n, m] matrix kept where j - i >= k (upper) or <= k, else 0.
template <class T>
__global__ void trilu_kernel(int64_t numel, int64_t n, int64_t m, bool upper, int64_t k,
                             const int64_t* k_ptr, const T* x, T* y) {
  const int64_t kk = k_ptr ? *k_ptr : k;
  PT_GRID_STRIDE(e, numel) {
    const int64_t j = e % m, i = (e / m) % n;
    const bool keep = upper ? j - i >= kk : j - i <= kk;
    y[e] = keep ? x[e] : T(0);
  }
}

}  // namespace

void launch_strided_copy(const StridedCopy& p, const void* src, void* dst, cudaStream_t s) {
  if (p.numel == 0) return;
  std::optional<StridedCopy> wide = widened(p, src, dst, 16);
  if (!wide) wide = widened(p, src, dst, 8);
  const StridedCopy& q = wide ? *wide : p;
  const auto run = [&](auto e) {
    using T = typename decltype(e)::type;
    const auto* from = static_cast<const T*>(src);
    auto* to = static_cast<T*>(dst);
    if (q.numel < (int64_t{1} << 31))
      strided_copy_kernel<uint32_t, T><<<grid_for(q.numel), kThreads, 0, s>>>(q, from, to);
    else
      strided_copy_kernel<int64_t, T><<<grid_for(q.numel), kThreads, 0, s>>>(q, from, to);
    PT_CUDA_LAUNCH_CHECK();
  };
  if (q.esize == 16) run(Elem<16>{});
  else by_size(q.esize, run);
}

void launch_gather(DType index, int esize, int64_t outer, int64_t n, int64_t count, int64_t inner,
                   const void* data, const void* idx, void* out, DeviceFault* fault,
                   cudaStream_t s) {
  const int64_t total = outer * count * inner;
  if (total == 0) return;
  by_size(esize, [&](auto e) {
    using T = typename decltype(e)::type;
    if (index == DType::kInt64) {
      gather_kernel<T, int64_t><<<grid_for(total), kThreads, 0, s>>>(
          outer, n, count, inner, static_cast<const T*>(data), static_cast<const int64_t*>(idx),
          static_cast<T*>(out), fault);
    } else {
      gather_kernel<T, int32_t><<<grid_for(total), kThreads, 0, s>>>(
          outer, n, count, inner, static_cast<const T*>(data), static_cast<const int32_t*>(idx),
          static_cast<T*>(out), fault);
    }
    PT_CUDA_LAUNCH_CHECK();
  });
}

void launch_gather_grad(DType index, int64_t outer, int64_t n, int64_t count, int64_t inner,
                        const float* dy, const void* idx, float* dd, DeviceFault* fault,
                        cudaStream_t s) {
  const int64_t units = outer * inner;
  if (units == 0) return;
  if (index == DType::kInt64) {
    gather_grad_kernel<int64_t><<<grid_for(units), kThreads, 0, s>>>(
        outer, n, count, inner, dy, static_cast<const int64_t*>(idx), dd, fault);
  } else {
    gather_grad_kernel<int32_t><<<grid_for(units), kThreads, 0, s>>>(
        outer, n, count, inner, dy, static_cast<const int32_t*>(idx), dd, fault);
  }
  PT_CUDA_LAUNCH_CHECK();
}

void launch_trilu(int esize, int64_t matrices, int64_t n, int64_t m, bool upper, int64_t k,
                  const int64_t* k_ptr, const void* x, void* y, cudaStream_t s) {
  const int64_t numel = matrices * n * m;
  if (numel == 0) return;
  by_size(esize, [&](auto e) {
    using T = typename decltype(e)::type;
    trilu_kernel<T><<<grid_for(numel), kThreads, 0, s>>>(numel, n, m, upper, k, k_ptr,
                                                         static_cast<const T*>(x), static_cast<T*>(y));
    PT_CUDA_LAUNCH_CHECK();
  });
}

void launch_pad(const PadPlan& p, const void* x, const void* value_ptr, uint64_t value_bits,
                void* y, cudaStream_t s) {
  if (p.numel == 0) return;
  by_size(p.esize, [&](auto e) {
    using T = typename decltype(e)::type;
    pad_kernel<T><<<grid_for(p.numel), kThreads, 0, s>>>(
        p, static_cast<const T*>(x), static_cast<const T*>(value_ptr), static_cast<T>(value_bits),
        static_cast<T*>(y));
    PT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace pt::cuda
