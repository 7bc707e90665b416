// exec/cpu/nn_channel.cc: BatchNormalization and GlobalAveragePool, the ops that reduce plain
// (N, C, spatial...) data per channel. They are plain loops, parallel over channels: oneDNN 2.6
// has no vectorised implementation for this layout (its ncsp batch norm and 1-D pooling ran 3 to
// 5 times slower than onnxruntime), and reordering to a blocked layout costs more than the op.

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/channel_stats.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"
#include "exec/cpu/vector_clones.h"
#include "exec/kernel_geometry.h"

namespace pt::cpu {
namespace {

// Below this many elements a kernel runs on one thread: a parallel region costs microseconds.
constexpr int64_t kParallelMin = int64_t{1} << 15;

// channel_moments's sums for channels [c0, c1) of one image held channels-last: x is the image's
// s pixels of c values each. sums[k] gets lane_sum of channel k's s values where mean is null,
// else lane_squared_deviation of them about mean[k]: the same 16 lanes over the pixels in steps
// of 16, the leftover pixels in double, then the lanes, so the same bits, with the loops running
// along the channels, which lie side by side here. At most kPixelMajorChannels channels a call.
constexpr int64_t kPixelMajorChannels = 64;

PT_VECTOR_CLONES PT_ROUNDED_TWICE void pixel_major_sums(const float* x, int64_t s, int64_t c, int64_t c0,
                                                        int64_t c1, const float* mean, double* sums) {
  const int64_t w = c1 - c0;
  float lane[kLanes][kPixelMajorChannels] = {};
  int64_t i = 0;
  for (; i + kLanes <= s; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float* p = x + (i + k) * c + c0;
      if (mean) {
        for (int64_t j = 0; j < w; ++j) {
          const float d = p[j] - mean[c0 + j];
          lane[k][j] += d * d;
        }
      } else {
        for (int64_t j = 0; j < w; ++j) lane[k][j] += p[j];
      }
    }
  double total[kPixelMajorChannels] = {};
  for (; i < s; ++i) {
    const float* p = x + i * c + c0;
    for (int64_t j = 0; j < w; ++j)
      total[j] += mean ? double(p[j] - mean[c0 + j]) * double(p[j] - mean[c0 + j]) : double(p[j]);
  }
  for (int k = 0; k < kLanes; ++k)
    for (int64_t j = 0; j < w; ++j) total[j] += lane[k][j];
  for (int64_t j = 0; j < w; ++j) sums[c0 + j] = total[j];
}

// sums[n * C + c] = pixel_major_sums of channel c over image n of channels-last x, images and
// blocks of channels in parallel (each sum in its one order, whatever the thread count).
void image_sums(const ChannelDims& d, const float* x, const float* mean, double* sums, int threads, bool parallel) {
  const int64_t blocks = (d.c + kPixelMajorChannels - 1) / kPixelMajorChannels;
  parallel_for(d.n * blocks, threads, parallel, [&](int64_t task) {
    const int64_t n = task / blocks, c0 = task % blocks * kPixelMajorChannels;
    pixel_major_sums(x + n * d.s * d.c, d.s, d.c, c0, std::min(d.c, c0 + kPixelMajorChannels), mean, sums + n * d.c);
  });
}

// What a batch norm applies to Y as it writes it (KernelSpec::epilogue): an Add of a tensor of
// Y's shape and layout (a residual), then a Relu, either or both. Each is the float operation of
// the node's own kernel (the Relu's is oneDNN's eltwise_relu with alpha 0: x > 0 ? x : +0), so the
// fused program has the unfused bits, in training programs too.
struct NormEpilogue {
  bool add = false;  // the residual is run()'s input 5
  bool relu = false;
};

// The epilogue of s as a NormEpilogue, or nullopt where it holds anything else.
std::optional<NormEpilogue> norm_epilogue(const KernelSpec& s) {
  NormEpilogue e;
  const KernelSpec* link = s.epilogue;
  if (link && link->node.domain.empty() && link->node.op_type == "Add" && link->through == 0 &&
      link->inputs.size() == 2 && link->inputs[1] == s.outputs[0] &&
      link->input_channels_last(1) == s.output_channels_last(0)) {
    e.add = true;
    link = link->epilogue;
  }
  if (link && link->node.domain.empty() && link->node.op_type == "Relu") {
    e.relu = true;
    link = link->epilogue;
  }
  if (link) return std::nullopt;
  return e;
}

// The epilogue on n elements of y: y + residual (where not null), then the Relu.
[[gnu::always_inline]] inline void apply_epilogue(float* y, int64_t n, const float* residual, bool relu) {
  if (residual)
    for (int64_t i = 0; i < n; ++i) y[i] += residual[i];
  if (relu)
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.f ? y[i] : 0.f;
}

// Elements [i0, i1) of y after the epilogue.
PT_VECTOR_CLONES void finish_elements(float* y, int64_t i0, int64_t i1, const float* residual, bool relu) {
  apply_epilogue(y + i0, i1 - i0, residual ? residual + i0 : nullptr, relu);
}

// y = (x - mean) * a + b over pixels [p0, p1) of c channels each, normalize_channel's
// expression, then the epilogue.
PT_VECTOR_CLONES PT_ROUNDED_TWICE void normalize_pixels(const float* x, int64_t p0, int64_t p1, int64_t c,
                                                        const float* mean, const float* a, const float* b,
                                                        const float* residual, bool relu, float* y) {
  for (int64_t p = p0; p < p1; ++p) {
    float* yp = y + p * c;
    for (int64_t k = 0; k < c; ++k) yp[k] = (x[p * c + k] - mean[k]) * a[k] + b[k];
    apply_epilogue(yp, c, residual ? residual + p * c : nullptr, relu);
  }
}

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

// GlobalAveragePool on a channels-last X, (N, S, C) in memory: GlobalAveragePool's bits, each
// channel's lane_sum taken by pixel_major_sums.
class GlobalAveragePoolChannelsLast final : public Kernel {
 public:
  GlobalAveragePoolChannelsLast(ChannelDims d, int threads) : d_(d), threads_(threads) {}

  size_t scratch_bytes() const override { return sizeof(double) * static_cast<size_t>(d_.n * d_.c); }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    double* sums = static_cast<double*>(scratch);
    image_sums(d_, in[0].as<const float>(), nullptr, sums, threads_, d_.numel() >= kParallelMin);
    float* y = out[0].as<float>();
    for (int64_t r = 0; r < d_.n * d_.c; ++r) y[r] = static_cast<float>(sums[r] / double(d_.s));
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
// running = running * momentum + batch * (1 - momentum) into output k, where it is asked for.
void write_running(std::span<const Buffer> out, size_t k, int64_t c, float running, float batch,
                   float momentum) {
  if (k < out.size() && out[k].present()) out[k].as<float>()[c] = running * momentum + batch * (1.f - momentum);
}

class BatchNorm final : public ChannelKernel {
 public:
  BatchNorm(ChannelDims d, bool training, float epsilon, float momentum, int threads, bool add, bool relu)
      : ChannelKernel(d, epsilon, threads), training_(training), momentum_(momentum), add_(add), relu_(relu) {}

 private:
  void channel(std::span<const Buffer> in, std::span<const Buffer> out, int64_t c) const override {
    const float* x = in[0].as<const float>();
    float mean = in[3].as<const float>()[c];
    float var = in[4].as<const float>()[c];
    if (training_) {
      channel_moments(x, d_, c, &mean, &var);
      write_running(out, 1, c, in[3].as<const float>()[c], mean, momentum_);
      write_running(out, 2, c, in[4].as<const float>()[c], var, momentum_);
    }
    const float a = in[1].as<const float>()[c] / std::sqrt(var + eps_);
    float* y = out[0].as<float>();
    normalize_channel(x, d_, c, mean, a, in[2].as<const float>()[c], y);
    if (!add_ && !relu_) return;
    for (int64_t n = 0; n < d_.n; ++n) {
      const int64_t at = (n * d_.c + c) * d_.s;
      finish_elements(y, at, at + d_.s, add_ ? in[5].as<const float>() : nullptr, relu_);
    }
  }

  bool training_;
  float momentum_;
  bool add_, relu_;  // the epilogue (NormEpilogue)
};

// BatchNormalization on channels-last X and Y, (N, S, C) in memory (exec/channels_last.h: a
// BatchNormalization between convs). The bits are BatchNorm's: each channel's moments are
// channel_moments's, taken image by image (pixel_major_sums) and added in image order, and Y is
// normalize_channel's expression. Images (in blocks of channels) are summed in parallel and Y's
// pixels normalised in parallel: the bits do not depend on the thread count.
class BatchNormChannelsLast final : public Kernel {
 public:
  BatchNormChannelsLast(ChannelDims d, bool training, float epsilon, float momentum, int threads, bool add,
                        bool relu)
      : d_(d), training_(training), eps_(epsilon), momentum_(momentum), threads_(threads), add_(add), relu_(relu) {}

  // Each image's sums per channel, then each channel's mean and a = scale / sqrt(var + eps).
  size_t scratch_bytes() const override {
    return sizeof(double) * static_cast<size_t>(d_.n * d_.c) + 2 * sizeof(float) * static_cast<size_t>(d_.c);
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float* x = in[0].as<const float>();
    double* per_image = static_cast<double*>(scratch);
    float* mean = reinterpret_cast<float*>(per_image + d_.n * d_.c);
    float* a = mean + d_.c;
    const bool parallel = d_.numel() >= kChannelParallelMin;
    const double count = double(d_.n) * double(d_.s);
    const auto over_images = [&](int64_t c) {
      double total = 0;
      for (int64_t n = 0; n < d_.n; ++n) total += per_image[n * d_.c + c];
      return total;
    };
    if (training_) {
      image_sums(d_, x, nullptr, per_image, threads_, parallel);
      for (int64_t c = 0; c < d_.c; ++c) mean[c] = static_cast<float>(over_images(c) / count);
      image_sums(d_, x, mean, per_image, threads_, parallel);
    }
    for (int64_t c = 0; c < d_.c; ++c) {
      float var = in[4].as<const float>()[c];
      if (training_) {
        var = static_cast<float>(over_images(c) / count);
        write_running(out, 1, c, in[3].as<const float>()[c], mean[c], momentum_);
        write_running(out, 2, c, in[4].as<const float>()[c], var, momentum_);
      } else {
        mean[c] = in[3].as<const float>()[c];
      }
      a[c] = in[1].as<const float>()[c] / std::sqrt(var + eps_);
    }
    // Y in one slice of pixels per thread.
    const int64_t pixels = d_.n * d_.s, slices = parallel ? threads_ : 1;
    parallel_for(slices, threads_, parallel, [&](int64_t t) {
      normalize_pixels(x, pixels * t / slices, pixels * (t + 1) / slices, d_.c, mean, a, in[2].as<const float>(),
                       add_ ? in[5].as<const float>() : nullptr, relu_, out[0].as<float>());
    });
  }

 private:
  ChannelDims d_;
  bool training_;
  float eps_, momentum_;
  int threads_;
  bool add_, relu_;  // the epilogue (NormEpilogue)
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
  const float epsilon = s.node.attr_float("epsilon", 1e-5f), momentum = s.node.attr_float("momentum", 0.9f);
  if (s.input_channels_last(0) != s.output_channels_last(0)) return nullptr;  // chosen together
  const std::optional<NormEpilogue> e = norm_epilogue(s);
  if (!e) return nullptr;
  if (s.input_channels_last(0))
    return std::make_unique<BatchNormChannelsLast>(channel_dims(x), training, epsilon, momentum, s.cpu->threads,
                                                   e->add, e->relu);
  return std::make_unique<BatchNorm>(channel_dims(x), training, epsilon, momentum, s.cpu->threads, e->add, e->relu);
}

// GlobalAveragePool over every spatial dim. X: (N, C, spatial...), Y: (N, C, 1...).
std::unique_ptr<Kernel> make_global_average_pool(const KernelSpec& s) {
  if (s.inputs.size() != 1 || s.outputs.size() != 1 || !float_io(s)) return nullptr;
  const Dims& x = s.inputs[0].shape;
  const Dims& y = s.outputs[0].shape;
  if (x.size() < 3 || channel_dims(x).numel() == 0 || y.size() != x.size() || y[0] != x[0] ||
      y[1] != x[1] || s.outputs[0].numel() != x[0] * x[1])
    return nullptr;
  if (s.input_channels_last(0)) return std::make_unique<GlobalAveragePoolChannelsLast>(channel_dims(x), s.cpu->threads);
  return std::make_unique<GlobalAveragePool>(channel_dims(x), s.cpu->threads);
}

}  // namespace pt::cpu
