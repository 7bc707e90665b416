// exec/cpu/channel_stats.h: plain (N, C, spatial...) data seen per channel, and the batch
// statistics BatchNormalization's training forward (nn_channel.cc) and BatchNormGrad
// (nn_grad_norm.cc) compute the same way, so that the gradient sees the forward's moments.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/cpu/lane_math.h"

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
