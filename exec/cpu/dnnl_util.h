// exec/cpu/dnnl_util.h: small bridges between the IR and oneDNN shared by the CPU kernels.
#pragma once

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ir.h"
#include "exec/kernel_geometry.h"  // product, and the other shape helpers kernels share

namespace pt::cpu {

// A dense 1x1 convolution between plain tensors runs on oneDNN's plain layouts, a GEMM per image,
// faster there than the reorders its blocked kernels need (about 3x on 48 -> 8 channels at 16x16),
// except on planes of at most kSmallPlane pixels: there each image's GEMM is a few columns wide
// and the blocked 1x1 kernel with its reorders takes half the time or less (MobileNetV2's
// expansions and projections on 2x2 and 4x4 maps, 8 images: 16 -> 96 channels at 2x2, 5.8 us a
// call on the GEMM against 2.1; its input gradient likewise).
constexpr int64_t kSmallPlane = 16;

// Whether a 1x1 convolution of input dims x (N, C, spatial...) takes the plain layouts.
inline bool pointwise_on_plain_layouts(const std::vector<int64_t>& x) {
  return product(x, 2, x.size()) > kSmallPlane;
}

inline dnnl::memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::kFloat32: return dnnl::memory::data_type::f32;
    case DType::kInt32: return dnnl::memory::data_type::s32;
    case DType::kInt8: return dnnl::memory::data_type::s8;
    case DType::kUInt8: case DType::kBool: return dnnl::memory::data_type::u8;
    case DType::kBFloat16: return dnnl::memory::data_type::bf16;
    case DType::kFloat16: return dnnl::memory::data_type::f16;
    default: PT_CHECK(false, std::string("no oneDNN type for ") + dtype_name(t));
  }
  return dnnl::memory::data_type::undef;
}

// Dense row-major descriptor with the given dims (defaults to the type's shape; a scalar
// becomes {1}).
inline dnnl::memory::desc plain_desc(DType dtype, std::vector<int64_t> dims) {
  if (dims.empty()) dims = {1};
  dnnl::memory::dims strides(dims.size());
  int64_t s = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = s;
    s *= dims[i];
  }
  return dnnl::memory::desc(dnnl::memory::dims(dims.begin(), dims.end()), dnnl_type(dtype),
                            strides);
}

inline dnnl::memory::desc plain_desc(const TensorType& t) { return plain_desc(t.dtype, t.shape); }

// Whether oneDNN picked an implementation whose name starts with `prefix` for a primitive: "brg"
// (a brgemm kernel, the fastest on AVX-512 machines), "ref" (its slow reference kernel).
template <class PrimitiveDesc>
bool implementation_is(const PrimitiveDesc& pd, const char* prefix) {
  return std::string(pd.impl_info_str()).rfind(prefix, 0) == 0;
}

// oneDNN runs on the stage's thread count (CpuContext::threads): primitives are created and
// executed under the same count, as their scratchpad sizes depend on it.
class ThreadScope {
 public:
  explicit ThreadScope(int threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(std::max(1, threads));
  }
  ~ThreadScope() { omp_set_num_threads(saved_); }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};

// The threads an element-wise oneDNN primitive (eltwise, binary, their gradients) runs on: one
// below kElementwiseParallelMin elements, else the stage's. On tensors that small, waking the
// second thread costs more than it saves (the sample MLP's 8 x 128 Relus: 4-5 us on two threads,
// 1-2 on one; its forward 0.014 -> 0.012 ms at two threads). The plain loops' bar (1 << 15) was
// too high here: MobileNet's 8K-32K-element activations got slower on one thread. Each element
// is computed alone, so the bits do not depend on the count.
constexpr int64_t kElementwiseParallelMin = int64_t{1} << 12;
inline int elementwise_threads(int64_t numel, int threads) {
  return numel < kElementwiseParallelMin ? 1 : threads;
}

// Scratch handed to kernels is aligned up to kScratchAlign inside the program's block.
constexpr size_t kScratchAlign = 64;
inline size_t round_up(size_t n) { return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

}  // namespace pt::cpu
