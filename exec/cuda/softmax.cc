// exec/cuda/softmax.cc: Softmax, LogSoftmax and their gradients (SoftmaxGrad, LogSoftmaxGrad of
// the pipetrain domain) on cuDNN's softmax (legacy API). Any axis: X is seen as
// (outer, n, inner, 1) and cuDNN's channel mode takes the softmax over n at each (outer, inner).
//   forward   CUDNN_SOFTMAX_ACCURATE (max subtracted) or CUDNN_SOFTMAX_LOG
//   backward  SoftmaxGrad: dX = Y * (dY - sum(dY * Y)); LogSoftmaxGrad: dX = dY - exp(Y) sum(dY)
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cudnn_util.h"
#include "exec/cuda/plan.h"

namespace pt::cuda {
namespace {

class CudnnSoftmax final : public Kernel {
 public:
  CudnnSoftmax(const CudaContext& ctx, cudnnSoftmaxAlgorithm_t algo, bool backward,
               const IntDims& dims)
      : ctx_(ctx), algo_(algo), backward_(backward), x_(dims) {}

  // forward: in X, out Y; backward: in dY, Y, out dX.
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float one = 1.f, zero = 0.f;
    if (!backward_) {
      PT_CUDNN_CHECK(cudnnSoftmaxForward(ctx_.cudnn, algo_, CUDNN_SOFTMAX_MODE_CHANNEL, &one,
                                         x_.get(), in[0].data, &zero, x_.get(), out[0].data));
      return;
    }
    PT_CUDNN_CHECK(cudnnSoftmaxBackward(ctx_.cudnn, algo_, CUDNN_SOFTMAX_MODE_CHANNEL, &one,
                                        x_.get(), in[1].data, x_.get(), in[0].data, &zero,
                                        x_.get(), out[0].data));
  }

 private:
  const CudaContext& ctx_;
  cudnnSoftmaxAlgorithm_t algo_;
  bool backward_;
  TensorDesc x_;
};

// (outer, n, inner, 1) around `axis` of shape, or empty when a dim exceeds int or is zero.
IntDims view(const Dims& shape, int64_t axis) {
  const int64_t outer = product(shape, 0, static_cast<size_t>(axis));
  const int64_t inner = product(shape, static_cast<size_t>(axis) + 1, shape.size());
  const int64_t n = shape[static_cast<size_t>(axis)];
  if (outer * n * inner == 0 || outer * n * inner >= (int64_t{1} << 31)) return {};
  return {int(outer), int(n), int(inner), 1};
}

std::unique_ptr<Kernel> softmax_like(const KernelSpec& s, CudaContext& ctx,
                                     cudnnSoftmaxAlgorithm_t algo, bool backward) {
  const size_t inputs = backward ? 2 : 1;
  if (s.inputs.size() != inputs || !has_io(s, inputs) || s.outputs.size() != 1 || !float_io(s))
    return nullptr;
  if (!backward && s.graph.opset() < 13) return nullptr;  // the older form flattens from axis
  if (s.outputs[0] != s.inputs[0] || (backward && s.inputs[1] != s.inputs[0])) return nullptr;
  const Dims& x = s.inputs[0].shape;
  const int64_t axis = normalize_axis(s.node.attr_int("axis", -1), x.size());
  if (x.empty() || axis < 0) return nullptr;
  const IntDims dims = view(x, axis);
  if (dims.empty()) return nullptr;
  return std::make_unique<CudnnSoftmax>(ctx, algo, backward, dims);
}

}  // namespace

std::unique_ptr<Kernel> make_softmax(const KernelSpec& s, CudaContext& ctx) {
  return softmax_like(s, ctx, CUDNN_SOFTMAX_ACCURATE, false);
}
std::unique_ptr<Kernel> make_log_softmax(const KernelSpec& s, CudaContext& ctx) {
  return softmax_like(s, ctx, CUDNN_SOFTMAX_LOG, false);
}
std::unique_ptr<Kernel> make_softmax_grad(const KernelSpec& s, CudaContext& ctx) {
  return softmax_like(s, ctx, CUDNN_SOFTMAX_ACCURATE, true);
}
std::unique_ptr<Kernel> make_log_softmax_grad(const KernelSpec& s, CudaContext& ctx) {
  return softmax_like(s, ctx, CUDNN_SOFTMAX_LOG, true);
}

}  // namespace pt::cuda
