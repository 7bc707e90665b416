// exec/cpu/nn.cc: Conv, MaxPool, AveragePool and LayerNormalization on oneDNN primitives
// (nn_channel.cc has BatchNormalization and GlobalAveragePool, softmax.cc Softmax and
// LogSoftmax). Geometry, layouts, primitives and reorders are fixed when the kernel is made;
// run() binds the step's buffers and executes.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dnnl_kernel.h"
#include "exec/cpu/dnnl_util.h"
#include "exec/window.h"

namespace pt::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Conv

// A dense 1x1 conv without pads that keeps every pixel (stride 1, or a map of one pixel) whose X
// and Y are stored channels-last, or hold one pixel per image (then the plain layout is the same
// bytes): the product of X's (N x pixels, C)
// rows by W^T (C, M), on oneDNN's matmul primitive, B as its bias and the epilogue as its post-op.
// W is laid out once where the program's weights are fixed (`run`), else read in place as W^T
// (training, where the weights are inputs). At 1 or 2 pixels per image oneDNN's 1x1 conv kernel
// takes up to 4x the product's time (MobileNetV2's last conv, 8 x 80 -> 1280 at 1x1, two threads:
// 16-20 us against 5), at 4 x 4 and more the two are within a few percent; on plain tensors its
// kernel is a product per image, which at one pixel reads all of W once per image (that conv in
// training, one thread: 93 us against 14).
std::unique_ptr<Kernel> build_pixel_product(const KernelSpec& s, const Window& w, int64_t group) {
  const Dims& x = s.inputs[0].shape;
  const Tensor* fixed_w = s.constants_fixed ? s.constant(1) : nullptr;
  const int64_t pixels = product(x, 2, x.size());
  const bool last = s.input_channels_last(0) && s.output_channels_last(0);
  // Strides other than 1 keep every pixel only on a map of one pixel (MobileNetV2's stride-2
  // convolutions reaching 1x1).
  if (group != 1 || !all_are(w.kernel, 1) || product(s.outputs[0].shape, 2, x.size()) != pixels ||
      !all_are(w.pad_l, 0) || !all_are(w.pad_r, 0) || (!last && pixels != 1))
    return nullptr;
  const int64_t rows = x[0] * pixels, c = x[1], m = s.outputs[0].shape[1];
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops post;
  if (!append_epilogue(s, post)) return nullptr;
  attr.set_post_ops(post);
  const memory::desc x_md = plain_desc(DType::kFloat32, {rows, c}), y_md = plain_desc(DType::kFloat32, {rows, m});
  const memory::desc w_md({c, m}, memory::data_type::f32, memory::format_tag::ba);  // W (M, C) read as W^T
  const memory::desc b_md = s.has_input(2) ? plain_desc(DType::kFloat32, {1, m}) : memory::desc();
  const memory::desc w_want = fixed_w ? any_layout({c, m}) : w_md;
  const dnnl::matmul::desc d = s.has_input(2) ? dnnl::matmul::desc(x_md, w_want, b_md, y_md)
                                              : dnnl::matmul::desc(x_md, w_want, y_md);
  const dnnl::matmul::primitive_desc pd(d, attr, k->engine());
  if (!implementation_is(pd, "brg")) return nullptr;  // else the conv's kernels
  const Place wp = fixed_w ? k->held({Place::kInput, 1}, fixed_w->as<std::byte>(), w_md, pd.weights_desc())
                           : Place{Place::kInput, 1};
  std::vector<std::tuple<int, memory::desc, Place>> args = {
      {DNNL_ARG_SRC, x_md, {Place::kInput, 0}},
      {DNNL_ARG_WEIGHTS, pd.weights_desc(), wp},
      {DNNL_ARG_DST, y_md, {Place::kOutput, 0}}};
  if (s.has_input(2)) args.emplace_back(DNNL_ARG_BIAS, b_md, Place{Place::kInput, 2});
  k->add_step(dnnl::matmul(pd), pd.scratchpad_desc(), args);
  return k;
}

// Y = conv(X, W) + B with X: (N, C, in...), W: (M, C/group, k...), B: (M), Y: (N, M, out...).
// W is viewed as (group, M/group, C/group, k...) when grouped. X and Y are read and written in
// place when channels-last (exec/channels_last.h: a chain of convs hands such tensors on).
// Otherwise oneDNN picks the layouts (blocked for speed); X and W are reordered into scratch
// before (W once, when the kernel is made, where the program's constants are fixed), Y out of
// it after, unless the chosen layout puts every element where the plain one does (nhwc with
// H = W = 1). A dense 1x1 conv between plain tensors is a GEMM on the plain layouts but on small
// planes (pointwise_on_plain_layouts, dnnl_util.h). A plain X of at
// most kFewChannels channels (an image, the stem's input) stays plain: oneDNN's jit kernel reads
// it so (its first-convolution path, vectorised along the output's width), where on the layout
// it picks itself (nhwc, for brgconv) each tap reduces over 3 channels only and the convolution
// ran at a quarter of the rate of the others (the resnet sample's stem, 8 x 3 x 32 x 32 -> 16
// channels 3x3: 89 us, now 39; samples/exports' resnet's 7x7 stride 2: 4.2 us, now 2.9; oneDNN's
// own timing, the median of 120 calls).
constexpr int64_t kFewChannels = 4;

std::unique_ptr<Kernel> build_conv(const KernelSpec& s, const Window& w, int64_t group) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const Dims& x = s.inputs[0].shape;
  const Dims& y = s.outputs[0].shape;
  Dims wd = s.inputs[1].shape;
  if (group > 1) {
    wd[0] /= group;
    wd.insert(wd.begin(), group);
  }
  const bool x_last = s.input_channels_last(0), y_last = s.output_channels_last(0);
  const auto stored = [](const TensorType& t, bool last) {
    return last ? memory::desc(t.shape, dnnl_type(t.dtype), memory::format_tag::nhwc) : plain_desc(t);
  };
  const memory::desc x_md = stored(s.inputs[0], x_last), y_md = stored(s.outputs[0], y_last);
  const memory::desc w_md = plain_desc(DType::kFloat32, wd);
  const memory::desc b_md = s.has_input(2) ? plain_desc(s.inputs[2]) : memory::desc();
  const bool plain_gemm = !x_last && !y_last && group == 1 && all_are(w.kernel, 1) && pointwise_on_plain_layouts(x);
  const bool image = !x_last && group == 1 && x[1] <= kFewChannels;
  // A plain side next to a channels-last one is left to oneDNN (reordered once at the chain's end).
  // A 2-D depthwise conv between plain tensors takes its sides in 16-channel blocks (nChw16c),
  // the layout of oneDNN's jit depthwise kernel and of the backward passes (nn_grad.cc,
  // depthwise.cc). Left to choose, it takes nhwc for its brdgmm kernel, and the reorder of X from
  // nchw to nhwc, a transpose of each image's (C, H x W) planes, cost 2-4x the convolution
  // (MobileNetV2's 48 channels of 16x16 at stride 2, in training: 50-59 us a call, now 24).
  const bool depthwise_blocked = group > 1 && group == x[1] && wd.size() == 5 && x.size() == 4;
  const auto side = [&](const memory::desc& md, bool last, const Dims& dims) {
    if (depthwise_blocked && !last) return memory::desc(dims, memory::data_type::f32, memory::format_tag::nChw16c);
    return last || plain_gemm ? md : any_layout(dims);
  };
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops post;  // the epilogue, a Relu or Clip applied to Y before it is written
  if (!append_epilogue(s, post)) return nullptr;
  attr.set_post_ops(post);
  const auto primitive = [&](const memory::desc& src, const memory::desc& weights, const memory::desc& dst) {
    const dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                            src, weights, b_md, dst, w.strides, w.dilation, w.pad_l, w.pad_r);
    return dnnl::convolution_forward::primitive_desc(d, attr, k->engine());
  };
  dnnl::convolution_forward::primitive_desc pd =
      primitive(image ? x_md : side(x_md, x_last, x), plain_gemm ? w_md : any_layout(wd), side(y_md, y_last, y));
  // Where oneDNN has no fast kernel for a channels-last side (3 input channels, say), the layouts
  // it picks itself, with reorders from and to the stored ones, beat its reference kernel.
  if ((x_last || y_last || image || depthwise_blocked) && implementation_is(pd, "ref"))
    pd = primitive(any_layout(x), any_layout(wd), any_layout(y));
  // An epilogue is worth taking only on a fast kernel: else the node runs on its own.
  if (s.epilogue && implementation_is(pd, "ref")) return nullptr;

  const Place xp = k->reordered({Place::kInput, 0}, x_md, pd.src_desc());
  const Tensor* fixed_w = s.constants_fixed ? s.constant(1) : nullptr;  // laid out once if fixed
  const Place wp = fixed_w ? k->held({Place::kInput, 1}, fixed_w->as<std::byte>(), w_md, pd.weights_desc())
                           : k->reordered({Place::kInput, 1}, w_md, pd.weights_desc());
  const bool y_plain = same_bytes(pd.dst_desc(), y_md);
  const Place yp = y_plain ? Place{Place::kOutput, 0} : k->reserve(pd.dst_desc().get_size());
  std::vector<std::tuple<int, memory::desc, Place>> args = {
      {DNNL_ARG_SRC, pd.src_desc(), xp},
      {DNNL_ARG_WEIGHTS, pd.weights_desc(), wp},
      {DNNL_ARG_DST, pd.dst_desc(), yp}};
  if (s.has_input(2)) args.emplace_back(DNNL_ARG_BIAS, b_md, Place{Place::kInput, 2});
  k->add_step(dnnl::convolution_forward(pd), pd.scratchpad_desc(), args);
  if (!y_plain) k->add_reorder(yp, pd.dst_desc(), {Place::kOutput, 0}, y_md);
  return k;
}

// ---------------------------------------------------------------------------------------------
// Pooling

// Y[n, c, o...] = max or mean of X[n, c, window(o)...], both in the user's plain layout.
// Where oneDNN has no jit kernel for the plain layout (2.6 has one on AVX-512 only; on AVX2 its
// plain loop, simple_nchw, took 6.1 us for the exported ResNet's 3x3 max pool of 2 x 8 x 8 x 8,
// where the jit kernel takes 1.0), X is reordered into 8-channel blocks and Y out of them.
std::unique_ptr<Kernel> build_pool(const KernelSpec& s, dnnl::algorithm alg,
                                   const memory::desc& x_md, const memory::desc& y_md,
                                   const Window& w) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto primitive = [&](const memory::desc& src, const memory::desc& dst) {
    const dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, src, dst, w.strides, w.kernel,
                                           w.dilation, w.pad_l, w.pad_r);
    return dnnl::pooling_v2_forward::primitive_desc(d, attr, k->engine());
  };
  dnnl::pooling_v2_forward::primitive_desc pd = primitive(x_md, y_md);
  const size_t rank = x_md.dims().size();
  if (implementation_is(pd, "simple") && rank >= 3 && rank <= 5) {
    using tag = memory::format_tag;
    const tag blocked = rank == 3 ? tag::nCw8c : rank == 4 ? tag::nChw8c : tag::nCdhw8c;
    const dnnl::pooling_v2_forward::primitive_desc alt =
        primitive(memory::desc(x_md.dims(), memory::data_type::f32, blocked), any_layout(y_md.dims()));
    if (!implementation_is(alt, "simple") && !implementation_is(alt, "ref")) pd = alt;
  }
  const Place xp = k->reordered({Place::kInput, 0}, x_md, pd.src_desc());
  const bool y_plain = same_bytes(pd.dst_desc(), y_md);
  const Place yp = y_plain ? Place{Place::kOutput, 0} : k->reserve(pd.dst_desc().get_size());
  k->add_step(dnnl::pooling_v2_forward(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_SRC, pd.src_desc(), xp}, {DNNL_ARG_DST, pd.dst_desc(), yp}});
  if (!y_plain) k->add_reorder(yp, pd.dst_desc(), {Place::kOutput, 0}, y_md);
  return k;
}

// X: (N, C, spatial...) with 1 to 3 spatial dims, Y of the same rank.
bool pool_shapes_ok(const KernelSpec& s) {
  const size_t r = s.inputs[0].shape.size();
  return s.inputs.size() == 1 && r >= 3 && r <= 5 && s.outputs[0].shape.size() == r;
}

std::unique_ptr<Kernel> make_window_pool(const KernelSpec& s, dnnl::algorithm alg,
                                         bool count_include_pad) {
  const Dims& x = s.inputs[0].shape;
  const auto w = resolve_window(s.node, x, s.outputs[0].shape, s.node.attr_ints("kernel_shape"));
  // With count_include_pad, ONNX does not count the cells ceil_mode adds; oneDNN would.
  if (!w || (count_include_pad && w->ceil_padded)) return nullptr;
  return build_or_null(s, [&] {
    return build_pool(s, alg, plain_desc(s.inputs[0]), plain_desc(s.outputs[0]), *w);
  });
}

// ---------------------------------------------------------------------------------------------
// LayerNormalization

// LayerNormalization over the dims from `axis` on: X viewed as (outer, inner), Scale and B as
// (inner). Y = (X - mean) / sqrt(var + epsilon) * Scale + B per row; the optional outputs are
// Mean and InvStdDev = 1 / sqrt(var + epsilon), (outer) values each.
std::unique_ptr<Kernel> build_layer_norm(const KernelSpec& s, int64_t outer, int64_t inner) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const memory::desc x_md = plain_desc(DType::kFloat32, {outer, inner});
  const memory::desc row_md = plain_desc(DType::kFloat32, {inner});
  const memory::desc stat_md = plain_desc(DType::kFloat32, {outer});
  const auto wanted = [&](size_t i) { return i < s.outputs.size() && s.outputs[i].dtype != DType::kUndefined; };
  const bool stats = wanted(1) || wanted(2);
  const bool shift = s.has_input(2);
  const float eps = s.node.attr_float("epsilon", 1e-5f);
  using F = dnnl::normalization_flags;
  const dnnl::layer_normalization_forward::desc d(
      stats ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference, x_md,
      stat_md, eps, F::use_scale | (shift ? F::use_shift : F::none));
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::layer_normalization_forward::primitive_desc pd(d, attr, k->engine());

  Args args = {{DNNL_ARG_SRC, x_md, {Place::kInput, 0}},
               {DNNL_ARG_DST, x_md, {Place::kOutput, 0}},
               {DNNL_ARG_SCALE, row_md, {Place::kInput, 1}}};
  if (shift) args.emplace_back(DNNL_ARG_SHIFT, row_md, Place{Place::kInput, 2});
  const size_t stat_bytes = static_cast<size_t>(outer) * sizeof(float);
  const Place var = stats ? k->reserve(stat_bytes) : Place{};
  if (stats) {
    args.emplace_back(DNNL_ARG_MEAN, stat_md,
                      wanted(1) ? Place{Place::kOutput, 1} : k->reserve(stat_bytes));
    args.emplace_back(DNNL_ARG_VARIANCE, stat_md, var);
  }
  k->add_step(dnnl::layer_normalization_forward(pd), pd.scratchpad_desc(), args);
  if (wanted(2))
    k->set_epilogue([=](std::span<const Buffer>, std::span<const Buffer> out,
                        std::byte* scratch) {
      const auto* v = reinterpret_cast<const float*>(scratch + var.at);
      float* inv_std = out[2].as<float>();
      for (int64_t i = 0; i < outer; ++i) inv_std[i] = 1.f / std::sqrt(v[i] + eps);
    });
  return k;
}

}  // namespace

// Conv(X, W, B?): conv_window's shape rules (exec/window.h), B of M.
std::unique_ptr<Kernel> make_conv(const KernelSpec& s) {
  if (s.inputs.size() < 2 || !single_output(s) || !float_only(s)) return nullptr;
  const Dims& x = s.inputs[0].shape;
  const Dims& wt = s.inputs[1].shape;
  const auto w = conv_window(s.node, x, wt, s.outputs[0].shape, false);
  if (!w || (s.has_input(2) && s.inputs[2].shape != Dims{wt[0]})) return nullptr;
  const int64_t group = s.node.attr_int("group", 1);
  // Apart, so that a product oneDNN declines (a dnnl::error) still leaves the conv to try.
  if (std::unique_ptr<Kernel> k = build_or_null(s, [&] { return build_pixel_product(s, *w, group); })) return k;
  if (std::unique_ptr<Kernel> k = make_depthwise_conv(s, *w, group)) return k;
  return build_or_null(s, [&] { return build_conv(s, *w, group); });
}

// MaxPool with 1 to 3 spatial dims (dilations through pooling_v2); the Indices output is not
// made, so a node that asks for it is declined. f32, u8 and s8.
std::unique_ptr<Kernel> make_max_pool(const KernelSpec& s) {
  if (!pool_shapes_ok(s) || !single_output(s)) return nullptr;
  const DType t = s.inputs[0].dtype;
  if (t != s.outputs[0].dtype || (t != DType::kFloat32 && t != DType::kUInt8 && t != DType::kInt8))
    return nullptr;
  return make_window_pool(s, dnnl::algorithm::pooling_max, false);
}

// AveragePool: count_include_pad chooses whether padded cells count in the divisor.
std::unique_ptr<Kernel> make_average_pool(const KernelSpec& s) {
  if (!pool_shapes_ok(s) || !single_output(s) || !float_only(s)) return nullptr;
  const bool include = s.node.attr_int("count_include_pad", 0) != 0;
  return make_window_pool(s,
                          include ? dnnl::algorithm::pooling_avg_include_padding
                                  : dnnl::algorithm::pooling_avg_exclude_padding,
                          include);
}

// LayerNormalization (opset 17): axis (negative counts from the end), epsilon, stash_type 1.
std::unique_ptr<Kernel> make_layer_norm(const KernelSpec& s) {
  if (s.inputs.size() < 2 || s.outputs.size() > 3 || !float_only(s) || !s.has_input(1))
    return nullptr;
  for (size_t i = 1; i < s.outputs.size(); ++i)
    if (s.outputs[i].dtype != DType::kUndefined && s.outputs[i].dtype != DType::kFloat32)
      return nullptr;
  const Dims& x = s.inputs[0].shape;
  const int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = s.node.attr_int("axis", -1);
  if (axis < 0) axis += rank;
  if (rank == 0 || axis < 0 || axis >= rank || s.node.attr_int("stash_type", 1) != 1)
    return nullptr;
  const int64_t outer = product(x, 0, static_cast<size_t>(axis));
  const int64_t inner = product(x, static_cast<size_t>(axis), x.size());
  if (s.inputs[1].numel() != inner || (s.has_input(2) && s.inputs[2].numel() != inner) ||
      s.outputs[0] != s.inputs[0])
    return nullptr;
  return build_or_null(s, [&] { return build_layer_norm(s, outer, inner); });
}

}  // namespace pt::cpu
