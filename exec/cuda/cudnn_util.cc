#include "exec/cuda/cudnn_util.h"

namespace pt::cuda {

TensorDesc::TensorDesc(IntDims dims) {
  while (dims.size() < 4) dims.push_back(1);
  IntDims strides(dims.size());
  int s = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = s;
    s *= dims[i];
  }
  PT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_));
  PT_CUDNN_CHECK(cudnnSetTensorNdDescriptor(d_, CUDNN_DATA_FLOAT, static_cast<int>(dims.size()),
                                            dims.data(), strides.data()));
}
TensorDesc::~TensorDesc() { cudnnDestroyTensorDescriptor(d_); }

FilterDesc::FilterDesc(const IntDims& dims) {
  PT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d_));
  PT_CUDNN_CHECK(cudnnSetFilterNdDescriptor(d_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                            static_cast<int>(dims.size()), dims.data()));
}
FilterDesc::~FilterDesc() { cudnnDestroyFilterDescriptor(d_); }

ConvDesc::ConvDesc(const IntDims& pads, const IntDims& strides, const IntDims& dilations,
                   int groups, cudnnMathType_t math) {
  PT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d_));
  PT_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(d_, static_cast<int>(pads.size()), pads.data(),
                                                 strides.data(), dilations.data(),
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  PT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d_, groups));
  set_math(math);
}
ConvDesc::~ConvDesc() { cudnnDestroyConvolutionDescriptor(d_); }
void ConvDesc::set_math(cudnnMathType_t math) { PT_CUDNN_CHECK(cudnnSetConvolutionMathType(d_, math)); }

PoolDesc::PoolDesc(cudnnPoolingMode_t mode, const IntDims& window, const IntDims& pads,
                   const IntDims& strides) {
  PT_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&d_));
  PT_CUDNN_CHECK(cudnnSetPoolingNdDescriptor(d_, mode, CUDNN_PROPAGATE_NAN,
                                             static_cast<int>(window.size()), window.data(),
                                             pads.data(), strides.data()));
}
PoolDesc::~PoolDesc() { cudnnDestroyPoolingDescriptor(d_); }

}  // namespace pt::cuda
