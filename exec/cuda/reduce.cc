// exec/cuda/reduce.cc: ReduceSum and ReduceMean for float32 (reduce.cu). Axes, keepdims and
// noop_with_empty_axes as the CPU reads them (reduce_geometry, exec/kernel_geometry.h). The plan
// merges neighbouring dims of one kind, so [B, S, D] over D is one kept and one reduced dim.
#include <optional>

#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/plan.h"

namespace pt::cuda {
namespace {

// The plan over merged dims; nullopt when more than kMaxRank dims of a kind remain.
std::optional<ReducePlan> plan_reduce(const Dims& shape, const std::vector<bool>& reduced,
                                      bool mean) {
  struct Dim {
    int64_t size, stride;
    bool reduced;
  };
  std::vector<Dim> dims;  // outermost first, size-1 dims dropped, same-kind neighbours merged
  const Dims strides = strides_of(shape);
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (reduced[d]) count *= shape[d];
    if (shape[d] == 1) continue;
    if (!dims.empty() && dims.back().reduced == reduced[d]) {
      dims.back().size *= shape[d];
      dims.back().stride = strides[d];
    } else {
      dims.push_back({shape[d], strides[d], reduced[d]});
    }
  }
  ReducePlan p;
  p.count = count;
  p.scale = mean ? 1.f / static_cast<float>(count) : 1.f;  // count 0: 0 * inf gives NaN
  p.out_numel = 1;
  for (const Dim& d : dims) {
    if (d.reduced) {
      if (p.reduced_rank == kMaxRank) return std::nullopt;
      p.reduced_dims[p.reduced_rank] = d.size;
      p.reduced_strides[p.reduced_rank++] = d.stride;
    } else {
      if (p.kept_rank == kMaxRank) return std::nullopt;
      p.kept_dims[p.kept_rank] = d.size;
      p.kept_strides[p.kept_rank++] = d.stride;
      p.out_numel *= d.size;
    }
  }
  p.inner_reduced = !dims.empty() && dims.back().reduced;
  if (!p.inner_reduced) p.splits = sum_splits(p.count, p.out_numel);
  return p;
}

std::unique_ptr<Kernel> make_reduce(const KernelSpec& s, CudaContext& ctx, bool mean) {
  const auto reduced = reduce_geometry(s);
  if (!reduced || s.inputs[0].dtype != DType::kFloat32) return nullptr;
  const auto p = plan_reduce(s.inputs[0].shape, *reduced, mean);
  if (!p) return nullptr;
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([p = *p, stream](Args in, Args out, void* scratch) {
    launch_reduce(p, in[0].as<const float>(), out[0].as<float>(), scratch, stream);
  }, p->scratch_bytes());
}

// ReduceMax, ReduceMin, ReduceProd: one thread per output walking its elements (reduce.cu).
std::unique_ptr<Kernel> make_reduce_walk(const KernelSpec& s, CudaContext& ctx, ReduceWalk op) {
  const auto reduced = reduce_geometry(s);
  if (!reduced || !reduce_walk_supported(op, s.inputs[0].dtype)) return nullptr;
  const auto p = plan_reduce(s.inputs[0].shape, *reduced, false);
  if (!p) return nullptr;
  const DType t = s.inputs[0].dtype;
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=, p = *p](Args in, Args out, void*) {
    launch_reduce_walk(op, t, p, in[0].data, out[0].data, stream);
  });
}

}  // namespace

std::unique_ptr<Kernel> make_reduce_max(const KernelSpec& s, CudaContext& c) { return make_reduce_walk(s, c, ReduceWalk::kMax); }
std::unique_ptr<Kernel> make_reduce_min(const KernelSpec& s, CudaContext& c) { return make_reduce_walk(s, c, ReduceWalk::kMin); }
std::unique_ptr<Kernel> make_reduce_prod(const KernelSpec& s, CudaContext& c) { return make_reduce_walk(s, c, ReduceWalk::kProd); }
std::unique_ptr<Kernel> make_reduce_mean(const KernelSpec& s, CudaContext& c) { return make_reduce(s, c, true); }
std::unique_ptr<Kernel> make_reduce_sum(const KernelSpec& s, CudaContext& c) { return make_reduce(s, c, false); }

}  // namespace pt::cuda
