// exec/cuda/norm.cc: BatchNormalization, BatchNormTraining and BatchNormGrad on cuDNN's batch
// normalization (legacy API, spatial mode: statistics per channel over N and every spatial
// position, X seen as (N, C, S, 1)); LayerNormalization and LayerNormGrad as the custom kernels of
// norm.cu (cuDNN 9 has layer norm only in its graph API).
//
// cuDNN's training forward folds the unbiased batch variance into its running variance; ONNX's
// running_var takes the biased one. The kernel asks cuDNN for the batch moments alone (an
// averaging factor of 1 into zeroed scratch) and forms ONNX's running statistics itself
// (launch_batch_norm_running).
#include <array>
#include <optional>

#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cudnn_util.h"
#include "exec/cuda/plan.h"

namespace pt::cuda {
namespace {

// X: (N, C, spatial...) as cuDNN's (N, C, S, 1), and the per-channel descriptor it derives.
struct ChannelDescs {
  TensorDesc x;
  cudnnTensorDescriptor_t channel = nullptr;
  int64_t c = 0, count = 0;  // channels, values per channel (N * S)

  explicit ChannelDescs(const Dims& shape)
      : x(IntDims{int(shape[0]), int(shape[1]), int(product(shape, 2, shape.size())), 1}),
        c(shape[1]), count(shape[0] * product(shape, 2, shape.size())) {
    PT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&channel));
    PT_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(channel, x.get(), CUDNN_BATCHNORM_SPATIAL));
  }
  ~ChannelDescs() { cudnnDestroyTensorDescriptor(channel); }
  ChannelDescs(const ChannelDescs&) = delete;
  ChannelDescs& operator=(const ChannelDescs&) = delete;
};

bool fits_cudnn(const Dims& x) {
  return x.size() >= 2 && x[0] > 0 && x[1] > 0 && product(x, 0, x.size()) < (int64_t{1} << 31);
}

// Output k, or the scratch region at `at` when it is not wanted.
void* out_or(std::span<const Buffer> out, size_t k, std::byte* base, size_t at) {
  return k < out.size() && out[k].present() ? out[k].data : static_cast<void*>(base + at);
}

// BatchNormalization: inference (the given mean and var) or training_mode=1 (batch statistics;
// running statistics written when asked for). Inputs X, scale, B, input_mean, input_var.
class BatchNorm final : public Kernel {
 public:
  BatchNorm(const CudaContext& ctx, const Dims& x, bool training, double eps, float momentum)
      : ctx_(ctx), d_(x), training_(training), eps_(eps), momentum_(momentum) {
    const size_t channel_bytes = static_cast<size_t>(d_.c) * sizeof(float);
    if (training_) {
      mean_ = layout_.reserve(channel_bytes);
      var_ = layout_.reserve(channel_bytes);
    }
  }
  size_t scratch_bytes() const override { return layout_.bytes(); }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float one = 1.f, zero = 0.f;
    if (!training_) {
      PT_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
          ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, d_.x.get(), in[0].data, d_.x.get(),
          out[0].data, d_.channel, in[1].data, in[2].data, in[3].data, in[4].data, eps_));
      return;
    }
    std::byte* base = ScratchLayout::base(scratch);
    auto* mean = reinterpret_cast<float*>(base + mean_);
    auto* var = reinterpret_cast<float*>(base + var_);
    // (1 - factor) * old is 0 * old: old must not be NaN.
    const size_t channel_bytes = static_cast<size_t>(d_.c) * sizeof(float);
    PT_CUDA_CHECK(cudaMemsetAsync(mean, 0, channel_bytes, ctx_.stream));
    PT_CUDA_CHECK(cudaMemsetAsync(var, 0, channel_bytes, ctx_.stream));
    PT_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
        ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, d_.x.get(), in[0].data, d_.x.get(),
        out[0].data, d_.channel, in[1].data, in[2].data, 1.0, mean, var, eps_, nullptr, nullptr));
    float* out_mean = out.size() > 1 && out[1].present() ? out[1].as<float>() : nullptr;
    float* out_var = out.size() > 2 && out[2].present() ? out[2].as<float>() : nullptr;
    launch_batch_norm_running(d_.c, d_.count, momentum_, in[3].as<const float>(),
                              in[4].as<const float>(), mean, var, out_mean, out_var, ctx_.stream);
  }

 private:
  const CudaContext& ctx_;
  ChannelDescs d_;
  bool training_;
  double eps_;
  float momentum_;
  ScratchLayout layout_;
  size_t mean_ = 0, var_ = 0;
};

// BatchNormTraining(X, Scale, B) -> (Y, batch_mean?, batch_var?): cuDNN's training forward with
// an averaging factor of 1 gives exactly the batch mean and the unbiased batch variance.
class BatchNormTraining final : public Kernel {
 public:
  BatchNormTraining(const CudaContext& ctx, const Dims& x, double eps)
      : ctx_(ctx), d_(x), eps_(eps) {
    const size_t channel_bytes = static_cast<size_t>(d_.c) * sizeof(float);
    mean_ = layout_.reserve(channel_bytes);
    var_ = layout_.reserve(channel_bytes);
  }
  size_t scratch_bytes() const override { return layout_.bytes(); }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    std::byte* base = ScratchLayout::base(scratch);
    void* mean = out_or(out, 1, base, mean_);
    void* var = out_or(out, 2, base, var_);
    const size_t channel_bytes = static_cast<size_t>(d_.c) * sizeof(float);
    // (1 - factor) * old is 0 * old: old must not be NaN.
    PT_CUDA_CHECK(cudaMemsetAsync(mean, 0, channel_bytes, ctx_.stream));
    PT_CUDA_CHECK(cudaMemsetAsync(var, 0, channel_bytes, ctx_.stream));
    const float one = 1.f, zero = 0.f;
    PT_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
        ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, d_.x.get(), in[0].data, d_.x.get(),
        out[0].data, d_.channel, in[1].data, in[2].data, 1.0, mean, var, eps_, nullptr, nullptr));
  }

 private:
  const CudaContext& ctx_;
  ChannelDescs d_;
  double eps_;
  ScratchLayout layout_;
  size_t mean_ = 0, var_ = 0;
};

// BatchNormGrad(dY, X, Scale) -> (dX, dScale?, dBias?): cuDNN's backward recomputes the batch
// moments from X (no saved mean given); unwanted outputs go to scratch.
class BatchNormGrad final : public Kernel {
 public:
  // want: which of (dX, dScale, dBias) the node asks for; the others get scratch.
  BatchNormGrad(const CudaContext& ctx, const Dims& x, double eps, std::array<bool, 3> want)
      : ctx_(ctx), d_(x), eps_(eps) {
    const size_t channel_bytes = static_cast<size_t>(d_.c) * sizeof(float);
    if (!want[0]) dx_ = layout_.reserve(static_cast<size_t>(d_.c * d_.count) * sizeof(float));
    if (!want[1]) dscale_ = layout_.reserve(channel_bytes);
    if (!want[2]) dbias_ = layout_.reserve(channel_bytes);
  }
  size_t scratch_bytes() const override { return layout_.bytes(); }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    std::byte* base = ScratchLayout::base(scratch);
    const float one = 1.f, zero = 0.f;
    PT_CUDNN_CHECK(cudnnBatchNormalizationBackward(
        ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, d_.x.get(), in[1].data,
        d_.x.get(), in[0].data, d_.x.get(), out_or(out, 0, base, dx_), d_.channel, in[2].data,
        out_or(out, 1, base, dscale_), out_or(out, 2, base, dbias_), eps_, nullptr, nullptr));
  }

 private:
  const CudaContext& ctx_;
  ChannelDescs d_;
  double eps_;
  ScratchLayout layout_;
  size_t dx_ = 0, dscale_ = 0, dbias_ = 0;
};

}  // namespace

// BatchNormalization (opset 14/15 form), as the CPU's make_batch_norm accepts it.
std::unique_ptr<Kernel> make_batch_norm(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 5 || s.outputs.size() > 3 || !float_io(s)) return nullptr;
  const Dims& x = s.inputs[0].shape;
  if (!fits_cudnn(x) || s.inputs[0].numel() == 0 || s.outputs[0] != s.inputs[0]) return nullptr;
  for (size_t i = 1; i < 5; ++i)
    if (!s.has_input(i) || s.inputs[i].shape != Dims{x[1]}) return nullptr;
  bool extra_outputs = false;
  for (size_t k = 1; k < s.outputs.size(); ++k) {
    if (wanted(s, k) && s.outputs[k].shape != Dims{x[1]}) return nullptr;
    extra_outputs = extra_outputs || wanted(s, k);
  }
  const bool training = s.node.attr_int("training_mode", 0) != 0;
  if (extra_outputs && (!training || s.graph.opset() < 14)) return nullptr;
  return std::make_unique<BatchNorm>(ctx, x, training, s.node.attr_float("epsilon", 1e-5f),
                                     s.node.attr_float("momentum", 0.9f));
}

// BatchNormTraining(X, Scale, B) -> (Y, batch_mean?, batch_var?), N * S >= 2.
std::unique_ptr<Kernel> make_batch_norm_training(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 3 || s.outputs.empty() || s.outputs.size() > 3 || !has_io(s, 3) ||
      !float_io(s))
    return nullptr;
  const Dims& x = s.inputs[0].shape;
  if (!fits_cudnn(x) || s.outputs[0] != s.inputs[0] || s.inputs[0].numel() / x[1] < 2) return nullptr;
  const TensorType per_channel{DType::kFloat32, {x[1]}};
  for (size_t i = 1; i < 3; ++i)
    if (s.inputs[i] != per_channel) return nullptr;
  for (size_t k = 1; k < s.outputs.size(); ++k)
    if (wanted(s, k) && s.outputs[k] != per_channel) return nullptr;
  return std::make_unique<BatchNormTraining>(ctx, x, s.node.attr_float("epsilon", 1e-5f));
}

// BatchNormGrad(dY, X, Scale) -> (dX, dScale?, dBias?), epsilon.
std::unique_ptr<Kernel> make_batch_norm_grad(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 3 || !s.has_input(0) || !s.has_input(1) || !s.has_input(2) ||
      s.outputs.size() > 3 || s.outputs.empty())
    return nullptr;
  if (!wanted(s, 0) && !wanted(s, 1) && !wanted(s, 2)) return nullptr;
  for (size_t i = 0; i < 3; ++i)
    if (s.inputs[i].dtype != DType::kFloat32) return nullptr;
  const Dims& x = s.inputs[1].shape;
  if (!fits_cudnn(x) || s.inputs[1].numel() == 0 || s.inputs[0] != s.inputs[1] ||
      s.inputs[2].shape != Dims{x[1]})
    return nullptr;
  if (wanted(s, 0) && s.outputs[0] != s.inputs[1]) return nullptr;
  for (size_t k = 1; k < s.outputs.size(); ++k)
    if (wanted(s, k) && s.outputs[k] != TensorType{DType::kFloat32, {x[1]}}) return nullptr;
  return std::make_unique<BatchNormGrad>(ctx, x, s.node.attr_float("epsilon", 1e-5f),
                                         std::array<bool, 3>{wanted(s, 0), wanted(s, 1), wanted(s, 2)});
}

// LayerNormalization (opset 17): axis, epsilon, stash_type 1; Mean and InvStdDev optional.
std::unique_ptr<Kernel> make_layer_norm(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() < 2 || s.inputs.size() > 3 || s.outputs.size() > 3 || !has_io(s, 2) ||
      !float_io(s))
    return nullptr;
  const Dims& x = s.inputs[0].shape;
  const int64_t axis = normalize_axis(s.node.attr_int("axis", -1), x.size());
  if (x.empty() || axis < 0 || s.node.attr_int("stash_type", 1) != 1) return nullptr;
  const int64_t outer = product(x, 0, static_cast<size_t>(axis));
  const int64_t inner = product(x, static_cast<size_t>(axis), x.size());
  const bool bias = s.has_input(2);
  if (s.inputs[1].numel() != inner || (bias && s.inputs[2].numel() != inner) ||
      s.outputs[0] != s.inputs[0])
    return nullptr;
  for (size_t k = 1; k < s.outputs.size(); ++k)
    if (wanted(s, k) && s.outputs[k].numel() != outer) return nullptr;
  const float eps = s.node.attr_float("epsilon", 1e-5f);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    float* mean = out.size() > 1 && out[1].present() ? out[1].as<float>() : nullptr;
    float* inv_std = out.size() > 2 && out[2].present() ? out[2].as<float>() : nullptr;
    launch_layer_norm(outer, inner, eps, in[0].as<const float>(),
                      in[1].as<const float>(),
                      bias ? in[2].as<const float>() : nullptr, out[0].as<float>(),
                      mean, inv_std, stream);
  });
}

// LayerNormGrad(dY, X, Scale, Mean, InvStdDev) -> (dX, dScale?, dBias?), axis.
std::unique_ptr<Kernel> make_layer_norm_grad(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 5 || s.outputs.size() > 3 || s.outputs.empty()) return nullptr;
  if (!wanted(s, 0) && !wanted(s, 1) && !wanted(s, 2)) return nullptr;
  for (size_t i = 0; i < 5; ++i)
    if (!s.has_input(i) || s.inputs[i].dtype != DType::kFloat32) return nullptr;
  for (size_t k = 0; k < s.outputs.size(); ++k)
    if (wanted(s, k) && s.outputs[k].dtype != DType::kFloat32) return nullptr;
  const Dims& x = s.inputs[1].shape;
  const int64_t axis = normalize_axis(s.node.attr_int("axis", -1), x.size());
  if (x.empty() || axis < 0) return nullptr;
  const int64_t outer = product(x, 0, static_cast<size_t>(axis));
  const int64_t inner = product(x, static_cast<size_t>(axis), x.size());
  if (s.inputs[0] != s.inputs[1] || (wanted(s, 0) && s.outputs[0] != s.inputs[1]) || inner == 0 ||
      s.inputs[2].numel() != inner || s.inputs[3].numel() != outer || s.inputs[4].numel() != outer)
    return nullptr;
  for (size_t k = 1; k < 3; ++k)
    if (wanted(s, k) && s.outputs[k].shape != s.inputs[2].shape) return nullptr;
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void* scratch) {
    auto present = [&](size_t k) {
      return k < out.size() && out[k].present() ? out[k].as<float>() : nullptr;
    };
    launch_layer_norm_grad(outer, inner, in[0].as<const float>(),
                           in[1].as<const float>(), in[2].as<const float>(),
                           in[3].as<const float>(), in[4].as<const float>(),
                           present(0), present(1), present(2), scratch, stream);
  }, layer_norm_grad_scratch(outer, inner));
}

}  // namespace pt::cuda
