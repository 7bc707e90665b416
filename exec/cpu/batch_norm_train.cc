// exec/cpu/batch_norm_train.cc: BatchNormTraining (core/pipetrain_ops.h), BatchNormalization's
// training forward with the batch statistics as outputs. Plain loops parallel over channels, as
// nn_channel.cc's BatchNormalization (and for its reason): the moments come from channel_moments,
// which BatchNormGrad recomputes, so forward and gradient see the same mean and variance, and Y
// has the very bits of BatchNormalization with training_mode=1.
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "exec/cpu/channel_stats.h"
#include "exec/cpu/cpu_kernels.h"

namespace pt::cpu {
namespace {

// X: (N, C, S); Scale, B, batch_mean, batch_var: (C); R = N * S >= 2 values per channel.
//   mean, var = channel_moments (biased), Y = (X - mean) * Scale / sqrt(var + eps) + B
//   batch_mean = mean, batch_var = var * R / (R - 1)
class BatchNormTraining final : public ChannelKernel {
 public:
  using ChannelKernel::ChannelKernel;

 private:
  void channel(std::span<const Buffer> in, std::span<const Buffer> out, int64_t c) const override {
    const float* x = in[0].as<const float>();
    float mean, var;
    channel_moments(x, d_, c, &mean, &var);
    const float a = in[1].as<const float>()[c] / std::sqrt(var + eps_);
    normalize_channel(x, d_, c, mean, a, in[2].as<const float>()[c], out[0].as<float>());
    const double r = double(d_.n) * double(d_.s);
    if (out.size() > 1 && out[1].present()) out[1].as<float>()[c] = mean;
    if (out.size() > 2 && out[2].present())
      out[2].as<float>()[c] = static_cast<float>(double(var) * r / (r - 1));
  }
};

}  // namespace

// BatchNormTraining(X, Scale, B) -> (Y, batch_mean?, batch_var?), epsilon. All float32.
std::unique_ptr<Kernel> make_batch_norm_training(const KernelSpec& s) {
  if (s.inputs.size() != 3 || s.outputs.empty() || s.outputs.size() > 3) return nullptr;
  const TensorType& x = s.inputs[0];
  if (x.dtype != DType::kFloat32 || x.shape.size() < 2 || s.outputs[0] != x) return nullptr;
  const ChannelDims d = channel_dims(x.shape);
  if (d.n * d.s < 2) return nullptr;  // the unbiased variance needs two values per channel
  const TensorType per_channel{DType::kFloat32, {x.shape[1]}};
  for (size_t i = 1; i < 3; ++i)
    if (!s.has_input(i) || s.inputs[i] != per_channel) return nullptr;
  for (size_t k = 1; k < s.outputs.size(); ++k)
    if (s.outputs[k].dtype != DType::kUndefined && s.outputs[k] != per_channel) return nullptr;
  return std::make_unique<BatchNormTraining>(d, s.node.attr_float("epsilon", 1e-5f),
                                             s.cpu->threads);
}

}  // namespace pt::cpu
