// exec/cuda/attention.cc: FusedAttention and FusedAttentionGrad (core/pipetrain_ops.h): under
// Precision::kBf16 and kFp16 cuDNN's fused attention where it takes the node (cudnn_attention.cc), else in
// fp32 on the tiled kernels of attention.cu, which take the CPU kernel's algorithm and its fully
// masked rows. The geometry is kernel_geometry.h's, as the CPU's; heads of up to 256 dims.
#include <optional>

#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/launch.h"
#include "exec/cuda/plan.h"
#include "exec/kernel_geometry.h"

namespace pt::cuda {
namespace {

float* output_or_null(Args out, size_t k) { return k < out.size() && out[k].present() ? out[k].as<float>() : nullptr; }

}  // namespace

// FusedAttention(Q, K, V, Mask?) -> (Y, LogSumExp?).
std::unique_ptr<Kernel> make_fused_attention(const KernelSpec& s, CudaContext& ctx) {
  const std::optional<AttentionGeometry> g = fused_attention_geometry(s);
  if (!g) return nullptr;
  if (std::unique_ptr<Kernel> k = make_cudnn_attention(*g, ctx)) return k;
  if (!attention_supported(*g)) return nullptr;
  const bool masked = s.has_input(3);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([g = *g, masked, stream](Args in, Args out, void*) {
    launch_fused_attention(g, in[0].as<const float>(), in[1].as<const float>(), in[2].as<const float>(),
                           masked ? in[3].data : nullptr, out[0].as<float>(), output_or_null(out, 1), stream);
  });
}

// FusedAttentionGrad(dY, Q, K, V, Y, LogSumExp, Mask?) -> (dQ?, dK?, dV?).
std::unique_ptr<Kernel> make_fused_attention_grad(const KernelSpec& s, CudaContext& ctx) {
  const std::optional<AttentionGeometry> g = fused_attention_grad_geometry(s);
  if (!g) return nullptr;
  if (std::unique_ptr<Kernel> k = make_cudnn_attention_grad(*g, ctx)) return k;
  if (!attention_supported(*g)) return nullptr;
  const bool masked = s.has_input(6);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel(
      [g = *g, masked, stream](Args in, Args out, void* scratch) {
        launch_fused_attention_grad(g, in[0].as<const float>(), in[1].as<const float>(), in[2].as<const float>(),
                                    in[3].as<const float>(), in[4].as<const float>(), in[5].as<const float>(),
                                    masked ? in[6].data : nullptr, output_or_null(out, 0), output_or_null(out, 1),
                                    output_or_null(out, 2), scratch, stream);
      },
      fused_attention_grad_scratch(*g));
}

}  // namespace pt::cuda
