// exec/cuda/cudnn_util.h: owning wrappers of the cuDNN (legacy API) descriptors the CUDA
// kernels keep from creation to destruction, the layouts they are made with, and a scratch
// layout (aligned regions of a kernel's scratch). Host code.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <vector>

#include "exec/cuda/cuda_check.h"
#include "exec/cuda/cuda_context.h"

namespace pt::cuda {

using IntDims = std::vector<int>;

// A fully packed float32 tensor descriptor of 4 or 5 dims (fewer are padded with trailing 1s).
class TensorDesc {
 public:
  explicit TensorDesc(IntDims dims);
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

// A float32 NCHW filter descriptor (K, C/group, spatial...).
class FilterDesc {
 public:
  explicit FilterDesc(const IntDims& dims);
  ~FilterDesc();
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  cudnnFilterDescriptor_t get() const { return d_; }

 private:
  cudnnFilterDescriptor_t d_ = nullptr;
};

// Cross-correlation of `spatial` dims with symmetric pads, groups and a math type.
class ConvDesc {
 public:
  ConvDesc(const IntDims& pads, const IntDims& strides, const IntDims& dilations, int groups,
           cudnnMathType_t math);
  ~ConvDesc();
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return d_; }
  void set_math(cudnnMathType_t math);

 private:
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

class PoolDesc {
 public:
  PoolDesc(cudnnPoolingMode_t mode, const IntDims& window, const IntDims& pads,
           const IntDims& strides);
  ~PoolDesc();
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
  cudnnPoolingDescriptor_t get() const { return d_; }

 private:
  cudnnPoolingDescriptor_t d_ = nullptr;
};

// The math a convolution may use: FMA only in fp32 mode (cuDNN's default would use TF32 on
// tensor cores), tensor cores allowed in bf16 and fp16 modes.
inline cudnnMathType_t conv_math(const CudaContext& ctx) {
  return half_products(ctx.precision) ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

// Whether a convolution algorithm's reported math type fits the context's precision.
inline bool math_allowed(const CudaContext& ctx, cudnnMathType_t m) {
  return half_products(ctx.precision) || m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
}

// Regions of a kernel's scratch, each 256-byte aligned; bytes() is what to ask the plan for.
class ScratchLayout {
 public:
  static constexpr size_t kAlign = 256;
  // Reserves a region; returns its offset from the aligned base.
  size_t reserve(size_t bytes) {
    const size_t at = total_;
    total_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  }
  size_t bytes() const { return total_ ? total_ + kAlign : 0; }
  static std::byte* base(void* scratch) {
    const auto p = reinterpret_cast<uintptr_t>(scratch);
    return reinterpret_cast<std::byte*>((p + kAlign - 1) / kAlign * kAlign);
  }

 private:
  size_t total_ = 0;
};

}  // namespace pt::cuda
