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

// `in` right-aligned to `rank` dims, padded with leading 1s; nullopt if it has more dims.
std::optional<Dims> align(const Dims& in, size_t rank) {
  if (in.size() > rank) return std::nullopt;
  Dims out(rank - in.size(), 1);
  out.insert(out.end(), in.begin(), in.end());
  return out;
}

}  // namespace

std::unique_ptr<Kernel> fn_kernel(RunFn run, size_t scratch_bytes) {
  return std::make_unique<FnKernel>(std::move(run), scratch_bytes);
}

bool has_io(const KernelSpec& s, size_t inputs) {
  for (size_t i = 0; i < inputs; ++i)
    if (!s.has_input(i)) return false;
  return wanted(s, 0);
}

bool wanted(const KernelSpec& s, size_t k) {
  return k < s.outputs.size() && s.outputs[k].dtype != DType::kUndefined;
}

bool float_io(const KernelSpec& s) {
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (s.has_input(i) && s.inputs[i].dtype != DType::kFloat32) return false;
  for (size_t k = 0; k < s.outputs.size(); ++k)
    if (wanted(s, k) && s.outputs[k].dtype != DType::kFloat32) return false;
  return wanted(s, 0);
}

int64_t product(const Dims& v, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= v[i];
  return p;
}

int64_t normalize_axis(int64_t axis, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) return -1;
  return axis < 0 ? axis + r : axis;
}

Dims strides_of(const Dims& shape) {
  Dims st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

std::optional<Dims> constant_ints(const KernelSpec& s, size_t i) {
  const Tensor* t = s.constant(i);
  if (!t) return std::nullopt;
  const int64_t n = t->type.numel();
  if (t->type.dtype == DType::kInt64) return Dims(t->as<int64_t>(), t->as<int64_t>() + n);
  if (t->type.dtype == DType::kInt32) return Dims(t->as<int32_t>(), t->as<int32_t>() + n);
  return std::nullopt;
}

std::optional<Broadcast> make_broadcast(const KernelSpec& s, int n) {
  const Dims& out = s.outputs[0].shape;
  if (out.size() > static_cast<size_t>(kMaxRank)) return std::nullopt;
  std::vector<Dims> full(3, Dims(out.size(), 0));
  for (int k = 0; k < n; ++k) {
    const auto in = align(s.inputs[static_cast<size_t>(k)].shape, out.size());
    if (!in) return std::nullopt;
    int64_t stride = 1;
    for (size_t d = out.size(); d-- > 0;) {
      if ((*in)[d] != out[d] && (*in)[d] != 1) return std::nullopt;
      full[static_cast<size_t>(k)][d] = (*in)[d] == 1 ? 0 : stride;
      stride *= (*in)[d];
    }
  }
  Broadcast bc;
  bc.numel = s.outputs[0].numel();
  bc.rank = 0;
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    bool merge = bc.rank > 0;
    for (int k = 0; k < 3 && merge; ++k)
      merge = bc.strides[k][bc.rank - 1] == full[static_cast<size_t>(k)][d] * out[d];
    if (merge) {
      bc.dims[bc.rank - 1] *= out[d];
      for (int k = 0; k < 3; ++k) bc.strides[k][bc.rank - 1] = full[static_cast<size_t>(k)][d];
      continue;
    }
    bc.dims[bc.rank] = out[d];
    for (int k = 0; k < 3; ++k) bc.strides[k][bc.rank] = full[static_cast<size_t>(k)][d];
    ++bc.rank;
  }
  if (bc.rank == 0) {  // every dim is 1: one element
    bc.rank = 1;
    bc.dims[0] = 1;
  }
  return bc;
}

std::optional<StridedCopy> make_strided_copy(const Dims& shape, const Dims& in_stride,
                                             const Dims& out_stride, int64_t in_offset,
                                             int64_t out_offset, size_t esize) {
  StridedCopy p;
  p.numel = product(shape, 0, shape.size());
  p.in_offset = in_offset;
  p.out_offset = out_offset;
  p.esize = static_cast<int>(esize);
  struct Dim {
    int64_t size, in, out;
  };
  std::vector<Dim> dims;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 1) continue;
    if (!dims.empty() && dims.back().in == in_stride[k] * shape[k] &&
        dims.back().out == out_stride[k] * shape[k]) {
      dims.back() = {dims.back().size * shape[k], in_stride[k], out_stride[k]};
    } else {
      dims.push_back({shape[k], in_stride[k], out_stride[k]});
    }
  }
  if (dims.size() > static_cast<size_t>(kMaxCopyDims)) return std::nullopt;
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
