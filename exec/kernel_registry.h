// exec/kernel_registry.h: what every backend's kernel registry is made of. One explicit list of
// the ops that have kernels (PT_KERNEL_OPS, read top to bottom), shared by the backends so that
// each registers the same ops in the same order, and every CUDA kernel has the CPU kernel it is
// tested against; the registry (op key -> factory) each backend builds from it; and the reason
// Backend::supports() gives when a node has no kernel.
//
// A backend registers its factories (make_<name> in its own namespace) with
//   #define PT_CPU_ENTRY(key, name) {key, cpu::make_##name},
//   static const KernelRegistry<KernelFactory> r({PT_KERNEL_OPS(PT_CPU_ENTRY)});
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/ir.h"
#include "exec/kernel.h"

// X(key, name): the op key ("Op" for ONNX's default domain, "domain::Op" otherwise) and the name
// of its factory, make_<name>, in each backend. Several keys may share a factory.
#define PT_KERNEL_OPS(X)                                                                   \
  X("Add", add)                                                                            \
  X("Sub", sub)                                                                            \
  X("Mul", mul)                                                                            \
  X("Div", div)                                                                            \
  X("Pow", pow)                                                                            \
  X("Equal", equal)                                                                        \
  X("Where", where)                                                                        \
  X("Sqrt", sqrt)                                                                          \
  X("Neg", neg)                                                                            \
  X("Reciprocal", reciprocal)                                                              \
  X("IsNaN", is_nan)                                                                       \
  X("Sin", sin)                                                                            \
  X("Cos", cos)                                                                            \
  X("CumSum", cumsum)                                                                      \
  X("Relu", relu)                                                                          \
  X("Erf", erf)                                                                            \
  X("Gelu", gelu)                                                                          \
  X("com.microsoft::Gelu", gelu)                                                           \
  X("Tanh", tanh)                                                                          \
  X("Sigmoid", sigmoid)                                                                    \
  X("HardSigmoid", hard_sigmoid)                                                           \
  X("HardSwish", hard_swish)                                                               \
  X("Clip", clip)                                                                          \
  X("Cast", cast)                                                                          \
  X("Dropout", dropout)                                                                    \
  X("MatMul", matmul)                                                                      \
  X("Gemm", gemm)                                                                          \
  X("Conv", conv)                                                                          \
  X("MaxPool", max_pool)                                                                   \
  X("AveragePool", average_pool)                                                           \
  X("GlobalAveragePool", global_average_pool)                                              \
  X("BatchNormalization", batch_norm)                                                      \
  X("LayerNormalization", layer_norm)                                                      \
  X("Softmax", softmax)                                                                    \
  X("LogSoftmax", log_softmax)                                                             \
  X("Reshape", reshape)                                                                    \
  X("Flatten", reshape)                                                                    \
  X("Squeeze", reshape)                                                                    \
  X("Unsqueeze", reshape)                                                                  \
  X("Identity", reshape)                                                                   \
  X("Transpose", transpose)                                                                \
  X("Concat", concat)                                                                      \
  X("Split", split)                                                                        \
  X("Slice", slice)                                                                        \
  X("Gather", gather)                                                                      \
  X("Expand", expand)                                                                      \
  X("ReduceMean", reduce_mean)                                                             \
  X("ReduceSum", reduce_sum)                                                               \
  X("Pad", pad)                                                                            \
  /* Masks, comparisons and shape arithmetic computed at run time. */                      \
  X("Less", less)                                                                          \
  X("Greater", greater)                                                                    \
  X("LessOrEqual", less_or_equal)                                                          \
  X("GreaterOrEqual", greater_or_equal)                                                    \
  X("And", logical_and)                                                                    \
  X("Or", logical_or)                                                                      \
  X("Xor", logical_xor)                                                                    \
  X("Not", logical_not)                                                                    \
  X("Min", min)                                                                            \
  X("Max", max)                                                                            \
  X("Mod", mod)                                                                            \
  X("Abs", abs)                                                                            \
  X("Floor", floor)                                                                        \
  X("Ceil", ceil)                                                                          \
  X("Exp", exp)                                                                            \
  X("Trilu", trilu)                                                                        \
  X("Tile", tile)                                                                          \
  X("ReduceMax", reduce_max)                                                               \
  X("ReduceMin", reduce_min)                                                               \
  X("ReduceProd", reduce_prod)                                                             \
  /* Training forward ops of the pipetrain domain (autodiff/training_mode.h). */           \
  X("pipetrain::BatchNormTraining", batch_norm_training)                                   \
  X("pipetrain::SeededDropout", seeded_dropout)                                            \
  X("pipetrain::SeededBernoulli", seeded_bernoulli)                                        \
  /* Backward ops of the pipetrain domain (core/pipetrain_ops.h). */                       \
  X("pipetrain::ReluGrad", relu_grad)                                                      \
  X("pipetrain::ClipGrad", clip_grad)                                                      \
  X("pipetrain::ErfGrad", erf_grad)                                                        \
  X("pipetrain::GeluGrad", gelu_grad)                                                      \
  X("pipetrain::SoftmaxGrad", softmax_grad)                                                \
  X("pipetrain::LogSoftmaxGrad", log_softmax_grad)                                         \
  X("pipetrain::LayerNormGrad", layer_norm_grad)                                           \
  X("pipetrain::BatchNormGrad", batch_norm_grad)                                           \
  X("pipetrain::ConvGradInput", conv_grad_input)                                           \
  X("pipetrain::ConvGradWeight", conv_grad_weight)                                         \
  X("pipetrain::MaxPoolGrad", max_pool_grad)                                               \
  X("pipetrain::AveragePoolGrad", average_pool_grad)                                       \
  X("pipetrain::GatherGrad", gather_grad)                                                  \
  X("pipetrain::SoftmaxCrossEntropy", softmax_cross_entropy)                               \
  X("pipetrain::SoftmaxCrossEntropyGrad", softmax_cross_entropy_grad)                     \
  X("pipetrain::FusedAttention", fused_attention)                                          \
  X("pipetrain::FusedAttentionGrad", fused_attention_grad)

namespace pt {

// A node's registry key: "Op" in ONNX's default domain ("" or "ai.onnx"), else "domain::Op".
std::string op_key(const Node& n);

// Why a backend runs no kernel for the spec, for Backend::supports(): `backend` ("CPU", "CUDA")
// has no factory for the op (`registered` false), or its factory declined these input types and
// attributes.
std::string no_kernel_reason(const std::string& backend, const KernelSpec& spec, bool registered);

// Op key -> factory, in the list's order. Factory: a backend's factory type (nullptr-comparable).
template <class Factory>
class KernelRegistry {
 public:
  explicit KernelRegistry(std::vector<std::pair<std::string, Factory>> list)
      : list_(std::move(list)), map_(list_.begin(), list_.end()) {}

  // The factory for an op key, or nullptr.
  Factory find(const std::string& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  Factory find(const Node& n) const { return find(op_key(n)); }

  // Every key, in the list's order.
  std::vector<std::string> ops() const {
    std::vector<std::string> keys;
    for (const auto& entry : list_) keys.push_back(entry.first);
    return keys;
  }

 private:
  std::vector<std::pair<std::string, Factory>> list_;
  std::map<std::string, Factory> map_;
};

}  // namespace pt
