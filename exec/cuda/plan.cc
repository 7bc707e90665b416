#include "exec/cuda/plan.h"

#include <algorithm>

namespace pt::cuda {
namespace {

class FnKernel final : public Kernel {
 public:
  FnKernel(RunFn run, size_t scratch) : run_(std::move(run)), scratch_(scratch) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    run_(in, out, scratch);
  }
  size_t scratch_bytes() const override { return scratch_; }

 private:
  RunFn run_;
  size_t scratch_;
};

}  // namespace

std::unique_ptr<Kernel> fn_kernel(RunFn run, size_t scratch_bytes) {
  return std::make_unique<FnKernel>(std::move(run), scratch_bytes);
}

std::optional<Broadcast> make_broadcast(const KernelSpec& s, int n) {
  static_assert(kMaxRank == kMaxBroadcastRank);
  const auto g = broadcast_geometry(s, n);
  if (!g) return std::nullopt;
  Broadcast bc;
  bc.rank = g->rank;
  bc.numel = g->numel;
  for (int d = 0; d < g->rank; ++d) {
    bc.dims[d] = g->dims[d];
    for (int k = 0; k < 3; ++k) bc.strides[k][d] = g->strides[k][d];
  }
  return bc;
}

std::optional<StridedCopy> make_strided_copy(const CopyGeometry& g, size_t esize) {
  const std::vector<CopyDim> dims = merge_copy_dims(g.shape, g.in_stride, g.out_stride);
  if (dims.size() > static_cast<size_t>(kMaxCopyDims)) return std::nullopt;
  StridedCopy p;
  p.numel = product(g.shape, 0, g.shape.size());
  p.in_offset = g.in_offset;
  p.out_offset = g.out_offset;
  p.esize = static_cast<int>(esize);
  p.rank = static_cast<int>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    p.dims[d] = dims[d].size;
    p.in_stride[d] = dims[d].in;
    p.out_stride[d] = dims[d].out;
  }
  return p;
}

int movable_size(DType t) {
  switch (t) {
    case DType::kFloat32: case DType::kInt32: return 4;
    case DType::kInt64: case DType::kFloat64: return 8;
    case DType::kBool: case DType::kInt8: case DType::kUInt8: return 1;
    case DType::kFloat16: case DType::kBFloat16: return 2;
    default: return 0;
  }
}

}  // namespace pt::cuda
