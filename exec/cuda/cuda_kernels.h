// exec/cuda/cuda_kernels.h: every CUDA kernel factory, grouped by op family as the CPU's
// (exec/cpu/cpu_kernels.h), each the counterpart of the CPU factory of the same name and
// declining (nullptr) what it does not handle. The op list is exec/kernel_registry.h's.
// Factories run on the backend's device (CudaBackend makes it current) and may create library
// descriptors and choose algorithms there; run() only enqueues on ctx.stream.
#pragma once

#include <memory>

#include "exec/cuda/cuda_context.h"
#include "exec/kernel.h"
#include "exec/kernel_geometry.h"

namespace pt::cuda {

using CudaFactory = std::unique_ptr<Kernel> (*)(const KernelSpec& s, CudaContext& ctx);

// elementwise.cc: broadcasting binary ops, Where, unary ops, Clip, Cast, Dropout; custom kernels
std::unique_ptr<Kernel> make_add(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_sub(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_mul(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_div(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_pow(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_equal(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_where(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_sqrt(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_neg(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_reciprocal(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_is_nan(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_sin(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_hard_sigmoid(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_hard_swish(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_cos(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_cumsum(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_relu(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_erf(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_gelu(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_tanh(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_sigmoid(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_clip(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_cast(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_dropout(const KernelSpec& s, CudaContext& ctx);

// linalg.cc: MatMul on cuBLAS (strided-batched GEMM), Gemm on cublasLt (bias epilogue)
std::unique_ptr<Kernel> make_matmul(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_gemm(const KernelSpec& s, CudaContext& ctx);

// conv.cc: Conv on cuDNN; pool.cc: pooling on cuDNN (custom kernels for the geometries cuDNN
// lacks), GlobalAveragePool a reduction; norm.cc: BatchNormalization on cuDNN,
// LayerNormalization custom; softmax.cc: Softmax, LogSoftmax on cuDNN
std::unique_ptr<Kernel> make_conv(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_max_pool(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_average_pool(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_global_average_pool(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_batch_norm(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_layer_norm(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_softmax(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_log_softmax(const KernelSpec& s, CudaContext& ctx);

// movement.cc: reshapes (device copies), Transpose, Concat, Split, Slice, Expand (one strided
// copy kernel), Gather, Pad; reduce.cc: ReduceMean, ReduceSum
std::unique_ptr<Kernel> make_reshape(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_transpose(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_concat(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_split(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_slice(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_gather(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_expand(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_pad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_reduce_mean(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_reduce_sum(const KernelSpec& s, CudaContext& ctx);

// Masks, comparisons and shape arithmetic computed at run time: elementwise.cc/.cu (comparisons,
// And/Or/Xor, Min/Max, Mod under broadcasting), Not, Abs, Floor, Ceil, Exp,
// movement.cc/.cu (Trilu, Tile), reduce.cc/.cu (ReduceMax, ReduceMin, ReduceProd)
std::unique_ptr<Kernel> make_less(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_greater(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_less_or_equal(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_greater_or_equal(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_logical_and(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_logical_or(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_logical_xor(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_logical_not(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_min(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_max(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_mod(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_abs(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_floor(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_ceil(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_exp(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_trilu(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_tile(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_reduce_max(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_reduce_min(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_reduce_prod(const KernelSpec& s, CudaContext& ctx);

// Training forward ops of the pipetrain domain (autodiff/training_mode.h): elementwise.cc
// SeededDropout and SeededBernoulli (custom kernels, the CPU's generator), norm.cc
// BatchNormTraining (cuDNN)
std::unique_ptr<Kernel> make_seeded_dropout(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_seeded_bernoulli(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_batch_norm_training(const KernelSpec& s, CudaContext& ctx);

// Backward kernels, pipetrain-domain ops (core/pipetrain_ops.h is their specification).
// elementwise.cc: ReluGrad, ClipGrad, ErfGrad, GeluGrad (custom kernels); softmax.cc:
// SoftmaxGrad, LogSoftmaxGrad (cuDNN); conv.cc: ConvGradInput, ConvGradWeight (cuDNN);
// norm.cc: BatchNormGrad (cuDNN), LayerNormGrad (custom); pool.cc: MaxPoolGrad,
// AveragePoolGrad (custom); movement.cc: GatherGrad (custom); loss.cc: SoftmaxCrossEntropy and
// its gradient (custom)
std::unique_ptr<Kernel> make_relu_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_clip_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_erf_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_gelu_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_softmax_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_log_softmax_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_layer_norm_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_batch_norm_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_conv_grad_input(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_conv_grad_weight(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_max_pool_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_average_pool_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_gather_grad(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_softmax_cross_entropy(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_softmax_cross_entropy_grad(const KernelSpec& s, CudaContext& ctx);

// attention.cc: FusedAttention and FusedAttentionGrad: cuDNN's in bf16 and fp16 modes where it takes them,
// else fp32 tiled kernels that never hold the scores (attention.cu)
std::unique_ptr<Kernel> make_fused_attention(const KernelSpec& s, CudaContext& ctx);
std::unique_ptr<Kernel> make_fused_attention_grad(const KernelSpec& s, CudaContext& ctx);
// cudnn_attention.cc: the same two in bf16 or fp16 through cuDNN's fused attention, under
// Precision::kBf16 or kFp16 and without a mask; nullptr elsewhere or where cuDNN refuses the geometry
// (attention.cc's factories ask these first)
std::unique_ptr<Kernel> make_cudnn_attention(const AttentionGeometry& g, CudaContext& ctx);
std::unique_ptr<Kernel> make_cudnn_attention_grad(const AttentionGeometry& g, CudaContext& ctx);

}  // namespace pt::cuda
