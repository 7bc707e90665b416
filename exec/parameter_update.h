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

namespace pt {

struct SgdScalars {
  float clip, wd, mu, neg_lr;
  bool momentum, first, nesterov;
};

struct AdamWScalars {
  float clip, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step;
};

}  // namespace pt
