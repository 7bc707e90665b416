// exec/cpu/cpu_kernels.h: every CPU kernel factory, grouped by op family (one .cc per family,
// forward and, later, backward together). The op list is exec/kernel_registry.h's.
#pragma once

#include <cstdint>
#include <functional>

#include "exec/kernel.h"
#include "exec/window.h"

namespace pt::cpu {

// elementwise.cc: numpy broadcasting binary ops, Equal, Where;
// elementwise_ops.cc: unary activations, Clip, Cast, Dropout
std::unique_ptr<Kernel> make_add(const KernelSpec& s);
std::unique_ptr<Kernel> make_sub(const KernelSpec& s);
std::unique_ptr<Kernel> make_mul(const KernelSpec& s);
std::unique_ptr<Kernel> make_div(const KernelSpec& s);
std::unique_ptr<Kernel> make_pow(const KernelSpec& s);
std::unique_ptr<Kernel> make_equal(const KernelSpec& s);
std::unique_ptr<Kernel> make_where(const KernelSpec& s);
std::unique_ptr<Kernel> make_sqrt(const KernelSpec& s);
std::unique_ptr<Kernel> make_neg(const KernelSpec& s);
std::unique_ptr<Kernel> make_reciprocal(const KernelSpec& s);
std::unique_ptr<Kernel> make_is_nan(const KernelSpec& s);
std::unique_ptr<Kernel> make_sin(const KernelSpec& s);
// HardSigmoid: y = max(0, min(1, alpha x + beta)); HardSwish: y = x * HardSigmoid(x; 1/6, 1/2).
std::unique_ptr<Kernel> make_hard_sigmoid(const KernelSpec& s);
std::unique_ptr<Kernel> make_hard_swish(const KernelSpec& s);
std::unique_ptr<Kernel> make_cos(const KernelSpec& s);
// scan.cc: CumSum (axis constant input 1; exclusive, reverse), float32, float64 and int64.
std::unique_ptr<Kernel> make_cumsum(const KernelSpec& s);
std::unique_ptr<Kernel> make_relu(const KernelSpec& s);
std::unique_ptr<Kernel> make_erf(const KernelSpec& s);
std::unique_ptr<Kernel> make_gelu(const KernelSpec& s);
std::unique_ptr<Kernel> make_tanh(const KernelSpec& s);
std::unique_ptr<Kernel> make_sigmoid(const KernelSpec& s);
std::unique_ptr<Kernel> make_clip(const KernelSpec& s);
std::unique_ptr<Kernel> make_cast(const KernelSpec& s);
std::unique_ptr<Kernel> make_dropout(const KernelSpec& s);

// linalg.cc: MatMul and Gemm on oneDNN matmul; small_product.cc: the small ones of inference
// programs (a constant B, at most 2^18 multiply-adds) as a loop, nullptr for any other
std::unique_ptr<Kernel> make_matmul(const KernelSpec& s);
std::unique_ptr<Kernel> make_gemm(const KernelSpec& s);
std::unique_ptr<Kernel> make_small_product(const KernelSpec& s);

// nn.cc: convolution, pooling, LayerNormalization on oneDNN primitives;
// nn_channel.cc: BatchNormalization and GlobalAveragePool as plain loops (oneDNN 2.6 has only a
// slow reference path for plain NCHW); softmax.cc: Softmax and LogSoftmax as row loops along the
// last axis (with the element-wise nodes fused into them, row_chain.h), on oneDNN along others
std::unique_ptr<Kernel> make_conv(const KernelSpec& s);
std::unique_ptr<Kernel> make_max_pool(const KernelSpec& s);
std::unique_ptr<Kernel> make_average_pool(const KernelSpec& s);
std::unique_ptr<Kernel> make_global_average_pool(const KernelSpec& s);
std::unique_ptr<Kernel> make_batch_norm(const KernelSpec& s);
std::unique_ptr<Kernel> make_layer_norm(const KernelSpec& s);
std::unique_ptr<Kernel> make_softmax(const KernelSpec& s);
std::unique_ptr<Kernel> make_log_softmax(const KernelSpec& s);

// movement.cc: reshapes (copies), Transpose, Concat, Split, Slice, Gather, Expand, reductions
std::unique_ptr<Kernel> make_reshape(const KernelSpec& s);   // Reshape, Flatten, Squeeze,
                                                             // Unsqueeze, Identity: a copy
std::unique_ptr<Kernel> make_transpose(const KernelSpec& s);
std::unique_ptr<Kernel> make_concat(const KernelSpec& s);
std::unique_ptr<Kernel> make_split(const KernelSpec& s);
std::unique_ptr<Kernel> make_slice(const KernelSpec& s);
std::unique_ptr<Kernel> make_gather(const KernelSpec& s);
std::unique_ptr<Kernel> make_expand(const KernelSpec& s);
std::unique_ptr<Kernel> make_reduce_mean(const KernelSpec& s);
std::unique_ptr<Kernel> make_reduce_sum(const KernelSpec& s);
// dst (cols x rows) = src (rows x cols)^T, both row-major float32, planned once: the Transpose
// kernel's tiled copy, on `threads` threads. Gemm copies an operand stored transposed with it.
std::function<void(const float* src, float* dst)> matrix_transpose(int64_t rows, int64_t cols, int threads);

// Masks, comparisons and shape arithmetic computed at run time: elementwise.cc (comparisons,
// And/Or/Xor, Min/Max, Mod under broadcasting), elementwise_ops.cc (Not, Abs, Floor, Ceil, Exp),
// movement.cc (Trilu, Tile), reduce.cc (ReduceMax, ReduceMin, ReduceProd)
std::unique_ptr<Kernel> make_less(const KernelSpec& s);
std::unique_ptr<Kernel> make_greater(const KernelSpec& s);
std::unique_ptr<Kernel> make_less_or_equal(const KernelSpec& s);
std::unique_ptr<Kernel> make_greater_or_equal(const KernelSpec& s);
std::unique_ptr<Kernel> make_logical_and(const KernelSpec& s);
std::unique_ptr<Kernel> make_logical_or(const KernelSpec& s);
std::unique_ptr<Kernel> make_logical_xor(const KernelSpec& s);
std::unique_ptr<Kernel> make_logical_not(const KernelSpec& s);
std::unique_ptr<Kernel> make_min(const KernelSpec& s);
std::unique_ptr<Kernel> make_max(const KernelSpec& s);
std::unique_ptr<Kernel> make_mod(const KernelSpec& s);
std::unique_ptr<Kernel> make_abs(const KernelSpec& s);
std::unique_ptr<Kernel> make_floor(const KernelSpec& s);
std::unique_ptr<Kernel> make_ceil(const KernelSpec& s);
std::unique_ptr<Kernel> make_exp(const KernelSpec& s);
std::unique_ptr<Kernel> make_trilu(const KernelSpec& s);
std::unique_ptr<Kernel> make_tile(const KernelSpec& s);
std::unique_ptr<Kernel> make_reduce_max(const KernelSpec& s);
std::unique_ptr<Kernel> make_reduce_min(const KernelSpec& s);
std::unique_ptr<Kernel> make_reduce_prod(const KernelSpec& s);

// Backward kernels, pipetrain-domain ops (core/pipetrain_ops.h is their specification).
// elementwise_grad.cc: activation gradients on oneDNN's eltwise backward (ErfGrad a loop);
// softmax.cc: SoftmaxGrad and LogSoftmaxGrad, as the forward
std::unique_ptr<Kernel> make_relu_grad(const KernelSpec& s);
std::unique_ptr<Kernel> make_clip_grad(const KernelSpec& s);
std::unique_ptr<Kernel> make_erf_grad(const KernelSpec& s);
std::unique_ptr<Kernel> make_gelu_grad(const KernelSpec& s);
std::unique_ptr<Kernel> make_softmax_grad(const KernelSpec& s);
std::unique_ptr<Kernel> make_log_softmax_grad(const KernelSpec& s);

// nn_grad.cc: Conv gradients on oneDNN's convolution backward (a depthwise Conv's on depthwise.cc's
// loops where they take it), AveragePoolGrad on pooling_v2 backward, MaxPoolGrad a loop;
// nn_grad_norm.cc: LayerNormGrad and BatchNormGrad loops
std::unique_ptr<Kernel> make_conv_grad_input(const KernelSpec& s);
// A depthwise Conv between plain tensors, without epilogue, as one of pipetrain's own loops
// (depthwise.cc, beside the loops that run its gradients): on maps of at most 4 pixels and 16
// channels or more (DepthwiseSmallMaps), or 2-D of stride 1, undilated, on fewer than 16 channels
// whose output rows are 16 wide or more (DepthwisePlaneConv); nullptr for any other conv.
// make_conv tries it before oneDNN.
std::unique_ptr<Kernel> make_depthwise_conv(const KernelSpec& s, const Window& w, int64_t group);
std::unique_ptr<Kernel> make_conv_grad_weight(const KernelSpec& s);
std::unique_ptr<Kernel> make_max_pool_grad(const KernelSpec& s);
std::unique_ptr<Kernel> make_average_pool_grad(const KernelSpec& s);
std::unique_ptr<Kernel> make_layer_norm_grad(const KernelSpec& s);
std::unique_ptr<Kernel> make_batch_norm_grad(const KernelSpec& s);

// movement_grad.cc: GatherGrad, and ONNX Pad (constant mode), Slice's gradient
std::unique_ptr<Kernel> make_gather_grad(const KernelSpec& s);
std::unique_ptr<Kernel> make_pad(const KernelSpec& s);

// Training forward ops that autodiff/training_mode.h puts in the graph: batch_norm_train.cc
// (BatchNormTraining) and dropout_seeded.cc (SeededDropout, SeededBernoulli), plain loops
std::unique_ptr<Kernel> make_batch_norm_training(const KernelSpec& s);
std::unique_ptr<Kernel> make_seeded_dropout(const KernelSpec& s);
std::unique_ptr<Kernel> make_seeded_bernoulli(const KernelSpec& s);

// loss.cc: the fused softmax cross-entropy loss and its gradient
std::unique_ptr<Kernel> make_softmax_cross_entropy(const KernelSpec& s);
std::unique_ptr<Kernel> make_softmax_cross_entropy_grad(const KernelSpec& s);

// attention.cc: FusedAttention and FusedAttentionGrad, tiled loops that never hold the scores
std::unique_ptr<Kernel> make_fused_attention(const KernelSpec& s);
std::unique_ptr<Kernel> make_fused_attention_grad(const KernelSpec& s);

}  // namespace pt::cpu
