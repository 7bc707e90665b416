// exec/cuda/reduce.cu: device code of ReduceSum/ReduceMean (and GlobalAveragePool), float32,
// partial sums in double and every sum in a fixed order (the same bits on every run).
//   innermost input dim reduced: one block per output, its threads striding over the reduced
//     elements (consecutive threads read consecutive addresses), then a block tree;
//   innermost dim kept: one thread per output walking the reduced elements in order
//     (consecutive threads read consecutive addresses); with few outputs over many reduced
//     elements the walk is split in blocks of elements (sum_splits), each block's partial kept
//     in double, then the partials summed in order.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

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

// The sum of reduced elements [begin, end) for output o, in order.
__device__ inline double sum_range(const ReducePlan& p, const float* x, int64_t o, int64_t begin,
                                   int64_t end) {
  const float* base = x + kept_offset(p, o);
  double s = 0;
  if (p.reduced_rank == 1) {  // one reduced dim: a plain stride
    const int64_t stride = p.reduced_strides[0];
    for (int64_t r = begin; r < end; ++r) s += base[r * stride];
  } else {
    for (int64_t r = begin; r < end; ++r) s += base[reduced_offset(p, r)];
  }
  return s;
}

__global__ void reduce_thread_kernel(ReducePlan p, const float* x, float* y) {
  PT_GRID_STRIDE(o, p.out_numel) y[o] = static_cast<float>(sum_range(p, x, o, 0, p.count) * p.scale);
}

// Thread (block b, output o) sums block b of the reduced elements into part[b * out_numel + o].
__global__ void reduce_split_kernel(ReducePlan p, const float* x, double* part) {
  const int64_t chunk = (p.count + p.splits - 1) / p.splits;
  PT_GRID_STRIDE(i, p.out_numel * p.splits) {
    const int64_t o = i % p.out_numel, b = i / p.out_numel;
    part[i] = sum_range(p, x, o, b * chunk, min(p.count, (b + 1) * chunk));
  }
}

// y[o] = scale * the partials of output o, in block order.
__global__ void sum_parts_kernel(int64_t outputs, int64_t splits, float scale, const double* part, float* y) {
  PT_GRID_STRIDE(o, outputs) {
    double s = 0;
    for (int64_t b = 0; b < splits; ++b) s += part[b * outputs + o];
    y[o] = static_cast<float>(s * scale);
  }
}

// ReduceMax, ReduceMin, ReduceProd: y[o] = op over the count elements of output o, in order,
// from op's identity (as the CPU's WalkReduce). NaN wins max and min.
// Op's identity, on the host (numeric_limits is host code).
template <class T>
T walk_first(ReduceWalk op) {
  if (op == ReduceWalk::kProd) return T(1);
  if constexpr (std::is_floating_point_v<T>)
    return op == ReduceWalk::kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  else return op == ReduceWalk::kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
}

template <class T>
__global__ void reduce_walk_kernel(ReduceWalk op, ReducePlan p, T first, const T* x, T* y) {
  PT_GRID_STRIDE(o, p.out_numel) {
    const int64_t base = kept_offset(p, o);
    T acc = first;
    for (int64_t r = 0; r < p.count; ++r) {
      const T v = x[base + reduced_offset(p, r)];
      if (op == ReduceWalk::kProd) acc = T(acc * v);
      else if (op == ReduceWalk::kMax) acc = acc != acc || acc > v ? acc : v;
      else acc = acc != acc || acc < v ? acc : v;
    }
    y[o] = acc;
  }
}

}  // namespace

int64_t sum_splits(int64_t rows, int64_t outputs) {
  constexpr int64_t kFill = 132 * 2048;  // threads resident on an H100/H200 (132 SMs x 2048)
  constexpr int64_t kLeast = 32;         // rows a block sums at the least
  if (outputs <= 0 || rows < 2 * kLeast || outputs >= kFill) return 1;
  return std::clamp<int64_t>(std::min((kFill + outputs - 1) / outputs, rows / kLeast), 1, 1024);
}

bool reduce_walk_supported(ReduceWalk op, DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kInt32 || t == DType::kInt64 ||
         (t == DType::kBool && op != ReduceWalk::kProd);
}

void launch_reduce_walk(ReduceWalk op, DType t, const ReducePlan& p, const void* x, void* y,
                        cudaStream_t s) {
  if (p.out_numel == 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    reduce_walk_kernel<T><<<grid_for(p.out_numel), kThreads, 0, s>>>(op, p, walk_first<T>(op),
                                                                      static_cast<const T*>(x),
                                                                      static_cast<T*>(y));
  };
  switch (t) {
    case DType::kFloat32: run(float{}); break;
    case DType::kFloat64: run(double{}); break;
    case DType::kInt32: run(int32_t{}); break;
    case DType::kInt64: run(int64_t{}); break;
    case DType::kBool: run(bool{}); break;
    default: PT_CHECK(false, "no CUDA reduction kernel for this dtype");
  }
  PT_CUDA_LAUNCH_CHECK();
}

void launch_reduce(const ReducePlan& p, const float* x, float* y, void* scratch, cudaStream_t s) {
  if (p.out_numel == 0) return;
  if (p.inner_reduced) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(p.out_numel, 65535 * 8));
    reduce_block_kernel<<<blocks, kThreads, 0, s>>>(p, x, y);
  } else if (p.splits > 1) {
    auto* part = static_cast<double*>(scratch);
    reduce_split_kernel<<<grid_for(p.out_numel * p.splits), kThreads, 0, s>>>(p, x, part);
    PT_CUDA_LAUNCH_CHECK();
    sum_parts_kernel<<<grid_for(p.out_numel), kThreads, 0, s>>>(p.out_numel, p.splits, p.scale, part, y);
  } else {
    reduce_thread_kernel<<<grid_for(p.out_numel), kThreads, 0, s>>>(p, x, y);
  }
  PT_CUDA_LAUNCH_CHECK();
}

}  // namespace pt::cuda
