// exec/cpu/channel_stats.h: plain (N, C, spatial...) data seen per channel: the channel loop and
// the normalisation the batch-norm kernels share (BatchNormalization in nn_channel.cc,
// BatchNormTraining in batch_norm_train.cc, BatchNormGrad in nn_grad_norm.cc), and the batch
// statistics they compute the same way, so that the gradient sees the forward's moments.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"
#include "exec/kernel.h"

namespace pt::cpu {

// X: (N, C, S), S the product of the spatial dims (1 when there are none).
struct ChannelDims {
  int64_t n = 0, c = 0, s = 1;
  int64_t numel() const { return n * c * s; }
};

inline ChannelDims channel_dims(const std::vector<int64_t>& x) {
  ChannelDims d{x[0], x[1], 1};
  for (size_t i = 2; i < x.size(); ++i) d.s *= x[i];
  return d;
}

// Below this many elements a channel loop runs on one thread: a parallel region costs
// microseconds.
constexpr int64_t kChannelParallelMin = int64_t{1} << 15;

// Calls f(c) for every channel c, channels in parallel (each on one thread) when the data is
// large: every channel's result is the same whatever the thread count.
template <class F>
void for_each_channel(const ChannelDims& d, int threads, F f) {
  parallel_for(d.c, threads, d.numel() >= kChannelParallelMin, f);
}

// y = (x - mean) * a + b over channel c of x: batch normalisation with a = scale / sqrt(var + eps).
inline void normalize_channel(const float* x, const ChannelDims& d, int64_t c, float mean, float a,
                              float b, float* y) {
  for (int64_t n = 0; n < d.n; ++n) {
    const int64_t at = (n * d.c + c) * d.s;
    for (int64_t i = 0; i < d.s; ++i) y[at + i] = (x[at + i] - mean) * a + b;
  }
}

// A kernel computed channel by channel over (N, C, S) data with an epsilon (the batch-norm
// kernels): run() calls channel(in, out, c) for every channel, through for_each_channel.
class ChannelKernel : public Kernel {
 public:
  ChannelKernel(ChannelDims d, float epsilon, int threads)
      : d_(d), eps_(epsilon), threads_(threads) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) final {
    for_each_channel(d_, threads_, [&](int64_t c) { channel(in, out, c); });
  }

 protected:
  virtual void channel(std::span<const Buffer> in, std::span<const Buffer> out,
                       int64_t c) const = 0;

  ChannelDims d_;
  float eps_;
  int threads_;
};

// Mean and biased variance of channel c of x over (N, S), in two passes.
inline void channel_moments(const float* x, const ChannelDims& d, int64_t c, float* mean,
                            float* var) {
  const double count = double(d.n) * double(d.s);
  double total = 0;
  for (int64_t n = 0; n < d.n; ++n) total += lane_sum(x + (n * d.c + c) * d.s, d.s);
  *mean = static_cast<float>(total / count);
  double dev = 0;
  for (int64_t n = 0; n < d.n; ++n)
    dev += lane_squared_deviation(x + (n * d.c + c) * d.s, d.s, *mean);
  *var = static_cast<float>(dev / count);
}

}  // namespace pt::cpu
