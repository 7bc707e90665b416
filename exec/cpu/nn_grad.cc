// exec/cpu/nn_grad.cc: the backward half of the window ops, pipetrain-domain ops
// (core/pipetrain_ops.h): ConvGradInput and ConvGradWeight on oneDNN's convolution backward
// primitives, AveragePoolGrad on pooling_v2 backward, MaxPoolGrad as a loop (oneDNN's needs the
// forward's workspace, which the forward kernel does not keep). LayerNormGrad and BatchNormGrad
// are in nn_grad_norm.cc. Everything is fixed when the kernel is made; run() binds and executes.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dnnl_kernel.h"
#include "exec/cpu/dnnl_util.h"
#include "exec/cpu/window.h"

namespace pt::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Conv gradients

// The forward Conv's geometry, read from a gradient node: X: (N, C, in...), W: (M, C/group,
// k...), Y = dY: (N, M, out...), with 1 to 3 spatial dims.
struct ConvGeometry {
  Window window;
  int64_t group = 1;
  Dims x, w, y;
  Dims w_grouped;  // W as oneDNN takes it: (group, M/group, C/group, k...) when grouped
  bool pointwise = false;  // ungrouped 1x1: runs on the plain layouts (see build_conv in nn.cc)
};

// Checks Conv's shape rules and attributes (auto_pad NOTSET only, kernel_shape if given equals
// W's); nullopt when they do not hold. dY must have the shape Conv would give (no ceil rounding).
std::optional<ConvGeometry> conv_geometry(const Node& n, const Dims& x, const Dims& w,
                                          const Dims& y) {
  ConvGeometry g{{}, n.attr_int("group", 1), x, w, y, w, false};
  if (x.size() < 3 || x.size() > 5 || w.size() != x.size() || y.size() != x.size() ||
      g.group < 1 || n.attr_string("auto_pad", "NOTSET") != "NOTSET")
    return std::nullopt;
  const int64_t c = x[1], m = w[0];
  if (c % g.group != 0 || m % g.group != 0 || w[1] * g.group != c || y[0] != x[0] || y[1] != m)
    return std::nullopt;
  const Dims kernel(w.begin() + 2, w.end());
  const Dims given = n.attr_ints("kernel_shape");
  if (!given.empty() && given != kernel) return std::nullopt;
  const auto window = resolve_window(n, x, y, kernel);
  if (!window || window->ceil_padded) return std::nullopt;
  g.window = *window;
  if (g.group > 1) {
    g.w_grouped[0] /= g.group;
    g.w_grouped.insert(g.w_grouped.begin(), g.group);
  }
  g.pointwise = g.group == 1 && std::all_of(kernel.begin(), kernel.end(),
                                            [](int64_t k) { return k == 1; });
  return g;
}

// The layout a conv primitive is asked for: plain for a pointwise conv, else its choice.
memory::desc conv_layout(const ConvGeometry& g, const Dims& dims) {
  return g.pointwise ? plain_desc(DType::kFloat32, dims) : any_layout(dims);
}

// The forward primitive_desc oneDNN takes as the hint for a backward one.
dnnl::convolution_forward::primitive_desc conv_hint(const ConvGeometry& g,
                                                    const dnnl::engine& engine) {
  const Window& w = g.window;
  return dnnl::convolution_forward::primitive_desc(
      {dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
       conv_layout(g, g.x), conv_layout(g, g.w_grouped), conv_layout(g, g.y), w.strides,
       w.dilation, w.pad_l, w.pad_r},
      engine);
}

// Data at output 0, laid out plainly as `plain`, written by a step that produces `chosen`:
// the output itself when the layouts agree, else scratch reordered out after the step.
Place output_place(DnnlKernel& k, const memory::desc& chosen, const memory::desc& plain) {
  return same_bytes(chosen, plain) ? Place{Place::kOutput, 0} : k.reserve(chosen.get_size());
}

void reorder_to_output(DnnlKernel& k, Place from, const memory::desc& chosen,
                       const memory::desc& plain) {
  if (from.kind != Place::kOutput) k.add_reorder(from, chosen, {Place::kOutput, 0}, plain);
}

// dX = ConvGradInput(dY, W): convolution_backward_data. dY and W are reordered into the
// primitive's layouts where they differ from the plain ones, dX out of it.
std::unique_ptr<Kernel> build_conv_grad_input(const KernelSpec& s, const ConvGeometry& g) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const Window& w = g.window;
  const memory::desc dx_md = plain_desc(DType::kFloat32, g.x);
  const memory::desc dy_md = plain_desc(DType::kFloat32, g.y);
  const memory::desc w_md = plain_desc(DType::kFloat32, g.w_grouped);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::convolution_backward_data::primitive_desc pd(
      {dnnl::algorithm::convolution_direct, conv_layout(g, g.x), conv_layout(g, g.w_grouped),
       conv_layout(g, g.y), w.strides, w.dilation, w.pad_l, w.pad_r},
      attr, k->engine(), conv_hint(g, k->engine()));
  const Place dyp = k->reordered({Place::kInput, 0}, dy_md, pd.diff_dst_desc());
  const Place wp = k->reordered({Place::kInput, 1}, w_md, pd.weights_desc());
  const Place dxp = output_place(*k, pd.diff_src_desc(), dx_md);
  k->add_step(dnnl::convolution_backward_data(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc(), dyp},
               {DNNL_ARG_WEIGHTS, pd.weights_desc(), wp},
               {DNNL_ARG_DIFF_SRC, pd.diff_src_desc(), dxp}});
  reorder_to_output(*k, dxp, pd.diff_src_desc(), dx_md);
  return k;
}

// dW = ConvGradWeight(dY, X): convolution_backward_weights (no bias gradient: autodiff reduces
// dY for that), with the same reorders.
std::unique_ptr<Kernel> build_conv_grad_weight(const KernelSpec& s, const ConvGeometry& g) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const Window& w = g.window;
  const memory::desc x_md = plain_desc(DType::kFloat32, g.x);
  const memory::desc dy_md = plain_desc(DType::kFloat32, g.y);
  const memory::desc dw_md = plain_desc(DType::kFloat32, g.w_grouped);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::convolution_backward_weights::primitive_desc pd(
      {dnnl::algorithm::convolution_direct, conv_layout(g, g.x), conv_layout(g, g.w_grouped),
       conv_layout(g, g.y), w.strides, w.dilation, w.pad_l, w.pad_r},
      attr, k->engine(), conv_hint(g, k->engine()));
  const Place dyp = k->reordered({Place::kInput, 0}, dy_md, pd.diff_dst_desc());
  const Place xp = k->reordered({Place::kInput, 1}, x_md, pd.src_desc());
  const Place dwp = output_place(*k, pd.diff_weights_desc(), dw_md);
  k->add_step(dnnl::convolution_backward_weights(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc(), dyp},
               {DNNL_ARG_SRC, pd.src_desc(), xp},
               {DNNL_ARG_DIFF_WEIGHTS, pd.diff_weights_desc(), dwp}});
  reorder_to_output(*k, dwp, pd.diff_weights_desc(), dw_md);
  return k;
}

// (dY, other) -> one float32 output whose shape is the attribute `shape_attr`.
bool two_to_one_float(const KernelSpec& s, const char* shape_attr) {
  return s.inputs.size() == 2 && s.has_input(0) && s.has_input(1) && single_output(s) &&
         float_only(s) && s.outputs[0].shape == s.node.attr_ints(shape_attr);
}

// ---------------------------------------------------------------------------------------------
// Pooling gradients

// (dY) or (dY, X) -> dX, X: (N, C, spatial...) with 1 to 3 spatial dims, dY of the same rank.
// The window is resolved from the pooling attributes; without ceil_mode, dY must have the floor
// shape.
std::optional<Window> pool_window(const KernelSpec& s, const Dims& x) {
  const Dims& y = s.inputs[0].shape;
  if (x.size() < 3 || x.size() > 5 || y.size() != x.size() || y[0] != x[0] || y[1] != x[1] ||
      s.outputs[0].shape != x)
    return std::nullopt;
  const auto w = resolve_window(s.node, x, y, s.node.attr_ints("kernel_shape"));
  if (!w || (w->ceil_padded && s.node.attr_int("ceil_mode", 0) == 0)) return std::nullopt;
  return w;
}

// dX = AveragePoolGrad(dY) on pooling_v2 backward, plain layouts (as the forward kernel runs).
std::unique_ptr<Kernel> build_average_pool_grad(const KernelSpec& s, dnnl::algorithm alg,
                                                const Window& w) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const memory::desc dx_md = plain_desc(s.outputs[0]), dy_md = plain_desc(s.inputs[0]);
  const dnnl::pooling_v2_forward::primitive_desc hint(
      {dnnl::prop_kind::forward_training, alg, dx_md, dy_md, w.strides, w.kernel, w.dilation,
       w.pad_l, w.pad_r},
      k->engine());
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::pooling_v2_backward::primitive_desc pd(
      {alg, dx_md, dy_md, w.strides, w.kernel, w.dilation, w.pad_l, w.pad_r}, attr, k->engine(),
      hint);
  k->add_step(dnnl::pooling_v2_backward(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_DIFF_DST, dy_md, {Place::kInput, 0}},
               {DNNL_ARG_DIFF_SRC, dx_md, {Place::kOutput, 0}}});
  return k;
}

// One spatial dim of a window op, in ONNX's terms (dilation 1 is dense).
struct PoolDim {
  int64_t in = 1, out = 1, kernel = 1, stride = 1, dilation = 1, pad = 0;

  // Kernel taps [lo, hi) of output position o that fall inside the input.
  void taps(int64_t o, int64_t* lo, int64_t* hi) const {
    const int64_t start = o * stride - pad;
    *lo = start >= 0 ? 0 : (-start + dilation - 1) / dilation;
    *hi = in > start ? std::min(kernel, (in - start + dilation - 1) / dilation) : 0;
  }
};

// MaxPoolGrad: per (n, c) plane, each dY element is added to the first maximum of its window in
// row-major order (depth, height, width); padding never wins. Spatial dims are padded to three
// with size-1 dims in front. Planes run in parallel, each written by one thread.
class MaxPoolGrad final : public Kernel {
 public:
  MaxPoolGrad(int64_t planes, std::array<PoolDim, 3> dims, int threads)
      : planes_(planes), d_(dims), threads_(threads) {}

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const int64_t in_size = d_[0].in * d_[1].in * d_[2].in;
    const int64_t out_size = d_[0].out * d_[1].out * d_[2].out;
    const float* dy = in[0].as<const float>();
    const float* x = in[1].as<const float>();
    float* dx = out[0].as<float>();
    const bool parallel = planes_ > 1 && planes_ * (in_size + out_size) >= (1 << 15);
#pragma omp parallel for num_threads(threads_) if (parallel)
    for (int64_t p = 0; p < planes_; ++p)
      plane(dy + p * out_size, x + p * in_size, dx + p * in_size, in_size);
  }

 private:
  void plane(const float* dy, const float* x, float* dx, int64_t in_size) const {
    std::fill(dx, dx + in_size, 0.f);
    int64_t o = 0;
    for (int64_t od = 0; od < d_[0].out; ++od)
      for (int64_t oh = 0; oh < d_[1].out; ++oh)
        for (int64_t ow = 0; ow < d_[2].out; ++ow, ++o) {
          const int64_t at = first_max(x, od, oh, ow);
          if (at >= 0) dx[at] += dy[o];
        }
  }

  // Offset of the first maximum of the window at (od, oh, ow), or -1 when it holds no input.
  int64_t first_max(const float* x, int64_t od, int64_t oh, int64_t ow) const {
    int64_t lo[3], hi[3];
    d_[0].taps(od, &lo[0], &hi[0]);
    d_[1].taps(oh, &lo[1], &hi[1]);
    d_[2].taps(ow, &lo[2], &hi[2]);
    int64_t best_at = -1;
    float best = 0.f;
    for (int64_t kd = lo[0]; kd < hi[0]; ++kd) {
      const int64_t id = od * d_[0].stride - d_[0].pad + kd * d_[0].dilation;
      for (int64_t kh = lo[1]; kh < hi[1]; ++kh) {
        const int64_t ih = oh * d_[1].stride - d_[1].pad + kh * d_[1].dilation;
        const int64_t row = (id * d_[1].in + ih) * d_[2].in;
        for (int64_t kw = lo[2]; kw < hi[2]; ++kw) {
          const int64_t at = row + ow * d_[2].stride - d_[2].pad + kw * d_[2].dilation;
          if (best_at < 0 || x[at] > best) {
            best = x[at];
            best_at = at;
          }
        }
      }
    }
    return best_at;
  }

  int64_t planes_;
  std::array<PoolDim, 3> d_;
  int threads_;
};

}  // namespace

// ConvGradInput(dY, W) -> dX, attributes of Conv plus input_shape (X's shape).
std::unique_ptr<Kernel> make_conv_grad_input(const KernelSpec& s) {
  if (!two_to_one_float(s, "input_shape")) return nullptr;
  const auto g = conv_geometry(s.node, s.outputs[0].shape, s.inputs[1].shape, s.inputs[0].shape);
  if (!g) return nullptr;
  return build_or_null(s, [&] { return build_conv_grad_input(s, *g); });
}

// ConvGradWeight(dY, X) -> dW, attributes of Conv plus weight_shape (W's shape).
std::unique_ptr<Kernel> make_conv_grad_weight(const KernelSpec& s) {
  if (!two_to_one_float(s, "weight_shape")) return nullptr;
  const auto g = conv_geometry(s.node, s.inputs[1].shape, s.outputs[0].shape, s.inputs[0].shape);
  if (!g) return nullptr;
  return build_or_null(s, [&] { return build_conv_grad_weight(s, *g); });
}

// AveragePoolGrad(dY) -> dX, attributes of AveragePool plus input_shape. As in the forward
// kernel, count_include_pad with cells that ceil_mode adds is declined (ONNX does not count
// those cells, oneDNN would).
std::unique_ptr<Kernel> make_average_pool_grad(const KernelSpec& s) {
  if (s.inputs.size() != 1 || !s.has_input(0) || !single_output(s) || !float_only(s) ||
      s.outputs[0].shape != s.node.attr_ints("input_shape"))
    return nullptr;
  const auto w = pool_window(s, s.outputs[0].shape);
  const bool include = s.node.attr_int("count_include_pad", 0) != 0;
  if (!w || (include && w->ceil_padded)) return nullptr;
  return build_or_null(s, [&] {
    return build_average_pool_grad(s,
                                   include ? dnnl::algorithm::pooling_avg_include_padding
                                           : dnnl::algorithm::pooling_avg_exclude_padding,
                                   *w);
  });
}

// MaxPoolGrad(dY, X) -> dX, attributes of MaxPool.
std::unique_ptr<Kernel> make_max_pool_grad(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !s.has_input(0) || !s.has_input(1) || !single_output(s) ||
      !float_only(s))
    return nullptr;
  const Dims& x = s.inputs[1].shape;
  const auto w = pool_window(s, x);
  if (!w) return nullptr;
  const size_t r = x.size() - 2, lead = 3 - r;
  std::array<PoolDim, 3> dims;
  for (size_t i = 0; i < r; ++i)
    dims[lead + i] = {x[i + 2], s.inputs[0].shape[i + 2], w->kernel[i], w->strides[i],
                      w->dilation[i] + 1, w->pad_l[i]};
  return std::make_unique<MaxPoolGrad>(x[0] * x[1], dims, s.cpu->threads);
}

}  // namespace pt::cpu
