#include "exec/movement_geometry.h"

#include <algorithm>

namespace pt {
namespace {

// Split sizes along `axis`, taken from the output types and checked against input 1 (opset
// 13) or the `split` attribute when either is given; empty on a mismatch.
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

// data.shape[:axis] + indices + data.shape[axis+1:] and the [outer, n, inner] view of data.
std::optional<GatherGeometry> gather_view(const Dims& data, int64_t axis_attr,
                                          const TensorType& idx, const Dims& gathered) {
  if (idx.dtype != DType::kInt64 && idx.dtype != DType::kInt32) return std::nullopt;
  const int64_t axis = normalize_axis(axis_attr, data.size());
  if (axis < 0) return std::nullopt;
  const size_t a = static_cast<size_t>(axis);
  Dims want(data.begin(), data.begin() + axis);
  want.insert(want.end(), idx.shape.begin(), idx.shape.end());
  want.insert(want.end(), data.begin() + axis + 1, data.end());
  if (gathered != want) return std::nullopt;
  return GatherGeometry{product(data, 0, a), data[a], idx.numel(),
                        product(data, a + 1, data.size()), idx.dtype};
}

}  // namespace

std::vector<CopyDim> merge_copy_dims(const Dims& shape, const Dims& in_stride,
                                     const Dims& out_stride) {
  std::vector<CopyDim> dims;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 1) continue;
    if (!dims.empty() && dims.back().in == in_stride[k] * shape[k] &&
        dims.back().out == out_stride[k] * shape[k]) {
      dims.back() = {dims.back().size * shape[k], in_stride[k], out_stride[k]};
    } else {
      dims.push_back({shape[k], in_stride[k], out_stride[k]});
    }
  }
  return dims;
}

std::optional<CopyGeometry> transpose_geometry(const KernelSpec& s) {
  const Dims& in_shape = s.inputs[0].shape;
  const size_t rank = in_shape.size();
  Dims perm = s.node.attr_ints("perm");
  if (perm.empty())
    for (size_t k = rank; k-- > 0;) perm.push_back(static_cast<int64_t>(k));
  if (perm.size() != rank) return std::nullopt;
  std::vector<bool> seen(rank, false);
  const Dims in_stride = strides_of(in_shape);
  Dims shape(rank), stride(rank);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t p = normalize_axis(perm[k], rank);
    if (p < 0 || seen[p]) return std::nullopt;
    seen[p] = true;
    shape[k] = in_shape[p];
    stride[k] = in_stride[p];
  }
  if (shape != s.outputs[0].shape) return std::nullopt;
  return CopyGeometry{shape, stride, strides_of(shape)};
}

std::optional<CopyGeometry> slice_geometry(const KernelSpec& s) {
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
  return CopyGeometry{shape, in_stride, strides_of(shape), offset, 0};
}

std::optional<CopyGeometry> expand_geometry(const KernelSpec& s) {
  const Dims& in_shape = s.inputs[0].shape;
  const Dims& out_shape = s.outputs[0].shape;
  if (s.has_input(1)) {  // the output must be broadcast(input, shape)
    const auto target = constant_ints(s, 1);
    if (!target) return std::nullopt;
    const size_t rank = std::max(in_shape.size(), target->size());
    Dims want(rank);
    for (size_t k = 0; k < rank; ++k) {
      const int64_t a = k + in_shape.size() >= rank ? in_shape[k + in_shape.size() - rank] : 1;
      const int64_t b = k + target->size() >= rank ? (*target)[k + target->size() - rank] : 1;
      if (a != b && a != 1 && b != 1) return std::nullopt;
      want[k] = a == 1 ? b : a;
    }
    if (want != out_shape) return std::nullopt;
  }
  if (out_shape.size() < in_shape.size()) return std::nullopt;
  const size_t lead = out_shape.size() - in_shape.size();
  const Dims in_stride = strides_of(in_shape);
  Dims stride(out_shape.size(), 0);
  for (size_t k = 0; k < in_shape.size(); ++k) {
    if (in_shape[k] != out_shape[lead + k] && in_shape[k] != 1) return std::nullopt;
    stride[lead + k] = in_shape[k] == 1 ? 0 : in_stride[k];
  }
  return CopyGeometry{out_shape, stride, strides_of(out_shape)};
}

std::optional<CopyGeometry> tile_geometry(const KernelSpec& s) {
  const Dims& in_shape = s.inputs[0].shape;
  const Dims& out_shape = s.outputs[0].shape;
  const auto repeats = constant_ints(s, 1);
  if (!repeats || repeats->size() != in_shape.size() || out_shape.size() != in_shape.size())
    return std::nullopt;
  const Dims in_stride = strides_of(in_shape);
  Dims shape, in, out;
  int64_t below = 1;  // the output's elements below dim k
  for (size_t k = in_shape.size(); k-- > 0;) {
    if ((*repeats)[k] < 0 || out_shape[k] != (*repeats)[k] * in_shape[k]) return std::nullopt;
    shape.insert(shape.begin(), {(*repeats)[k], in_shape[k]});
    in.insert(in.begin(), {0, in_stride[k]});
    out.insert(out.begin(), {below * in_shape[k], below});
    below *= out_shape[k];
  }
  return CopyGeometry{shape, in, out};
}

std::optional<std::vector<CopyGeometry>> concat_geometry(const KernelSpec& s) {
  const TensorType& out = s.outputs[0];
  if (!s.node.has_attr("axis")) return std::nullopt;  // required
  const int64_t axis = normalize_axis(s.node.attr_int("axis", 0), out.shape.size());
  if (axis < 0) return std::nullopt;
  const int64_t outer = product(out.shape, 0, axis);
  const int64_t inner = product(out.shape, axis + 1, out.shape.size());
  const int64_t out_row = out.shape[axis] * inner;
  std::vector<CopyGeometry> parts;
  int64_t at = 0;
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    const TensorType& in = s.inputs[k];
    if (in.dtype != out.dtype || in.shape.size() != out.shape.size()) return std::nullopt;
    for (size_t d = 0; d < in.shape.size(); ++d)
      if (d != static_cast<size_t>(axis) && in.shape[d] != out.shape[d]) return std::nullopt;
    const int64_t row = in.shape[axis] * inner;
    parts.push_back({{outer, row}, {row, 1}, {out_row, 1}, 0, at * inner, k, 0});
    at += in.shape[axis];
  }
  if (at != out.shape[axis]) return std::nullopt;
  return parts;
}

std::optional<std::vector<CopyGeometry>> split_geometry(const KernelSpec& s) {
  const TensorType& in = s.inputs[0];
  if (in.shape.empty()) return std::nullopt;
  const int64_t axis = normalize_axis(s.node.attr_int("axis", 0), in.shape.size());
  if (axis < 0) return std::nullopt;
  const Dims sizes = split_sizes(s, static_cast<size_t>(axis));
  if (sizes.empty()) return std::nullopt;
  const int64_t outer = product(in.shape, 0, axis);
  const int64_t inner = product(in.shape, axis + 1, in.shape.size());
  const int64_t in_row = in.shape[axis] * inner;
  std::vector<CopyGeometry> parts;
  int64_t at = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t row = sizes[k] * inner;
    parts.push_back({{outer, row}, {in_row, 1}, {row, 1}, at * inner, 0, 0, k});
    at += sizes[k];
  }
  return parts;
}

std::optional<GatherGeometry> gather_geometry(const KernelSpec& s) {
  if (!s.has_input(1) || s.inputs[0].shape.empty()) return std::nullopt;
  return gather_view(s.inputs[0].shape, s.node.attr_int("axis", 0), s.inputs[1],
                     s.outputs[0].shape);
}

std::optional<GatherGeometry> gather_grad_geometry(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !has_io(s, 2) || s.outputs.size() != 1) return std::nullopt;
  const TensorType& dy = s.inputs[0];
  const Dims data = s.node.attr_ints("data_shape");
  if (dy.dtype != DType::kFloat32 || s.outputs[0].dtype != DType::kFloat32 || data.empty() ||
      s.outputs[0].shape != data)
    return std::nullopt;
  return gather_view(data, s.node.attr_int("axis", 0), s.inputs[1], dy.shape);
}

std::optional<Dims> pad_geometry(const KernelSpec& s) {
  if (s.inputs.size() < 2 || s.inputs.size() > 4 || !s.has_input(0) || !s.has_input(1) ||
      s.outputs.size() != 1 || s.outputs[0].dtype != s.inputs[0].dtype ||
      s.outputs[0].shape.size() != s.inputs[0].shape.size() ||
      s.node.attr_string("mode", "constant") != "constant")
    return std::nullopt;
  if (s.has_input(2) && (s.inputs[2].dtype != s.inputs[0].dtype || s.inputs[2].numel() != 1))
    return std::nullopt;
  const Dims& in = s.inputs[0].shape;
  const size_t rank = in.size();
  const auto pads = constant_ints(s, 1);
  if (!pads) return std::nullopt;
  Dims axes(rank);
  for (size_t d = 0; d < rank; ++d) axes[d] = static_cast<int64_t>(d);
  if (s.has_input(3)) {
    const auto given = constant_ints(s, 3);
    if (!given) return std::nullopt;
    axes = *given;
  }
  if (pads->size() != 2 * axes.size()) return std::nullopt;
  Dims begin(rank, 0), end(rank, 0);
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t a = normalize_axis(axes[k], rank);
    if (a < 0) return std::nullopt;
    begin[a] = (*pads)[k];
    end[a] = (*pads)[k + axes.size()];
  }
  for (size_t d = 0; d < rank; ++d)
    if (in[d] + begin[d] + end[d] != s.outputs[0].shape[d]) return std::nullopt;
  return begin;
}

}  // namespace pt
