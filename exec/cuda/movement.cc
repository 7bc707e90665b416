// exec/cuda/movement.cc: the data-movement factories (cuda_kernels.h): reshapes as device
// copies, Transpose, Concat, Split, Slice and Expand as strided copies (movement.cu) planned
// here exactly as the CPU plans them (exec/cpu/movement.cc), Gather and GatherGrad with their
// index checks reported through the fault table, and constant-mode Pad. Bytes are moved without
// being read, so one kernel serves every dtype of 1, 2, 4 or 8 bytes.
#include <cstring>
#include <optional>
#include <string>

#include "exec/cuda/cuda_check.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/plan.h"

namespace pt::cuda {
namespace {

bool same_movable_type(const KernelSpec& s) {
  return s.has_input(0) && wanted(s, 0) && movable_size(s.inputs[0].dtype) != 0 &&
         s.outputs[0].dtype == s.inputs[0].dtype;
}

// One strided copy from input `from` to output `to` per part.
struct Part {
  StridedCopy copy;
  size_t from, to;
};

std::unique_ptr<Kernel> copies(std::vector<Part> parts, cudaStream_t stream) {
  return fn_kernel([parts = std::move(parts), stream](Args in, Args out, void*) {
    for (const Part& p : parts) launch_strided_copy(p.copy, in[p.from].data, out[p.to].data, stream);
  });
}

std::unique_ptr<Kernel> one_copy(std::optional<StridedCopy> c, cudaStream_t stream) {
  if (!c) return nullptr;
  return copies({{*c, 0, 0}}, stream);
}

// Slice's copy from constant starts/ends/axes/steps, with ONNX's clamping (as the CPU's).
std::optional<StridedCopy> plan_slice(const KernelSpec& s) {
  const auto starts = constant_ints(s, 1), ends = constant_ints(s, 2);
  if (!starts || !ends || starts->size() != ends->size()) return std::nullopt;
  const Dims& in_shape = s.inputs[0].shape;
  const size_t rank = in_shape.size();
  Dims axes(starts->size()), steps(starts->size(), 1);
  for (size_t k = 0; k < axes.size(); ++k) axes[k] = static_cast<int64_t>(k);
  if (s.has_input(3)) {
    const auto a = constant_ints(s, 3);
    if (!a || a->size() != axes.size()) return std::nullopt;
    axes = *a;
  }
  if (s.has_input(4)) {
    const auto st = constant_ints(s, 4);
    if (!st || st->size() != steps.size()) return std::nullopt;
    steps = *st;
  }
  Dims shape = in_shape, in_stride = strides_of(in_shape);
  std::vector<bool> seen(rank, false);
  int64_t offset = 0;
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t ax = normalize_axis(axes[k], rank);
    if (ax < 0 || seen[ax] || steps[k] == 0) return std::nullopt;
    seen[ax] = true;
    const int64_t d = in_shape[ax], step = steps[k];
    int64_t b = (*starts)[k], e = (*ends)[k];
    if (b < 0) b += d;
    if (e < 0) e += d;
    int64_t count;
    if (step > 0) {
      b = std::clamp<int64_t>(b, 0, d);
      e = std::clamp<int64_t>(e, 0, d);
      count = e > b ? (e - b + step - 1) / step : 0;
    } else {
      b = std::clamp<int64_t>(b, 0, d - 1);
      e = std::clamp<int64_t>(e, -1, d - 1);
      count = b > e ? (b - e - step - 1) / -step : 0;
    }
    shape[ax] = count;
    if (count > 0) offset += b * in_stride[ax];
    in_stride[ax] *= step;
  }
  if (shape != s.outputs[0].shape) return std::nullopt;
  return make_strided_copy(shape, in_stride, strides_of(shape), offset, 0,
                           dtype_size(s.inputs[0].dtype));
}

// Split sizes from the output types, checked against input 1 or the `split` attribute.
Dims split_sizes(const KernelSpec& s, size_t axis) {
  Dims sizes;
  int64_t total = 0;
  for (const TensorType& o : s.outputs) {
    if (o.dtype != s.inputs[0].dtype || o.shape.size() != s.inputs[0].shape.size()) return {};
    for (size_t k = 0; k < o.shape.size(); ++k)
      if (k != axis && o.shape[k] != s.inputs[0].shape[k]) return {};
    sizes.push_back(o.shape[axis]);
    total += o.shape[axis];
  }
  if (total != s.inputs[0].shape[axis]) return {};
  Dims given = s.node.attr_ints("split");
  if (s.has_input(1)) {
    const auto c = constant_ints(s, 1);
    if (!c) return {};
    given = *c;
  }
  if (!given.empty() && given != sizes) return {};
  return sizes;
}

// The message of an index out of range (the CPU kernels' words).
FaultTable::Message index_fault(const std::string& op, const std::string& node, int64_t n) {
  return {op + " node '" + node + "'",
          [n](long long v, long long) {
            return "index " + std::to_string(v) + " out of range [-" + std::to_string(n) + ", " +
                   std::to_string(n) + ")";
          },
          "check the token ids against the vocabulary size"};
}

}  // namespace

// Reshape, Flatten, Squeeze, Unsqueeze, Identity: the output holds the input's bytes.
std::unique_ptr<Kernel> make_reshape(const KernelSpec& s, CudaContext& ctx) {
  if (!same_movable_type(s) || s.inputs[0].numel() != s.outputs[0].numel()) return nullptr;
  const size_t bytes = static_cast<size_t>(s.inputs[0].bytes());
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    if (bytes && in[0].data != out[0].data)
      PT_CUDA_CHECK(cudaMemcpyAsync(out[0].data, in[0].data, bytes, cudaMemcpyDeviceToDevice, stream));
  });
}

// Transpose(perm): output dim k reads input stride perm[k].
std::unique_ptr<Kernel> make_transpose(const KernelSpec& s, CudaContext& ctx) {
  if (!same_movable_type(s)) return nullptr;
  const Dims& in_shape = s.inputs[0].shape;
  const size_t rank = in_shape.size();
  Dims perm = s.node.attr_ints("perm");
  if (perm.empty())
    for (size_t k = rank; k-- > 0;) perm.push_back(static_cast<int64_t>(k));
  if (perm.size() != rank) return nullptr;
  std::vector<bool> seen(rank, false);
  const Dims in_stride = strides_of(in_shape);
  Dims shape(rank), stride(rank);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t p = normalize_axis(perm[k], rank);
    if (p < 0 || seen[p]) return nullptr;
    seen[p] = true;
    shape[k] = in_shape[p];
    stride[k] = in_stride[p];
  }
  if (shape != s.outputs[0].shape) return nullptr;
  return one_copy(make_strided_copy(shape, stride, strides_of(shape), 0, 0,
                                    dtype_size(s.inputs[0].dtype)),
                  ctx.stream);
}

// Concat(axis): input k [outer, a_k, inner] to output columns starting at a_0 + ... + a_{k-1}.
std::unique_ptr<Kernel> make_concat(const KernelSpec& s, CudaContext& ctx) {
  if (!same_movable_type(s) || !s.node.has_attr("axis")) return nullptr;
  const TensorType& out = s.outputs[0];
  const int64_t axis = normalize_axis(s.node.attr_int("axis", 0), out.shape.size());
  if (axis < 0) return nullptr;
  const int64_t outer = product(out.shape, 0, axis);
  const int64_t inner = product(out.shape, axis + 1, out.shape.size());
  const int64_t out_row = out.shape[axis] * inner;
  std::vector<Part> parts;
  int64_t at = 0;
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    const TensorType& in = s.inputs[k];
    if (in.dtype != out.dtype || in.shape.size() != out.shape.size()) return nullptr;
    for (size_t d = 0; d < in.shape.size(); ++d)
      if (d != static_cast<size_t>(axis) && in.shape[d] != out.shape[d]) return nullptr;
    const int64_t row = in.shape[axis] * inner;
    const auto c = make_strided_copy({outer, row}, {row, 1}, {out_row, 1}, 0, at * inner,
                                     dtype_size(out.dtype));
    if (!c) return nullptr;
    parts.push_back({*c, k, 0});
    at += in.shape[axis];
  }
  if (at != out.shape[axis]) return nullptr;
  return copies(std::move(parts), ctx.stream);
}

// Split(axis, split): output k [outer, a_k, inner] from input columns a_0 + ... + a_{k-1}.
std::unique_ptr<Kernel> make_split(const KernelSpec& s, CudaContext& ctx) {
  if (!same_movable_type(s) || s.inputs[0].shape.empty()) return nullptr;
  const TensorType& in = s.inputs[0];
  const int64_t axis = normalize_axis(s.node.attr_int("axis", 0), in.shape.size());
  if (axis < 0) return nullptr;
  const Dims sizes = split_sizes(s, static_cast<size_t>(axis));
  if (sizes.empty()) return nullptr;
  const int64_t outer = product(in.shape, 0, axis);
  const int64_t inner = product(in.shape, axis + 1, in.shape.size());
  const int64_t in_row = in.shape[axis] * inner;
  std::vector<Part> parts;
  int64_t at = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t row = sizes[k] * inner;
    const auto c = make_strided_copy({outer, row}, {in_row, 1}, {row, 1}, at * inner, 0,
                                     dtype_size(in.dtype));
    if (!c) return nullptr;
    parts.push_back({*c, 0, k});
    at += sizes[k];
  }
  return copies(std::move(parts), ctx.stream);
}

std::unique_ptr<Kernel> make_slice(const KernelSpec& s, CudaContext& ctx) {
  if (!same_movable_type(s)) return nullptr;
  return one_copy(plan_slice(s), ctx.stream);
}

// Expand(input, shape): numpy broadcast of input to the output shape.
std::unique_ptr<Kernel> make_expand(const KernelSpec& s, CudaContext& ctx) {
  if (!same_movable_type(s)) return nullptr;
  const Dims& in_shape = s.inputs[0].shape;
  const Dims& out_shape = s.outputs[0].shape;
  if (s.has_input(1)) {
    const auto target = constant_ints(s, 1);
    if (!target) return nullptr;
    const size_t rank = std::max(in_shape.size(), target->size());
    Dims want(rank);
    for (size_t k = 0; k < rank; ++k) {
      const int64_t a = k + in_shape.size() >= rank ? in_shape[k + in_shape.size() - rank] : 1;
      const int64_t b = k + target->size() >= rank ? (*target)[k + target->size() - rank] : 1;
      if (a != b && a != 1 && b != 1) return nullptr;
      want[k] = a == 1 ? b : a;
    }
    if (want != out_shape) return nullptr;
  }
  if (out_shape.size() < in_shape.size()) return nullptr;
  const size_t lead = out_shape.size() - in_shape.size();
  const Dims in_stride = strides_of(in_shape);
  Dims stride(out_shape.size(), 0);
  for (size_t k = 0; k < in_shape.size(); ++k) {
    if (in_shape[k] != out_shape[lead + k] && in_shape[k] != 1) return nullptr;
    stride[lead + k] = in_shape[k] == 1 ? 0 : in_stride[k];
  }
  return one_copy(make_strided_copy(out_shape, stride, strides_of(out_shape), 0, 0,
                                    dtype_size(s.inputs[0].dtype)),
                  ctx.stream);
}

// Gather(data, indices, axis): output = data.shape[:axis] + indices.shape + data.shape[axis+1:].
std::unique_ptr<Kernel> make_gather(const KernelSpec& s, CudaContext& ctx) {
  if (!same_movable_type(s) || !s.has_input(1) || s.inputs[0].shape.empty()) return nullptr;
  const TensorType &data = s.inputs[0], &idx = s.inputs[1];
  if (idx.dtype != DType::kInt64 && idx.dtype != DType::kInt32) return nullptr;
  const int64_t axis = normalize_axis(s.node.attr_int("axis", 0), data.shape.size());
  if (axis < 0) return nullptr;
  Dims shape(data.shape.begin(), data.shape.begin() + axis);
  shape.insert(shape.end(), idx.shape.begin(), idx.shape.end());
  shape.insert(shape.end(), data.shape.begin() + axis + 1, data.shape.end());
  if (shape != s.outputs[0].shape) return nullptr;
  const int64_t outer = product(data.shape, 0, axis), n = data.shape[axis];
  const int64_t inner = product(data.shape, axis + 1, data.shape.size()), count = idx.numel();
  const int esize = movable_size(data.dtype);
  const DType index = idx.dtype;
  DeviceFault* fault = ctx.faults->add(index_fault("Gather", s.node.name, n));
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_gather(index, esize, outer, n, count, inner, in[0].data, in[1].data, out[0].data, fault,
                  stream);
  });
}

// GatherGrad(dY, Indices) -> dData, axis, data_shape; float32 dY, int64 or int32 indices.
std::unique_ptr<Kernel> make_gather_grad(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 2 || !has_io(s, 2) || s.outputs.size() != 1) return nullptr;
  const TensorType &dy = s.inputs[0], &idx = s.inputs[1];
  const Dims data = s.node.attr_ints("data_shape");
  if (dy.dtype != DType::kFloat32 || s.outputs[0].dtype != DType::kFloat32 ||
      (idx.dtype != DType::kInt64 && idx.dtype != DType::kInt32) || data.empty() ||
      s.outputs[0].shape != data)
    return nullptr;
  const int64_t axis = normalize_axis(s.node.attr_int("axis", 0), data.size());
  if (axis < 0) return nullptr;
  const size_t a = static_cast<size_t>(axis);
  Dims want(data.begin(), data.begin() + axis);
  want.insert(want.end(), idx.shape.begin(), idx.shape.end());
  want.insert(want.end(), data.begin() + axis + 1, data.end());
  if (dy.shape != want) return nullptr;
  const int64_t outer = product(data, 0, a), n = data[a], inner = product(data, a + 1, data.size());
  const int64_t count = idx.numel();
  const DType index = idx.dtype;
  DeviceFault* fault = ctx.faults->add(index_fault("GatherGrad", s.node.name, n));
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_gather_grad(index, outer, n, count, inner, in[0].as<const float>(), in[1].data,
                       out[0].as<float>(), fault, stream);
  });
}

// Pad(data, pads, constant_value?, axes?), constant mode, pads and axes constant; the value
// constant or fed (read by the kernel).
std::unique_ptr<Kernel> make_pad(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() < 2 || s.inputs.size() > 4 || !s.has_input(0) || !s.has_input(1) ||
      s.outputs.size() != 1 || !same_movable_type(s) ||
      s.outputs[0].shape.size() != s.inputs[0].shape.size() ||
      s.node.attr_string("mode", "constant") != "constant")
    return nullptr;
  const Dims& in = s.inputs[0].shape;
  const size_t rank = in.size();
  if (rank > static_cast<size_t>(kMaxCopyDims)) return nullptr;
  const auto pads = constant_ints(s, 1);
  if (!pads) return nullptr;
  Dims axes(rank);
  for (size_t d = 0; d < rank; ++d) axes[d] = static_cast<int64_t>(d);
  if (s.has_input(3)) {
    const auto given = constant_ints(s, 3);
    if (!given) return nullptr;
    axes = *given;
  }
  if (pads->size() != 2 * axes.size()) return nullptr;
  Dims begin(rank, 0), end(rank, 0);
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t a = normalize_axis(axes[k], rank);
    if (a < 0) return nullptr;
    begin[a] = (*pads)[k];
    end[a] = (*pads)[k + axes.size()];
  }
  PadPlan p;
  p.rank = static_cast<int>(rank);
  p.numel = s.outputs[0].numel();
  p.esize = movable_size(s.inputs[0].dtype);
  for (size_t d = 0; d < rank; ++d) {
    if (in[d] + begin[d] + end[d] != s.outputs[0].shape[d]) return nullptr;
    p.in_dims[d] = in[d];
    p.out_dims[d] = s.outputs[0].shape[d];
    p.begin[d] = begin[d];
  }
  uint64_t bits = 0;
  bool fed = false;
  if (s.has_input(2)) {
    if (s.inputs[2].dtype != s.inputs[0].dtype || s.inputs[2].numel() != 1) return nullptr;
    if (const Tensor* c = s.constant(2)) {
      std::memcpy(&bits, c->data.data(), static_cast<size_t>(p.esize));
    } else {
      fed = true;
    }
  }
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_pad(p, in[0].data, fed ? in[2].data : nullptr, bits, out[0].data, stream);
  });
}

}  // namespace pt::cuda
