// exec/cuda/movement.cc: the data-movement factories (cuda_kernels.h): reshapes as device
// copies, Transpose, Concat, Split, Slice and Expand as strided copies (movement.cu) of the
// geometry the CPU plans with (exec/movement_geometry.h), Gather and GatherGrad with their
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

// The kernel running `geometry`'s copies on elements of the spec's dtype (input 0's); nullptr
// when there are none (the geometry was nullopt) or a copy keeps more than kMaxCopyDims dims.
std::unique_ptr<Kernel> copies(const KernelSpec& s,
                               const std::optional<std::vector<CopyGeometry>>& geometry,
                               cudaStream_t stream) {
  if (!geometry) return nullptr;
  std::vector<Part> parts;
  for (const CopyGeometry& g : *geometry) {
    const auto c = make_strided_copy(g, dtype_size(s.inputs[0].dtype));
    if (!c) return nullptr;
    parts.push_back({*c, g.from, g.to});
  }
  return fn_kernel([parts = std::move(parts), stream](Args in, Args out, void*) {
    for (const Part& p : parts) launch_strided_copy(p.copy, in[p.from].data, out[p.to].data, stream);
  });
}

std::unique_ptr<Kernel> one_copy(const KernelSpec& s, const std::optional<CopyGeometry>& geometry,
                                 cudaStream_t stream) {
  if (!geometry) return nullptr;
  const std::optional<std::vector<CopyGeometry>> one = std::vector<CopyGeometry>{*geometry};
  return copies(s, one, stream);
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

// Transpose, Slice, Expand: one strided copy; Concat: one per input; Split: one per output; the
// geometry of exec/movement_geometry.h, as the CPU's.
std::unique_ptr<Kernel> make_transpose(const KernelSpec& s, CudaContext& ctx) {
  return same_movable_type(s) ? one_copy(s, transpose_geometry(s), ctx.stream) : nullptr;
}

std::unique_ptr<Kernel> make_slice(const KernelSpec& s, CudaContext& ctx) {
  return same_movable_type(s) ? one_copy(s, slice_geometry(s), ctx.stream) : nullptr;
}

std::unique_ptr<Kernel> make_expand(const KernelSpec& s, CudaContext& ctx) {
  return same_movable_type(s) ? one_copy(s, expand_geometry(s), ctx.stream) : nullptr;
}

std::unique_ptr<Kernel> make_tile(const KernelSpec& s, CudaContext& ctx) {
  return same_movable_type(s) ? one_copy(s, tile_geometry(s), ctx.stream) : nullptr;
}

// Trilu(x, k?) {upper} over the last two dims, as the CPU's: k constant or a device scalar.
std::unique_ptr<Kernel> make_trilu(const KernelSpec& s, CudaContext& ctx) {
  if (!same_movable_type(s) || s.outputs[0].shape != s.inputs[0].shape || s.inputs[0].shape.size() < 2)
    return nullptr;
  int64_t k = 0;
  bool k_at_run = false;
  if (s.has_input(1)) {
    if (s.inputs[1].dtype != DType::kInt64 || s.inputs[1].numel() != 1) return nullptr;
    const Tensor* c = s.constant(1);
    if (c) k = c->as<int64_t>()[0];
    k_at_run = !c;
  }
  const Dims& d = s.inputs[0].shape;
  const int64_t n = d[d.size() - 2], m = d.back();
  const int64_t matrices = n * m == 0 ? 0 : s.inputs[0].numel() / (n * m);
  const bool upper = s.node.attr_int("upper", 1) != 0;
  const int esize = movable_size(s.inputs[0].dtype);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_trilu(esize, matrices, n, m, upper, k, k_at_run ? in[1].as<const int64_t>() : nullptr,
                 in[0].data, out[0].data, stream);
  });
}

std::unique_ptr<Kernel> make_concat(const KernelSpec& s, CudaContext& ctx) {
  return same_movable_type(s) ? copies(s, concat_geometry(s), ctx.stream) : nullptr;
}

std::unique_ptr<Kernel> make_split(const KernelSpec& s, CudaContext& ctx) {
  return same_movable_type(s) ? copies(s, split_geometry(s), ctx.stream) : nullptr;
}

// Gather(data, indices, axis): output = data.shape[:axis] + indices.shape + data.shape[axis+1:].
std::unique_ptr<Kernel> make_gather(const KernelSpec& s, CudaContext& ctx) {
  if (!same_movable_type(s)) return nullptr;
  const auto g = gather_geometry(s);
  if (!g) return nullptr;
  const int64_t outer = g->outer, n = g->n, inner = g->inner, count = g->count;
  const int esize = movable_size(s.inputs[0].dtype);
  const DType index = g->index_type;
  DeviceFault* fault = ctx.faults->add(index_fault("Gather", s.node.name, n));
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_gather(index, esize, outer, n, count, inner, in[0].data, in[1].data, out[0].data, fault,
                  stream);
  });
}

// GatherGrad(dY, Indices) -> dData, axis, data_shape; float32 dY, int64 or int32 indices.
std::unique_ptr<Kernel> make_gather_grad(const KernelSpec& s, CudaContext& ctx) {
  const auto g = gather_grad_geometry(s);
  if (!g) return nullptr;
  const int64_t outer = g->outer, n = g->n, inner = g->inner, count = g->count;
  const DType index = g->index_type;
  DeviceFault* fault = ctx.faults->add(index_fault("GatherGrad", s.node.name, n));
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_gather_grad(index, outer, n, count, inner, in[0].as<const float>(), in[1].data,
                       out[0].as<float>(), fault, stream);
  });
}

// Pad(data, pads, constant_value?, axes?), constant mode (pad_geometry); the value constant or
// fed (read by the kernel).
std::unique_ptr<Kernel> make_pad(const KernelSpec& s, CudaContext& ctx) {
  if (!same_movable_type(s) || s.inputs[0].shape.size() > static_cast<size_t>(kMaxCopyDims))
    return nullptr;
  const auto begin = pad_geometry(s);
  if (!begin) return nullptr;
  const Dims& x = s.inputs[0].shape;
  PadPlan p;
  p.rank = static_cast<int>(x.size());
  p.numel = s.outputs[0].numel();
  p.esize = movable_size(s.inputs[0].dtype);
  for (size_t d = 0; d < x.size(); ++d) {
    p.in_dims[d] = x[d];
    p.out_dims[d] = s.outputs[0].shape[d];
    p.begin[d] = (*begin)[d];
  }
  uint64_t bits = 0;
  const Tensor* c = s.has_input(2) ? s.constant(2) : nullptr;
  if (c) std::memcpy(&bits, c->as<std::byte>(), static_cast<size_t>(p.esize));
  const bool fed = s.has_input(2) && !c;
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_pad(p, in[0].data, fed ? in[2].data : nullptr, bits, out[0].data, stream);
  });
}

}  // namespace pt::cuda
