// exec/cpu/window.h: the spatial geometry of a window op (Conv, pooling, and their gradients):
// ONNX's kernel_shape, strides, dilations, pads, auto_pad and ceil_mode resolved against concrete
// input and output shapes into the explicit form oneDNN takes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt::cpu {

using Dims = std::vector<int64_t>;

// A window op's spatial geometry in oneDNN's terms (dilation counted from 0: 0 is dense).
struct Window {
  Dims kernel, strides, dilation, pad_l, pad_r;
  bool ceil_padded = false;  // pad_r grew past the given pads so that the last window fits
};

inline Dims ints_or(const Node& n, const char* key, size_t count, int64_t fallback) {
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
  w.strides = ints_or(n, "strides", r, 1);
  const Dims dil = ints_or(n, "dilations", r, 1);
  const Dims pads = ints_or(n, "pads", 2 * r, 0);
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

}  // namespace pt::cpu
