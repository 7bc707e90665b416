// exec/window.h: the spatial geometry of a window op (Conv, pooling, and their gradients):
// ONNX's kernel_shape, strides, dilations, pads, auto_pad and ceil_mode resolved against concrete
// input and output shapes into an explicit form (oneDNN's; the CUDA kernels convert it), and the
// shape rules of Conv and of the pooling gradients. Backend-neutral: the CPU (exec/cpu/nn*.cc)
// and CUDA (exec/cuda/conv.cc, pool.cc) factories resolve windows here, so they accept the same
// nodes with the same geometry.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/ir.h"
#include "exec/kernel_geometry.h"

namespace pt {

// A window op's spatial geometry in oneDNN's terms (dilation counted from 0: 0 is dense).
struct Window {
  Dims kernel, strides, dilation, pad_l, pad_r;
  bool ceil_padded = false;  // pad_r grew past the given pads so that the last window fits
};

// Whether every entry of d is v: a 1x1 kernel (all_are(w.kernel, 1)), unit strides, no pads.
inline bool all_are(const Dims& d, int64_t v) {
  return std::all_of(d.begin(), d.end(), [v](int64_t e) { return e == v; });
}

// Attribute `key`, or `count` copies of `fallback` when it is absent.
inline Dims window_ints(const Node& n, const char* key, size_t count, int64_t fallback) {
  Dims v = n.attr_ints(key);
  if (v.empty()) v.assign(count, fallback);
  return v;
}

// Resolves kernel, strides, dilations, pads and auto_pad against the input `in` and output `out`
// (both (N, C, spatial...)) so that, per spatial dim, out = (in + pad_l + pad_r - dk) / s + 1
// with dk = (k - 1) * d + 1, as oneDNN requires. SAME_UPPER puts the odd pad at the end,
// SAME_LOWER at the start; pad_r grows where ceil_mode made the output one longer.
inline std::optional<Window> resolve_window(const Node& n, const Dims& in, const Dims& out,
                                            const Dims& kernel) {
  const size_t r = in.size() - 2;
  Window w;
  w.kernel = kernel;
  w.strides = window_ints(n, "strides", r, 1);
  const Dims dil = window_ints(n, "dilations", r, 1);
  const Dims pads = window_ints(n, "pads", 2 * r, 0);
  const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  if (kernel.size() != r || w.strides.size() != r || dil.size() != r || pads.size() != 2 * r ||
      out.size() != in.size() || !(same || auto_pad == "NOTSET" || auto_pad == "VALID"))
    return std::nullopt;
  for (size_t i = 0; i < r; ++i) {
    const int64_t s = w.strides[i], dk = (kernel[i] - 1) * dil[i] + 1;
    const int64_t src = in[i + 2], dst = out[i + 2];
    if (s < 1 || dil[i] < 1 || kernel[i] < 1 || dst < 1) return std::nullopt;
    int64_t pl = auto_pad == "NOTSET" ? pads[i] : 0, pr = auto_pad == "NOTSET" ? pads[i + r] : 0;
    if (same) {
      const int64_t total = std::max<int64_t>(0, (dst - 1) * s + dk - src);
      pl = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pr = total - pl;
    }
    const int64_t need = (dst - 1) * s + dk - src - pl;
    if (need > pr) {
      pr = need;
      w.ceil_padded = true;
    }
    if (pl < 0 || (src + pl + pr - dk) / s + 1 != dst) return std::nullopt;
    w.dilation.push_back(dil[i] - 1);
    w.pad_l.push_back(pl);
    w.pad_r.push_back(pr);
  }
  return w;
}

// Conv's shape rules: X (N, C, in...), W (M, C/group, k...), Y (N, M, out...) with 1 to 3
// spatial dims, C and M divisible by group, kernel_shape (when given) W's spatial dims; the window
// resolved. `grad`: the rules of the gradient ops (ConvGradInput, ConvGradWeight), which take
// auto_pad NOTSET only and a Y of the shape Conv gives without ceil rounding. nullopt when a rule
// does not hold.
inline std::optional<Window> conv_window(const Node& n, const Dims& x, const Dims& w,
                                         const Dims& y, bool grad) {
  const int64_t group = n.attr_int("group", 1);
  if (x.size() < 3 || x.size() > 5 || w.size() != x.size() || y.size() != x.size() || group < 1)
    return std::nullopt;
  const int64_t c = x[1], m = w[0];
  if (c % group != 0 || m % group != 0 || w[1] * group != c || y[0] != x[0] || y[1] != m)
    return std::nullopt;
  if (grad && n.attr_string("auto_pad", "NOTSET") != "NOTSET") return std::nullopt;
  const Dims kernel(w.begin() + 2, w.end());
  const Dims given = n.attr_ints("kernel_shape");
  if (!given.empty() && given != kernel) return std::nullopt;
  const auto window = resolve_window(n, x, y, kernel);
  if (!window || (grad && window->ceil_padded)) return std::nullopt;
  return window;
}

// The pooling gradients, (dY) or (dY, X) -> dX: X (N, C, spatial...) with 1 to 3 spatial dims,
// dY (input 0) of the same rank, N and C; the window resolved from the pooling attributes and,
// without ceil_mode, dY of the floor shape. nullopt when a rule does not hold.
inline std::optional<Window> pool_grad_window(const KernelSpec& s, const Dims& x) {
  const Dims& y = s.inputs[0].shape;
  if (x.size() < 3 || x.size() > 5 || y.size() != x.size() || y[0] != x[0] || y[1] != x[1] ||
      s.outputs[0].shape != x)
    return std::nullopt;
  const auto w = resolve_window(s.node, x, y, s.node.attr_ints("kernel_shape"));
  if (!w || (w->ceil_padded && s.node.attr_int("ceil_mode", 0) == 0)) return std::nullopt;
  return w;
}

}  // namespace pt
