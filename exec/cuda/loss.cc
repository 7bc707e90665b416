// exec/cuda/loss.cc: SoftmaxCrossEntropy and SoftmaxCrossEntropyGrad (core/pipetrain_ops.h) on
// the custom kernels of loss.cu. Targets are the user's data: a bad one is reported through the
// fault table with the CPU kernel's message.
#include <optional>
#include <string>

#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/plan.h"

namespace pt::cuda {
namespace {

struct Rows {
  int64_t rows = 0, classes = 0, ignore_index = -100;
};

// Logits [..., C] float32 with C > 0, Target int64 of Logits.shape[:-1], Scale a float32 scalar.
std::optional<Rows> loss_rows(const KernelSpec& s, size_t logits, size_t target, size_t scale) {
  for (size_t i : {logits, target, scale})
    if (!s.has_input(i)) return std::nullopt;
  const TensorType &x = s.inputs[logits], &t = s.inputs[target], &sc = s.inputs[scale];
  if (x.dtype != DType::kFloat32 || x.shape.empty() || x.shape.back() < 1 ||
      t.dtype != DType::kInt64 || t.shape != Dims(x.shape.begin(), x.shape.end() - 1) ||
      sc.dtype != DType::kFloat32 || sc.numel() != 1)
    return std::nullopt;
  return Rows{t.numel(), x.shape.back(), s.node.attr_int("ignore_index", -100)};
}

DeviceFault* target_fault(CudaContext& ctx, const std::string& node, const Rows& r) {
  const int64_t classes = r.classes, ignore = r.ignore_index;
  return ctx.faults->add(
      {node,
       [classes](long long v, long long row) {
         return "target " + std::to_string(v) + " at row " + std::to_string(row) +
                " is outside the classes [0, " + std::to_string(classes) + ")";
       },
       "check the labels against the number of classes, or mark ignored rows with ignore_index (" +
           std::to_string(ignore) + ")"});
}

}  // namespace

// SoftmaxCrossEntropy(Logits, Target, Scale) -> Loss (float32 scalar); row losses in scratch.
std::unique_ptr<Kernel> make_softmax_cross_entropy(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 3 || s.outputs.size() != 1 || !wanted(s, 0) ||
      s.outputs[0].dtype != DType::kFloat32 || s.outputs[0].numel() != 1)
    return nullptr;
  const auto r = loss_rows(s, 0, 1, 2);
  if (!r) return nullptr;
  DeviceFault* fault = target_fault(ctx, "SoftmaxCrossEntropy node '" + s.node.name + "'", *r);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel(
      [r = *r, fault, stream](Args in, Args out, void* scratch) {
        launch_softmax_cross_entropy(r.rows, r.classes, r.ignore_index, in[0].as<const float>(),
                                     in[1].as<const int64_t>(), in[2].as<const float>(),
                                     static_cast<double*>(scratch), out[0].as<float>(), fault,
                                     stream);
      },
      static_cast<size_t>(r->rows) * sizeof(double));
}

// SoftmaxCrossEntropyGrad(dLoss, Logits, Target, Scale) -> dLogits.
std::unique_ptr<Kernel> make_softmax_cross_entropy_grad(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 4 || !s.has_input(0) || s.inputs[0].dtype != DType::kFloat32 ||
      s.inputs[0].numel() != 1 || s.outputs.size() != 1 || !wanted(s, 0))
    return nullptr;
  const auto r = loss_rows(s, 1, 2, 3);
  if (!r || s.outputs[0] != s.inputs[1]) return nullptr;
  DeviceFault* fault = target_fault(ctx, "SoftmaxCrossEntropyGrad node '" + s.node.name + "'", *r);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([r = *r, fault, stream](Args in, Args out, void*) {
    launch_softmax_cross_entropy_grad(r.rows, r.classes, r.ignore_index, in[0].as<const float>(),
                                      in[1].as<const float>(), in[2].as<const int64_t>(),
                                      in[3].as<const float>(), out[0].as<float>(), fault, stream);
  });
}

}  // namespace pt::cuda
