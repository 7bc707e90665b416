// core/pipetrain_ops.h: the ops of the "pipetrain" domain, which autodiff emits where one fused
// kernel beats a chain of standard ops (and autodiff/training_mode.h where a training forward
// differs from the model's). This comment is their specification: the CPU kernels
// (exec/cpu/*_grad*.cc, loss.cc, batch_norm_train.cc, dropout_seeded.cc) implement it, and the
// portable lowering (autodiff/portable.cc) rewrites each into standard ONNX ops that onnxruntime
// runs. All tensors are float32 unless said otherwise; "reduce over A" sums over the axes A.
// Attributes use ONNX's names for the forward op.
//
//   ReluGrad(dY, Y) -> dX              dX = dY where Y > 0, else 0
//   ClipGrad(dY, X, min?, max?) -> dX  dX = dY where min < X < max (strict; an omitted bound is
//                                      no bound), else 0. min and max are scalars.
//   ErfGrad(dY, X) -> dX               dX = dY * 2/sqrt(pi) * exp(-X^2)
//   GeluGrad(dY, X) -> dX              dX = dY * gelu'(X); approximate = "none" (default):
//                                        gelu'(x) = Phi(x) + x * phi(x), Phi the normal CDF, phi
//                                        its density; "tanh": the derivative of
//                                        0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   SoftmaxGrad(dY, Y) -> dX           axis (default -1): dX = Y * (dY - sum_axis(dY * Y))
//   LogSoftmaxGrad(dY, Y) -> dX        axis (default -1): dX = dY - exp(Y) * sum_axis(dY)
//   LayerNormGrad(dY, X, Scale, Mean, InvStdDev) -> (dX, dScale?, dBias?)
//                                      axis (default -1), normalised axes A = [axis, rank).
//                                      Mean and InvStdDev are LayerNormalization's optional
//                                      outputs (shape X.shape[:axis] + [1]*len(A)).
//                                        xhat = (X - Mean) * InvStdDev, g = dY * Scale
//                                        dX = InvStdDev * (g - mean_A(g) - xhat * mean_A(g * xhat))
//                                        dScale = reduce over [0, axis) of dY * xhat
//                                        dBias  = reduce over [0, axis) of dY
//   BatchNormGrad(dY, X, Scale) -> (dX, dScale?, dBias?)
//                                      training-mode BatchNormalization, epsilon (default 1e-5);
//                                      X is [N, C, ...]; statistics over R = all axes but 1:
//                                        mean, var = biased moments of X over R per channel
//                                        istd = 1 / sqrt(var + epsilon), xhat = (X - mean) * istd
//                                        dBias = sum_R(dY), dScale = sum_R(dY * xhat)
//                                        dX = Scale * istd * (dY - dBias/|R| - xhat * dScale/|R|)
//   BatchNormTraining(X, Scale, B) -> (Y, batch_mean?, batch_var?)
//                                      BatchNormalization's training forward, which
//                                      autodiff/training_mode.h puts in its place (kernel
//                                      exec/cpu/batch_norm_train.cc); epsilon (default 1e-5);
//                                      X is [N, C, ...], statistics over R as in BatchNormGrad,
//                                      |R| >= 2:
//                                        mean, var = biased moments of X over R per channel
//                                        Y = (X - mean) * Scale / sqrt(var + epsilon) + B
//                                        batch_mean = mean, batch_var = var * |R| / (|R| - 1)
//                                      (batch_var unbiased: what torch folds into running_var)
//   SeededDropout(X, key) -> (Y, mask?)
//                                      training Dropout whose mask is a pure function of (key,
//                                      stream, element index), so recompute and every schedule
//                                      draw the same mask (kernel exec/cpu/dropout_seeded.cc,
//                                      generator exec/cpu/seeded_uniform.h); ratio (float in
//                                      [0, 1)), stream (int: a hash of the node's name); key an
//                                      int64 scalar fed per micro-batch. With mix the finaliser
//                                      of splitmix64 and G = 0x9e3779b97f4a7c15 (mod 2^64):
//                                        base = mix(key ^ mix(stream))
//                                        u(i) = (mix(base + (i + 1) * G) >> 40) / 2^24
//                                        mask[i] = u(i) >= ratio (bool), Y = X * mask / (1 - ratio)
//                                      No portable form: lower_to_standard refuses it.
//   SeededBernoulli(P, key) -> Y       training Bernoulli draw (the stochastic-depth mask as
//                                      onnx_import/random_rewrite.h reads it), seeded as
//                                      SeededDropout: stream, the same base and u(i);
//                                        Y[i] = u(i) < P[i] ? 1 : 0, P and Y of one shape
//                                      Not differentiable (a draw is piecewise constant in P).
//                                      No portable form.
//   ConvGradInput(dY, W) -> dX         Conv's auto_pad (NOTSET only), dilations, group, pads,
//                                      strides, plus input_shape (ints, X's full shape): the
//                                      gradient of Conv(X, W) with respect to X
//   ConvGradWeight(dY, X) -> dW        the same attributes plus weight_shape (ints): the gradient
//                                      of Conv(X, W) with respect to W
//   MaxPoolGrad(dY, X) -> dX           MaxPool's kernel_shape, strides, pads, dilations,
//                                      ceil_mode: each dY element goes to the first maximum of its
//                                      window in row-major order (padding never wins); windows
//                                      that overlap add up
//   AveragePoolGrad(dY) -> dX          AveragePool's kernel_shape, strides, pads, ceil_mode,
//                                      count_include_pad, plus input_shape (ints): each dY
//                                      element spread evenly over the cells its average divided by
//   GatherGrad(dY, Indices) -> dData   axis (default 0), data_shape (ints): zeros of data_shape
//                                      with dY's rows added at Indices (int64 or int32; negative
//                                      indices count from the end; repeated indices add up)
//   SoftmaxCrossEntropy(Logits, Target, Scale) -> Loss
//                                      classes on the last axis of Logits [..., C]; Target is
//                                      int64 of Logits.shape[:-1]; Scale a float scalar;
//                                      ignore_index (default -100). Loss is a scalar:
//                                        Scale * sum over valid t of (logsumexp(Logits[t]) -
//                                        Logits[t, Target[t]]), valid: Target[t] != ignore_index
//   SoftmaxCrossEntropyGrad(dLoss, Logits, Target, Scale) -> dLogits
//                                      dLogits[t] = dLoss * Scale * (softmax(Logits[t]) -
//                                      onehot(Target[t])) for valid t, 0 for ignored t
//   FusedAttention(Q, K, V, Mask?) -> (Y, LogSumExp?)
//                                      scaled dot-product attention as one kernel that never
//                                      holds the scores (exec/cpu/attention.cc; CPU only);
//                                      scale (float, default 1/sqrt(D)), causal (int, default 0).
//                                      Q [B, H, S, D], K [B, Hkv, T, D], V [B, Hkv, T, Dv], H a
//                                      multiple of Hkv (head h reads kv head h / (H / Hkv)); Mask
//                                      float32 (added) or bool (true: the key is seen),
//                                      broadcastable (numpy) to [B, H, S, T]:
//                                        s_ij = scale * q_i . k_j + mask_ij, -inf where causal and
//                                               j > i (top-left aligned) or where a bool mask is false
//                                        LogSumExp_i = log sum_j exp(s_ij)         [B, H, S]
//                                        Y_i = sum_j exp(s_ij - LogSumExp_i) v_j   [B, H, S, Dv]
//                                      A row whose every s_ij is -inf has Y_i = mean_j v_j over
//                                      all T keys and LogSumExp_i = -inf: what the unfused
//                                      Softmax gives such a row (uniform, never NaN).
//   FusedAttentionGrad(dY, Q, K, V, Y, LogSumExp, Mask?) -> (dQ?, dK?, dV?)
//                                      the same attributes; dK and dV both or neither. With
//                                      p_ij = exp(s_ij - LogSumExp_i), delta_i = dY_i . Y_i:
//                                        ds_ij = p_ij * (dY_i . v_j - delta_i)
//                                        dQ_i = scale * sum_j ds_ij k_j
//                                        dK_j = scale * sum over i and the heads reading j of ds_ij q_i
//                                        dV_j = sum over i and the heads reading j of p_ij dY_i
//                                      A fully masked row (LogSumExp -inf) has p_ij = 1/T for
//                                      every key and ds_ij = 0 (no gradient reaches a score the
//                                      mask removed).
#pragma once

namespace pt {

inline constexpr const char* kPipetrainDomain = "pipetrain";

}  // namespace pt
