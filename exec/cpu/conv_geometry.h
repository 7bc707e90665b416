// exec/cpu/conv_geometry.h: what the window kernels of nn_grad.cc and the depthwise files share.
// In: a Conv or Conv-gradient node and its shapes. Out: its geometry (ConvGeometry), the layouts
// oneDNN's primitives are asked for, and one window dim resolved per output (PoolDim).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/ir.h"
#include "exec/cpu/dnnl_kernel.h"
#include "exec/cpu/dnnl_util.h"
#include "exec/kernel.h"
#include "exec/window.h"

namespace pt::cpu {

// The forward Conv's geometry, read from a gradient node: X: (N, C, in...), W: (M, C/group,
// k...), Y = dY: (N, M, out...), with 1 to 3 spatial dims.
struct ConvGeometry {
  Window window;
  int64_t group = 1;
  Dims x, w, y;
  Dims w_grouped;  // W as oneDNN takes it: (group, M/group, C/group, k...) when grouped
  bool pointwise = false;  // ungrouped 1x1 (plain layouts but on small planes: conv_layout)
  bool depthwise = false;  // one group per channel, one output channel each: W (C, 1, k...)
};

// One group per channel, one output channel each: W (C, 1, k...).
inline bool is_depthwise(int64_t group, const Dims& x, const Dims& w) {
  return group > 1 && group == x[1] && w[0] == x[1] && w[1] == 1;
}

// Conv's shape rules as its gradients take them (conv_window, exec/window.h); nullopt when they
// do not hold.
inline std::optional<ConvGeometry> conv_geometry(const Node& n, const Dims& x, const Dims& w, const Dims& y) {
  const auto window = conv_window(n, x, w, y, true);
  if (!window) return std::nullopt;
  ConvGeometry g{*window, n.attr_int("group", 1), x, w, y, w, false, false};
  const Dims kernel(w.begin() + 2, w.end());
  if (g.group > 1) {
    g.w_grouped[0] /= g.group;
    g.w_grouped.insert(g.w_grouped.begin(), g.group);
  }
  g.pointwise = g.group == 1 && all_are(kernel, 1);
  g.depthwise = is_depthwise(g.group, x, w);
  return g;
}

// A 2-D window of stride 1, undilated: the geometry of the depthwise plane loops (DepthwisePlanes).
inline bool unit_plane_window(const Window& w, const Dims& x) {
  return x.size() == 4 && all_are(w.strides, 1) && all_are(w.dilation, 0);
}

// The layout a conv primitive is asked for: plain for a pointwise conv but on small planes
// (pointwise_on_plain_layouts, dnnl_util.h), else its choice.
inline memory::desc conv_layout(const ConvGeometry& g, const Dims& dims) {
  const bool plain = g.pointwise && pointwise_on_plain_layouts(g.x);
  return plain ? plain_desc(DType::kFloat32, dims) : any_layout(dims);
}

// The forward primitive_desc oneDNN takes as the hint for a backward one.
inline dnnl::convolution_forward::primitive_desc conv_hint(const ConvGeometry& g, const dnnl::engine& engine) {
  const Window& w = g.window;
  return dnnl::convolution_forward::primitive_desc(
      {dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
       conv_layout(g, g.x), conv_layout(g, g.w_grouped), conv_layout(g, g.y), w.strides,
       w.dilation, w.pad_l, w.pad_r},
      engine);
}

// One spatial dim of a window op, resolved per output position o: its window's first input
// index start[o] (negative in the leading padding), and the kernel taps [lo[o], hi[o]) that fall
// inside the input. The default is a size-1 dim with a 1-tap kernel.
struct PoolDim {
  int64_t in = 1, out = 1, dilation = 1;
  std::vector<int64_t> start{0}, lo{0}, hi{1};

  PoolDim() = default;
  PoolDim(int64_t in_size, int64_t out_size, int64_t kernel, int64_t stride, int64_t dil,
          int64_t pad)
      : in(in_size), out(out_size), dilation(dil), start(out_size), lo(out_size), hi(out_size) {
    for (int64_t o = 0; o < out; ++o) {
      const int64_t s = o * stride - pad;
      start[o] = s;
      lo[o] = s >= 0 ? 0 : (-s + dil - 1) / dil;
      hi[o] = in > s ? std::min(kernel, (in - s + dil - 1) / dil) : 0;
    }
  }
};

}  // namespace pt::cpu
