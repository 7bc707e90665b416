// exec/parameter_update.h: the element-wise parameter updates of train/optimizer.h as plain
// scalars, so the host loops there and a backend's own kernels (Backend::sgd_update,
// adamw_update, where the parameters live) apply the very same rules. Every scalar is computed
// in double by the optimizer and rounded to float once; per element, in float:
//   SGD (dampening 0):  d = g*clip + wd*p;  b = first ? d : b*mu + d;  (b only with momentum)
//                       d = nesterov ? d + mu*b : b (momentum) | d;  p = p + neg_lr*d
//   AdamW:              g' = g*clip;  p' = p*decay;  m = m*beta1 + one_minus_beta1*g';
//                       v = v*beta2 + (one_minus_beta2*g')*g';
//                       p = p' + (neg_step*m) / (sqrt(v)/bc2_sqrt + eps)
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define PT_HOST_DEVICE __host__ __device__
#else
#define PT_HOST_DEVICE
#endif

namespace pt {

struct SgdScalars {
  float clip, wd, mu, neg_lr;
  bool momentum, first, nesterov;
};

struct AdamWScalars {
  float clip, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step;
};

// One element of each rule, for the host loops and the device kernels alike: the new parameter;
// the momentum buffer b (SGD with momentum) or the moments m and v (AdamW) updated in place.
PT_HOST_DEVICE inline float sgd_element(float p, float g, float& b, const SgdScalars& s) {
  const float d = g * s.clip + s.wd * p;
  if (!s.momentum) return p + s.neg_lr * d;
  b = s.first ? d : b * s.mu + d;
  return p + s.neg_lr * (s.nesterov ? d + s.mu * b : b);
}

PT_HOST_DEVICE inline float adamw_element(float p, float g, float& m, float& v, const AdamWScalars& s) {
  const float gi = g * s.clip;
  const float decayed = p * s.decay;
  m = m * s.beta1 + s.one_minus_beta1 * gi;
  v = v * s.beta2 + (s.one_minus_beta2 * gi) * gi;
#ifdef __CUDA_ARCH__
  const float root = sqrtf(v);
#else
  const float root = std::sqrt(v);
#endif
  return decayed + (s.neg_step * m) / (root / s.bc2_sqrt + s.eps);
}

}  // namespace pt
