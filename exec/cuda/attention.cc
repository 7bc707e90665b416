// exec/cuda/attention.cc: FusedAttention and FusedAttentionGrad (core/pipetrain_ops.h) in fp32 on
// the tiled kernels of attention.cu, which take the CPU kernel's algorithm and its fully masked
// rows. The geometry is kernel_geometry.h's, as the CPU's; heads of up to 256 dims.
// Not yet run on a GPU: the import passes fuse attention for CPU programs only
// (TrainConfig::attention_fused_from), so these kernels run in the CUDA kernel tests alone
// (tests/exec/cuda/kernel_cases.cc) until those have passed on one.
#include <optional>

#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/launch.h"
#include "exec/cuda/plan.h"
#include "exec/kernel_geometry.h"

namespace pt::cuda {
namespace {

// The geometry where the launchers take it, else nullopt.
std::optional<AttentionGeometry> supported(std::optional<AttentionGeometry> g) {
  if (g && !attention_supported(*g)) return std::nullopt;
  return g;
}

float* output_or_null(Args out, size_t k) { return k < out.size() && out[k].present() ? out[k].as<float>() : nullptr; }

}  // namespace

// FusedAttention(Q, K, V, Mask?) -> (Y, LogSumExp?).
std::unique_ptr<Kernel> make_fused_attention(const KernelSpec& s, CudaContext& ctx) {
  const std::optional<AttentionGeometry> g = supported(fused_attention_geometry(s));
  if (!g) return nullptr;
  const bool masked = s.has_input(3);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([g = *g, masked, stream](Args in, Args out, void*) {
    launch_fused_attention(g, in[0].as<const float>(), in[1].as<const float>(), in[2].as<const float>(),
                           masked ? in[3].data : nullptr, out[0].as<float>(), output_or_null(out, 1), stream);
  });
}

// FusedAttentionGrad(dY, Q, K, V, Y, LogSumExp, Mask?) -> (dQ?, dK?, dV?).
std::unique_ptr<Kernel> make_fused_attention_grad(const KernelSpec& s, CudaContext& ctx) {
  const std::optional<AttentionGeometry> g = supported(fused_attention_grad_geometry(s));
  if (!g) return nullptr;
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
