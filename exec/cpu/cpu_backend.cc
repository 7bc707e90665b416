#include "exec/cpu/cpu_backend.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <string>

#include "core/error.h"
#include "exec/cpu/cpu_kernels.h"

namespace pt {
namespace {

// The CPU kernel registry: (domain::)op type -> factory. One list, read top to bottom.
const std::map<std::string, KernelFactory>& registry() {
  using namespace cpu;
  static const std::map<std::string, KernelFactory> r = {
      {"Add", make_add},
      {"Sub", make_sub},
      {"Mul", make_mul},
      {"Div", make_div},
      {"Pow", make_pow},
      {"Equal", make_equal},
      {"Where", make_where},
      {"Sqrt", make_sqrt},
      {"Neg", make_neg},
      {"Relu", make_relu},
      {"Erf", make_erf},
      {"Gelu", make_gelu},
      {"com.microsoft::Gelu", make_gelu},
      {"Tanh", make_tanh},
      {"Sigmoid", make_sigmoid},
      {"Clip", make_clip},
      {"Cast", make_cast},
      {"Dropout", make_dropout},
      {"MatMul", make_matmul},
      {"Gemm", make_gemm},
      {"Conv", make_conv},
      {"MaxPool", make_max_pool},
      {"AveragePool", make_average_pool},
      {"GlobalAveragePool", make_global_average_pool},
      {"BatchNormalization", make_batch_norm},
      {"LayerNormalization", make_layer_norm},
      {"Softmax", make_softmax},
      {"LogSoftmax", make_log_softmax},
      {"Reshape", make_reshape},
      {"Flatten", make_reshape},
      {"Squeeze", make_reshape},
      {"Unsqueeze", make_reshape},
      {"Identity", make_reshape},
      {"Transpose", make_transpose},
      {"Concat", make_concat},
      {"Split", make_split},
      {"Slice", make_slice},
      {"Gather", make_gather},
      {"Expand", make_expand},
      {"ReduceMean", make_reduce_mean},
      {"ReduceSum", make_reduce_sum},
      {"Pad", make_pad},
      // Training forward ops of the pipetrain domain (autodiff/training_mode.h).
      {"pipetrain::BatchNormTraining", make_batch_norm_training},
      {"pipetrain::SeededDropout", make_seeded_dropout},
      // Backward ops of the pipetrain domain (core/pipetrain_ops.h).
      {"pipetrain::ReluGrad", make_relu_grad},
      {"pipetrain::ClipGrad", make_clip_grad},
      {"pipetrain::ErfGrad", make_erf_grad},
      {"pipetrain::GeluGrad", make_gelu_grad},
      {"pipetrain::SoftmaxGrad", make_softmax_grad},
      {"pipetrain::LogSoftmaxGrad", make_log_softmax_grad},
      {"pipetrain::LayerNormGrad", make_layer_norm_grad},
      {"pipetrain::BatchNormGrad", make_batch_norm_grad},
      {"pipetrain::ConvGradInput", make_conv_grad_input},
      {"pipetrain::ConvGradWeight", make_conv_grad_weight},
      {"pipetrain::MaxPoolGrad", make_max_pool_grad},
      {"pipetrain::AveragePoolGrad", make_average_pool_grad},
      {"pipetrain::GatherGrad", make_gather_grad},
      {"pipetrain::SoftmaxCrossEntropy", make_softmax_cross_entropy},
      {"pipetrain::SoftmaxCrossEntropyGrad", make_softmax_cross_entropy_grad},
  };
  return r;
}

std::string key(const Node& n) {
  return n.domain.empty() || n.domain == "ai.onnx" ? n.op_type : n.domain + "::" + n.op_type;
}

}  // namespace

KernelFactory cpu_kernel_factory(const std::string& op_key) {
  auto it = registry().find(op_key);
  return it == registry().end() ? nullptr : it->second;
}

struct CpuBackend::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

CpuBackend::CpuBackend(int threads) : impl_(std::make_unique<Impl>()) {
  PT_CHECK(threads >= 1);
  ctx_.engine = &impl_->engine;
  ctx_.stream = &impl_->stream;
  ctx_.threads = threads;
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::supports(const KernelSpec& spec) const {
  auto it = registry().find(key(spec.node));
  if (it == registry().end()) return "the CPU backend has no kernel for " + key(spec.node);
  if (!it->second(spec)) {
    std::string types;
    for (const TensorType& t : spec.inputs) types += (types.empty() ? "" : ", ") + t.str();
    return "the CPU kernel for " + key(spec.node) + " does not take inputs (" + types +
           ") with these attributes";
  }
  return "";
}

std::unique_ptr<Kernel> CpuBackend::create_kernel(const KernelSpec& spec) const {
  auto it = registry().find(key(spec.node));
  return it == registry().end() ? nullptr : it->second(spec);
}

void CpuBackend::bind_thread() { omp_set_num_threads(ctx_.threads); }

void CpuBackend::synchronize() { impl_->stream.wait(); }

}  // namespace pt
