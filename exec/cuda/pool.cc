// exec/cuda/pool.cc: MaxPool, AveragePool, GlobalAveragePool and the pooling gradients.
// Forward pooling runs on cuDNN where the geometry is cuDNN's (symmetric pads smaller than the
// window, no dilation, no ceil_mode rounding); the other geometries, and both gradients
// (MaxPoolGrad's first-maximum rule, deterministic gathers), run as the custom kernels of
// pool.cu. GlobalAveragePool is a mean reduction (reduce.cu). Geometry as the CPU's
// (exec/window.h).
#include <optional>

#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cudnn_util.h"
#include "exec/cuda/plan.h"
#include "exec/window.h"

namespace pt::cuda {
namespace {

// The custom kernels' geometry: spatial dims right-aligned into three.
PoolGeom pool_geom(const Dims& x, const Dims& y, const Window& w) {
  PoolGeom g;
  g.planes = x[0] * x[1];
  const size_t r = x.size() - 2, lead = 3 - r;
  for (size_t i = 0; i < r; ++i) {
    g.in[lead + i] = x[i + 2];
    g.out[lead + i] = y[i + 2];
    g.kernel[lead + i] = w.kernel[i];
    g.stride[lead + i] = w.strides[i];
    g.dilation[lead + i] = w.dilation[i] + 1;
    g.pad[lead + i] = w.pad_l[i];
  }
  return g;
}

// Y = pool(X) on cuDNN: inputs X; output Y (4-D or 5-D; 1-D pools get a height of 1).
class CudnnPool final : public Kernel {
 public:
  CudnnPool(const CudaContext& ctx, cudnnPoolingMode_t mode, const IntDims& x, const IntDims& y,
            const IntDims& window, const IntDims& pads, const IntDims& strides)
      : ctx_(ctx), x_(x), y_(y), pool_(mode, window, pads, strides) {}
  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float one = 1.f, zero = 0.f;
    PT_CUDNN_CHECK(cudnnPoolingForward(ctx_.cudnn, pool_.get(), &one, x_.get(), in[0].data, &zero,
                                       y_.get(), out[0].data));
  }

 private:
  const CudaContext& ctx_;
  TensorDesc x_, y_;
  PoolDesc pool_;
};

// The cuDNN form of a pool, or nullptr where cuDNN's geometry does not cover it.
std::unique_ptr<Kernel> cudnn_pool(const CudaContext& ctx, cudnnPoolingMode_t mode, const Dims& x,
                                   const Dims& y, const Window& w) {
  const size_t r = x.size() - 2;
  if (w.ceil_padded) return nullptr;
  IntDims window, pads, strides, xd{int(x[0]), int(x[1])}, yd{int(y[0]), int(y[1])};
  if (r == 1) {  // as 2-D with height 1
    window.push_back(1);
    pads.push_back(0);
    strides.push_back(1);
    xd.push_back(1);
    yd.push_back(1);
  }
  for (size_t i = 0; i < r; ++i) {
    if (w.dilation[i] != 0 || w.pad_l[i] != w.pad_r[i] || w.pad_l[i] >= w.kernel[i]) return nullptr;
    window.push_back(static_cast<int>(w.kernel[i]));
    pads.push_back(static_cast<int>(w.pad_l[i]));
    strides.push_back(static_cast<int>(w.strides[i]));
    xd.push_back(static_cast<int>(x[i + 2]));
    yd.push_back(static_cast<int>(y[i + 2]));
  }
  return std::make_unique<CudnnPool>(ctx, mode, xd, yd, window, pads, strides);
}

// X: (N, C, spatial...) with 1 to 3 spatial dims, float32, Y of the same rank; only Y wanted.
bool pool_shapes_ok(const KernelSpec& s) {
  const size_t r = s.inputs.size() == 1 && s.has_input(0) ? s.inputs[0].shape.size() : 0;
  for (size_t k = 1; k < s.outputs.size(); ++k)
    if (wanted(s, k)) return false;
  return r >= 3 && r <= 5 && float_io(s) && s.outputs[0].shape.size() == r &&
         s.outputs[0].shape[0] == s.inputs[0].shape[0] && s.outputs[0].shape[1] == s.inputs[0].shape[1] &&
         s.inputs[0].numel() < (int64_t{1} << 31);
}

}  // namespace

// MaxPool (float32; the Indices output is not made, so a node asking for it is declined).
std::unique_ptr<Kernel> make_max_pool(const KernelSpec& s, CudaContext& ctx) {
  if (!pool_shapes_ok(s)) return nullptr;
  const Dims &x = s.inputs[0].shape, &y = s.outputs[0].shape;
  const auto w = resolve_window(s.node, x, y, s.node.attr_ints("kernel_shape"));
  if (!w) return nullptr;
  if (auto k = cudnn_pool(ctx, CUDNN_POOLING_MAX, x, y, *w)) return k;
  const PoolGeom g = pool_geom(x, y, *w);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_max_pool(g, in[0].as<const float>(), out[0].as<float>(), stream);
  });
}

// AveragePool: count_include_pad chooses the divisor; with it, cells ceil_mode adds are
// declined (as the CPU's: ONNX does not count them).
std::unique_ptr<Kernel> make_average_pool(const KernelSpec& s, CudaContext& ctx) {
  if (!pool_shapes_ok(s)) return nullptr;
  const Dims &x = s.inputs[0].shape, &y = s.outputs[0].shape;
  const bool include = s.node.attr_int("count_include_pad", 0) != 0;
  const auto w = resolve_window(s.node, x, y, s.node.attr_ints("kernel_shape"));
  if (!w || (include && w->ceil_padded)) return nullptr;
  if (auto k = cudnn_pool(ctx,
                          include ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                  : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
                          x, y, *w))
    return k;
  const PoolGeom g = pool_geom(x, y, *w);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_average_pool(g, include, in[0].as<const float>(), out[0].as<float>(), stream);
  });
}

// GlobalAveragePool: Y[n, c] = mean over the spatial dims of X[n, c].
std::unique_ptr<Kernel> make_global_average_pool(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 1 || s.outputs.size() != 1 || !has_io(s, 1) || !float_io(s)) return nullptr;
  const Dims& x = s.inputs[0].shape;
  const Dims& y = s.outputs[0].shape;
  if (x.size() < 3 || y.size() != x.size() || y[0] != x[0] || y[1] != x[1] ||
      s.outputs[0].numel() != x[0] * x[1] || s.inputs[0].numel() == 0)
    return nullptr;
  ReducePlan p;
  const int64_t planes = x[0] * x[1], area = product(x, 2, x.size());
  p.kept_rank = 1;
  p.kept_dims[0] = planes;
  p.kept_strides[0] = area;
  p.reduced_rank = 1;
  p.reduced_dims[0] = area;
  p.reduced_strides[0] = 1;
  p.out_numel = planes;
  p.count = area;
  p.scale = 1.f / static_cast<float>(area);
  p.inner_reduced = true;
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_reduce(p, in[0].as<const float>(), out[0].as<float>(), nullptr, stream);
  });
}

// MaxPoolGrad(dY, X) -> dX, MaxPool's attributes.
std::unique_ptr<Kernel> make_max_pool_grad(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 2 || !has_io(s, 2) || s.outputs.size() != 1 || !float_io(s)) return nullptr;
  const Dims& x = s.inputs[1].shape;
  const auto w = pool_grad_window(s, x);
  if (!w) return nullptr;
  const PoolGeom g = pool_geom(x, s.inputs[0].shape, *w);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_max_pool_grad(g, in[0].as<const float>(), in[1].as<const float>(), out[0].as<float>(),
                         stream);
  });
}

// AveragePoolGrad(dY) -> dX, AveragePool's attributes plus input_shape.
std::unique_ptr<Kernel> make_average_pool_grad(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() != 1 || !has_io(s, 1) || s.outputs.size() != 1 || !float_io(s) ||
      s.outputs[0].shape != s.node.attr_ints("input_shape"))
    return nullptr;
  const Dims& x = s.outputs[0].shape;
  const auto w = pool_grad_window(s, x);
  const bool include = s.node.attr_int("count_include_pad", 0) != 0;
  if (!w || (include && w->ceil_padded)) return nullptr;
  const PoolGeom g = pool_geom(x, s.inputs[0].shape, *w);
  const cudaStream_t stream = ctx.stream;
  return fn_kernel([=](Args in, Args out, void*) {
    launch_average_pool_grad(g, include, in[0].as<const float>(), out[0].as<float>(), stream);
  });
}

}  // namespace pt::cuda
