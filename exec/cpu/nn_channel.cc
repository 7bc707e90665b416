// exec/cpu/nn_channel.cc: BatchNormalization and GlobalAveragePool, the ops that reduce plain
// (N, C, spatial...) data per channel. They are plain loops, parallel over channels: oneDNN 2.6
// has no vectorised implementation for this layout (its ncsp batch norm and 1-D pooling ran 3 to
// 5 times slower than onnxruntime), and reordering to a blocked layout costs more than the op.

#include <cmath>
#include <cstdint>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/channel_stats.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"
#include "exec/kernel_geometry.h"

namespace pt::cpu {
namespace {

// Below this many elements a kernel runs on one thread: a parallel region costs microseconds.
constexpr int64_t kParallelMin = int64_t{1} << 15;

// GlobalAveragePool: Y[n, c] = mean_s X[n, c, s]. X: (N, C, spatial...), Y: (N, C, 1...).
class GlobalAveragePool final : public Kernel {
 public:
  GlobalAveragePool(ChannelDims d, int threads) : d_(d), threads_(threads) {}

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* x = in[0].as<const float>();
    float* y = out[0].as<float>();
    const int64_t rows = d_.n * d_.c, s = d_.s;
    parallel_for(rows, threads_, d_.numel() >= kParallelMin,
                 [&](int64_t r) { y[r] = static_cast<float>(lane_sum(x + r * s, s) / double(s)); });
  }

 private:
  ChannelDims d_;
  int threads_;
};

// BatchNormalization. X: (N, C, spatial...); scale, B, input_mean, input_var: (C).
//   Y = (X - mean) * scale / sqrt(var + epsilon) + B, per channel
// Inference uses input_mean and input_var. training_mode=1 uses the batch's mean and biased
// variance over (N, spatial) and writes, when asked for (opset 15):
//   running_mean = input_mean * momentum + batch_mean * (1 - momentum)
//   running_var  = input_var  * momentum + batch_var  * (1 - momentum)
class BatchNorm final : public ChannelKernel {
 public:
  BatchNorm(ChannelDims d, bool training, float epsilon, float momentum, int threads)
      : ChannelKernel(d, epsilon, threads), training_(training), momentum_(momentum) {}

 private:
  void channel(std::span<const Buffer> in, std::span<const Buffer> out, int64_t c) const override {
    const float* x = in[0].as<const float>();
    float mean = in[3].as<const float>()[c];
    float var = in[4].as<const float>()[c];
    if (training_) {
      channel_moments(x, d_, c, &mean, &var);
      update_running(out, 1, c, in[3].as<const float>()[c], mean);
      update_running(out, 2, c, in[4].as<const float>()[c], var);
    }
    const float a = in[1].as<const float>()[c] / std::sqrt(var + eps_);
    normalize_channel(x, d_, c, mean, a, in[2].as<const float>()[c], out[0].as<float>());
  }

  void update_running(std::span<const Buffer> out, size_t k, int64_t c, float running,
                      float batch) const {
    if (k < out.size() && out[k].present())
      out[k].as<float>()[c] = running * momentum_ + batch * (1.f - momentum_);
  }

  bool training_;
  float momentum_;
};

}  // namespace

// BatchNormalization (opset 14/15 form): inference, or training_mode=1 with the batch's
// statistics. Inputs X, scale, B, input_mean, input_var; all f32.
std::unique_ptr<Kernel> make_batch_norm(const KernelSpec& s) {
  if (s.inputs.size() != 5 || s.outputs.size() > 3 || !float_io(s)) return nullptr;
  const Dims& x = s.inputs[0].shape;
  if (x.size() < 2 || channel_dims(x).numel() == 0 || !(s.outputs[0] == s.inputs[0]))
    return nullptr;
  for (size_t i = 1; i < 5; ++i)
    if (!s.has_input(i) || s.inputs[i].shape != Dims{x[1]}) return nullptr;
  for (size_t i = 1; i < s.outputs.size(); ++i)
    if (s.outputs[i].dtype != DType::kUndefined && s.outputs[i].shape != Dims{x[1]}) return nullptr;
  const bool training = s.node.attr_int("training_mode", 0) != 0;
  // Before opset 14 extra outputs meant training with other semantics; without training_mode
  // there are none to make.
  bool extra_outputs = false;
  for (size_t i = 1; i < s.outputs.size(); ++i)
    extra_outputs = extra_outputs || s.outputs[i].dtype != DType::kUndefined;
  if (extra_outputs && (!training || s.graph.opset() < 14)) return nullptr;
  return std::make_unique<BatchNorm>(channel_dims(x), training, s.node.attr_float("epsilon", 1e-5f),
                                     s.node.attr_float("momentum", 0.9f), s.cpu->threads);
}

// GlobalAveragePool over every spatial dim. X: (N, C, spatial...), Y: (N, C, 1...).
std::unique_ptr<Kernel> make_global_average_pool(const KernelSpec& s) {
  if (s.inputs.size() != 1 || s.outputs.size() != 1 || !float_io(s)) return nullptr;
  const Dims& x = s.inputs[0].shape;
  const Dims& y = s.outputs[0].shape;
  if (x.size() < 3 || channel_dims(x).numel() == 0 || y.size() != x.size() || y[0] != x[0] ||
      y[1] != x[1] || s.outputs[0].numel() != x[0] * x[1])
    return nullptr;
  return std::make_unique<GlobalAveragePool>(channel_dims(x), s.cpu->threads);
}

}  // namespace pt::cpu
