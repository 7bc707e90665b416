// onnx_import/fold.cc: evaluate_constant's registry (one list, op_type -> folder), the helpers
// the fold files share (fold_detail.h), and the data-movement folders. Those copy elements as
// bytes, so they take every fixed-size dtype. The numeric folders (Cast, Range, elementwise math,
// reductions) are in fold_ops.cc, the index-driven ones (GatherElements, GatherND, CumSum) in
// fold_index.cc.
#include "onnx_import/fold.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <string>

#include "core/error.h"
#include "onnx_import/fold_detail.h"

namespace pt::fold_detail {

// ---- Shared with fold_ops.cc and fold_index.cc (declared in fold_detail.h) ----

[[noreturn]] void fail(const Node& node, const std::string& what) {
  throw UserError(node.label(), what, "fix the constants that feed this node and export again");
}

Folded one(Tensor t) {
  std::vector<Tensor> out;
  out.push_back(std::move(t));
  return out;
}

namespace {

// Thrown where a tensor folding would build passes kMaxFoldBytes; evaluate_constant turns it into
// "not folded".
struct TooLargeToFold {};

// Throws TooLargeToFold unless `shape` of `elem`-byte elements fits in kMaxFoldBytes (checked
// without overflow, whatever the dims).
void check_fold_size(const std::vector<int64_t>& shape, int64_t elem) {
  int64_t bytes = elem;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes) || bytes > kMaxFoldBytes)
      throw TooLargeToFold{};
}

}  // namespace

// A zero-filled tensor.
Tensor new_tensor(DType dtype, std::vector<int64_t> shape) {
  check_fold_size(shape, static_cast<int64_t>(dtype_size(dtype)));
  Tensor t;
  t.type = TensorType{dtype, std::move(shape)};
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  return t;
}

// The values of an int32 or int64 tensor; nullopt for null or any other dtype.
std::optional<std::vector<int64_t>> read_ints(const Tensor* t) {
  if (!t) return std::nullopt;
  return int_values(*t);
}

// axis in [-rank, rank) -> [0, rank); UserError outside.
int64_t normalize_axis(const Node& node, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    fail(node, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

// numpy (multidirectional) broadcasting of `shapes`, aligned right; UserError where two dims
// differ and neither is 1.
std::vector<int64_t> broadcast_shape(const Node& node,
                                     const std::vector<std::vector<int64_t>>& shapes) {
  std::optional<std::vector<int64_t>> out = broadcast_shapes(shapes);
  if (!out) fail(node, "shapes " + shapes_str(shapes) + " do not broadcast");
  return *out;
}

namespace {

int64_t product(const std::vector<int64_t>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(begin),
                         v.begin() + static_cast<std::ptrdiff_t>(end), int64_t{1},
                         std::multiplies<>());
}

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

// Calls visit(idx) for every multi-index of `shape`, row-major.
template <class Visit>
void for_each_index(const std::vector<int64_t>& shape, Visit visit) {
  const int64_t n = product(shape, 0, shape.size());
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    visit(idx);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// offsets[i] = base + sum_d idx_i[d] * strides[d], idx_i the i-th multi-index of `shape`.
std::vector<int64_t> strided_offsets(const std::vector<int64_t>& shape, int64_t base,
                                     const std::vector<int64_t>& strides) {
  check_fold_size(shape, sizeof(int64_t));
  std::vector<int64_t> offsets;
  for_each_index(shape, [&](const std::vector<int64_t>& idx) {
    int64_t o = base;
    for (size_t d = 0; d < idx.size(); ++d) o += idx[d] * strides[d];
    offsets.push_back(o);
  });
  return offsets;
}

}  // namespace

// offsets[i] = the element of a tensor of shape `in` that element i of `out` reads when `in`
// broadcasts to `out`.
std::vector<int64_t> broadcast_offsets(const std::vector<int64_t>& in,
                                       const std::vector<int64_t>& out) {
  PT_CHECK(in.size() <= out.size(), shape_str(in) + " does not broadcast to " + shape_str(out));
  const std::vector<int64_t> in_strides = row_major_strides(in);
  std::vector<int64_t> strides(out.size(), 0);
  const size_t lead = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) strides[lead + d] = in[d] == 1 ? 0 : in_strides[d];
  return strided_offsets(out, 0, strides);
}

namespace {

const Tensor* input(const Inputs& in, size_t i) { return i < in.size() ? in[i] : nullptr; }

// out[i] = src[offsets[i]], element by element.
Tensor take(const Tensor& src, std::vector<int64_t> shape, const std::vector<int64_t>& offsets) {
  Tensor out = new_tensor(src.type.dtype, std::move(shape));
  const size_t elem = dtype_size(src.type.dtype);
  for (size_t i = 0; i < offsets.size(); ++i)
    std::memcpy(&out.data[i * elem], &src.data[static_cast<size_t>(offsets[i]) * elem], elem);
  return out;
}

Tensor reshaped(const Tensor& src, std::vector<int64_t> shape) {
  Tensor out = src;
  out.type.shape = std::move(shape);
  return out;
}

Tensor int64_tensor(const std::vector<int64_t>& values, std::vector<int64_t> shape) {
  Tensor t = new_tensor(DType::kInt64, std::move(shape));
  std::copy(values.begin(), values.end(), t.as<int64_t>());
  return t;
}

Tensor float_tensor(const std::vector<float>& values, std::vector<int64_t> shape) {
  Tensor t = new_tensor(DType::kFloat32, std::move(shape));
  std::copy(values.begin(), values.end(), t.as<float>());
  return t;
}

// ---- Data-movement folders ----

Folded fold_constant(const Node& node, const Inputs&, int64_t) {
  if (auto it = node.attrs.find("value"); it != node.attrs.end()) {
    if (const Tensor* t = std::get_if<Tensor>(&it->second)) return one(*t);
    return std::nullopt;
  }
  if (node.has_attr("value_int")) return one(int64_tensor({node.attr_int("value_int", 0)}, {}));
  if (node.has_attr("value_float")) return one(float_tensor({node.attr_float("value_float", 0)}, {}));
  if (node.has_attr("value_ints")) {
    std::vector<int64_t> v = node.attr_ints("value_ints");
    return one(int64_tensor(v, {static_cast<int64_t>(v.size())}));
  }
  if (auto it = node.attrs.find("value_floats"); it != node.attrs.end()) {
    const auto* v = std::get_if<std::vector<float>>(&it->second);
    if (v) return one(float_tensor(*v, {static_cast<int64_t>(v->size())}));
  }
  return std::nullopt;  // sparse_value, value_string(s)
}

Folded fold_identity(const Node&, const Inputs& in, int64_t) { return one(*in[0]); }

// Shape-15: dims [start, end) of the input's shape, both clamped into [0, rank].
Folded fold_shape(const Node& node, const Inputs& in, int64_t) {
  const std::vector<int64_t>& s = in[0]->type.shape;
  const int64_t rank = static_cast<int64_t>(s.size());
  auto clamp = [rank](int64_t a) { return std::clamp<int64_t>(a < 0 ? a + rank : a, 0, rank); };
  const int64_t start = clamp(node.attr_int("start", 0));
  const int64_t end = std::max(start, clamp(node.attr_int("end", rank)));
  std::vector<int64_t> dims(s.begin() + start, s.begin() + end);
  return one(int64_tensor(dims, {end - start}));
}

Folded fold_size(const Node&, const Inputs& in, int64_t) {
  return one(int64_tensor({in[0]->type.numel()}, {}));
}

// Gather: out[pre..., idx..., post...] = data[pre..., indices[idx...], post...]
Folded fold_gather(const Node& node, const Inputs& in, int64_t) {
  const Tensor& data = *in[0];
  std::optional<std::vector<int64_t>> indices = read_ints(in[1]);
  if (!indices) return std::nullopt;
  const std::vector<int64_t>& s = data.type.shape;
  if (s.empty()) fail(node, "cannot gather from a scalar");
  const size_t axis = static_cast<size_t>(
      normalize_axis(node, node.attr_int("axis", 0), static_cast<int64_t>(s.size())));
  const int64_t dim = s[axis];
  for (int64_t& i : *indices) {
    if (i < -dim || i >= dim)
      fail(node, "index " + std::to_string(i) + " is out of range for axis " +
                     std::to_string(axis) + " of size " + std::to_string(dim));
    if (i < 0) i += dim;
  }
  std::vector<int64_t> shape(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(axis));
  shape.insert(shape.end(), in[1]->type.shape.begin(), in[1]->type.shape.end());
  shape.insert(shape.end(), s.begin() + static_cast<std::ptrdiff_t>(axis) + 1, s.end());
  Tensor out = new_tensor(data.type.dtype, shape);
  if (out.data.empty()) return one(std::move(out));
  const size_t block = static_cast<size_t>(product(s, axis + 1, s.size())) * dtype_size(data.type.dtype);
  std::byte* dst = out.data.data();
  for (int64_t o = 0; o < product(s, 0, axis); ++o) {
    for (int64_t i : *indices) {
      std::memcpy(dst, &data.data[static_cast<size_t>(o * dim + i) * block], block);
      dst += block;
    }
  }
  return one(std::move(out));
}

// Axes of Squeeze/Unsqueeze: the second input since opset 13, the attribute before.
std::optional<std::vector<int64_t>> squeeze_axes(const Node& node, const Inputs& in,
                                                 int64_t opset) {
  if (opset >= 13) return read_ints(input(in, 1));
  if (!node.has_attr("axes")) return std::nullopt;
  return node.attr_ints("axes");
}

Folded fold_unsqueeze(const Node& node, const Inputs& in, int64_t opset) {
  std::optional<std::vector<int64_t>> axes = squeeze_axes(node, in, opset);
  if (!axes) return std::nullopt;
  const std::vector<int64_t>& s = in[0]->type.shape;
  const int64_t rank = static_cast<int64_t>(s.size() + axes->size());
  std::vector<bool> inserted(static_cast<size_t>(rank), false);
  for (int64_t a : *axes) {
    const auto d = static_cast<size_t>(normalize_axis(node, a, rank));
    if (inserted[d]) fail(node, "axis " + std::to_string(a) + " is given twice");
    inserted[d] = true;
  }
  std::vector<int64_t> shape;
  auto next = s.begin();
  for (bool ins : inserted) shape.push_back(ins ? 1 : *next++);
  return one(reshaped(*in[0], shape));
}

// Squeeze without axes drops every dim of size 1.
Folded fold_squeeze(const Node& node, const Inputs& in, int64_t opset) {
  const std::vector<int64_t>& s = in[0]->type.shape;
  const bool given = opset >= 13 ? input(in, 1) != nullptr : node.has_attr("axes");
  std::vector<bool> drop(s.size(), false);
  for (size_t d = 0; d < s.size(); ++d) drop[d] = !given && s[d] == 1;
  if (given) {
    std::optional<std::vector<int64_t>> axes = squeeze_axes(node, in, opset);
    if (!axes) return std::nullopt;
    for (int64_t a : *axes) {
      const auto d = static_cast<size_t>(normalize_axis(node, a, static_cast<int64_t>(s.size())));
      if (s[d] != 1)
        fail(node, "cannot squeeze axis " + std::to_string(a) + " of size " + std::to_string(s[d]));
      drop[d] = true;
    }
  }
  std::vector<int64_t> shape;
  for (size_t d = 0; d < s.size(); ++d)
    if (!drop[d]) shape.push_back(s[d]);
  return one(reshaped(*in[0], shape));
}

// Concat: every input has the first's dtype and rank, and its dims except along axis.
Folded fold_concat(const Node& node, const Inputs& in, int64_t) {
  if (!node.has_attr("axis")) return std::nullopt;
  for (const Tensor* t : in)
    if (!t) return std::nullopt;
  std::vector<int64_t> shape = in[0]->type.shape;
  if (shape.empty()) fail(node, "cannot concatenate scalars");
  const auto axis = static_cast<size_t>(
      normalize_axis(node, node.attr_int("axis", 0), static_cast<int64_t>(shape.size())));
  shape[axis] = 0;
  for (const Tensor* t : in) {
    std::vector<int64_t> s = t->type.shape;
    if (s.size() != shape.size() || t->type.dtype != in[0]->type.dtype)
      fail(node, "cannot concatenate " + in[0]->type.str() + " with " + t->type.str());
    shape[axis] += s[axis];
    s[axis] = shape[axis];
    if (s != shape) fail(node, "cannot concatenate " + in[0]->type.str() + " with " + t->type.str());
  }
  Tensor out = new_tensor(in[0]->type.dtype, shape);
  if (out.data.empty()) return one(std::move(out));
  const int64_t inner = product(shape, axis + 1, shape.size()) *
                        static_cast<int64_t>(dtype_size(in[0]->type.dtype));
  std::byte* dst = out.data.data();
  for (int64_t o = 0; o < product(shape, 0, axis); ++o) {
    for (const Tensor* t : in) {
      const auto chunk = static_cast<size_t>(t->type.shape[axis] * inner);
      if (chunk == 0) continue;
      std::memcpy(dst, t->data.data() + static_cast<size_t>(o) * chunk, chunk);
      dst += chunk;
    }
  }
  return one(std::move(out));
}

// Reshape: 0 copies the input's dim at that index (unless allowzero), one -1 is inferred.
Folded fold_reshape(const Node& node, const Inputs& in, int64_t) {
  std::optional<std::vector<int64_t>> shape = read_ints(in[1]);
  if (!shape) return std::nullopt;
  const std::vector<int64_t>& s = in[0]->type.shape;
  const bool allowzero = node.attr_int("allowzero", 0) != 0;
  auto cannot = [&](const std::string& why) {
    fail(node, "cannot reshape " + shape_str(s) + " to " + shape_str(*shape) + ": " + why);
  };
  size_t infer = shape->size();
  int64_t known = 1;
  for (size_t i = 0; i < shape->size(); ++i) {
    int64_t& d = (*shape)[i];
    if (d == 0 && !allowzero) {
      if (i >= s.size()) cannot("0 copies a dim the input does not have");
      d = s[i];
    }
    if (d == -1) {
      if (infer != shape->size()) cannot("more than one -1");
      infer = i;
    } else if (d < 0) {
      cannot("negative dim");
    } else {
      known *= d;
    }
  }
  const int64_t n = in[0]->type.numel();
  if (infer != shape->size()) {
    if (known == 0 || n % known != 0) cannot("the -1 cannot be inferred");
    (*shape)[infer] = n / known;
  } else if (known != n) {
    cannot("element counts differ");
  }
  return one(reshaped(*in[0], *shape));
}

// ConstantOfShape: the one-element `value` (default float32 0) repeated over the given shape.
Folded fold_constant_of_shape(const Node& node, const Inputs& in, int64_t) {
  std::optional<std::vector<int64_t>> shape = read_ints(in[0]);
  if (!shape) return std::nullopt;
  for (int64_t d : *shape)
    if (d < 0) fail(node, "shape " + shape_str(*shape) + " has a negative dim");
  Tensor value = float_tensor({0.0f}, {1});
  if (auto it = node.attrs.find("value"); it != node.attrs.end()) {
    const Tensor* v = std::get_if<Tensor>(&it->second);
    if (!v || v->type.numel() != 1) return std::nullopt;
    value = *v;
  }
  check_fold_size(*shape, sizeof(int64_t));
  const std::vector<int64_t> offsets(static_cast<size_t>(product(*shape, 0, shape->size())), 0);
  return one(take(value, *shape, offsets));
}

// Expand: numpy broadcasting of the input with the given shape.
Folded fold_expand(const Node& node, const Inputs& in, int64_t) {
  std::optional<std::vector<int64_t>> target = read_ints(in[1]);
  if (!target) return std::nullopt;
  for (int64_t d : *target)
    if (d < 0) fail(node, "shape " + shape_str(*target) + " has a negative dim");
  const std::vector<int64_t>& s = in[0]->type.shape;
  std::vector<int64_t> shape = broadcast_shape(node, {s, *target});
  return one(take(*in[0], shape, broadcast_offsets(s, shape)));
}

// Where: out = cond ? x : y, all three broadcast together.
Folded fold_where(const Node& node, const Inputs& in, int64_t) {
  const Tensor &cond = *in[0], &x = *in[1], &y = *in[2];
  if (cond.type.dtype != DType::kBool || x.type.dtype != y.type.dtype) return std::nullopt;
  std::vector<int64_t> shape =
      broadcast_shape(node, {cond.type.shape, x.type.shape, y.type.shape});
  const std::vector<int64_t> oc = broadcast_offsets(cond.type.shape, shape);
  const std::vector<int64_t> ox = broadcast_offsets(x.type.shape, shape);
  const std::vector<int64_t> oy = broadcast_offsets(y.type.shape, shape);
  Tensor out = new_tensor(x.type.dtype, shape);
  const size_t elem = dtype_size(x.type.dtype);
  for (size_t i = 0; i < oc.size(); ++i) {
    const bool c = cond.as<uint8_t>()[oc[i]] != 0;
    const std::byte* src = c ? &x.data[static_cast<size_t>(ox[i]) * elem]
                             : &y.data[static_cast<size_t>(oy[i]) * elem];
    std::memcpy(&out.data[i * elem], src, elem);
  }
  return one(std::move(out));
}

struct SliceArgs {
  std::vector<int64_t> starts, ends, axes, steps;
};

// Slice-10+ takes starts, ends, axes, steps as inputs; Slice-1 takes the first three as attributes.
std::optional<SliceArgs> slice_args(const Node& node, const Inputs& in, int64_t opset) {
  SliceArgs a;
  if (opset >= 10) {
    auto starts = read_ints(input(in, 1)), ends = read_ints(input(in, 2));
    auto axes = read_ints(input(in, 3)), steps = read_ints(input(in, 4));
    if (!starts || !ends || (input(in, 3) && !axes) || (input(in, 4) && !steps)) return std::nullopt;
    a = {*starts, *ends, axes.value_or(std::vector<int64_t>{}), steps.value_or(std::vector<int64_t>{})};
  } else {
    if (!node.has_attr("starts") || !node.has_attr("ends")) return std::nullopt;
    a = {node.attr_ints("starts"), node.attr_ints("ends"), node.attr_ints("axes"), {}};
  }
  const size_t n = a.starts.size();
  if (a.axes.empty())
    for (size_t i = 0; i < n; ++i) a.axes.push_back(static_cast<int64_t>(i));
  if (a.steps.empty()) a.steps.assign(n, 1);
  if (a.ends.size() != n || a.axes.size() != n || a.steps.size() != n)
    fail(node, "starts, ends, axes and steps differ in length");
  return a;
}

// Slice along each given axis: start and end shift by dim when negative, then clamp into
// [0, dim] (step > 0) or [-1, dim - 1] (step < 0, start at most dim - 1);
// length = max(0, ceil((end - start) / step)).
Folded fold_slice(const Node& node, const Inputs& in, int64_t opset) {
  std::optional<SliceArgs> a = slice_args(node, in, opset);
  if (!a) return std::nullopt;
  const std::vector<int64_t>& s = in[0]->type.shape;
  const int64_t rank = static_cast<int64_t>(s.size());
  const std::vector<int64_t> in_strides = row_major_strides(s);
  std::vector<int64_t> shape = s, strides = in_strides;
  std::vector<bool> seen(s.size(), false);
  int64_t base = 0;
  for (size_t i = 0; i < a->starts.size(); ++i) {
    const auto d = static_cast<size_t>(normalize_axis(node, a->axes[i], rank));
    const int64_t step = a->steps[i], dim = s[d];
    if (seen[d]) fail(node, "axis " + std::to_string(a->axes[i]) + " is sliced twice");
    if (step == 0) fail(node, "a step is 0");
    seen[d] = true;
    int64_t start = a->starts[i] < 0 ? a->starts[i] + dim : a->starts[i];
    int64_t end = a->ends[i] < 0 ? a->ends[i] + dim : a->ends[i];
    start = std::max<int64_t>(0, std::min(start, step > 0 ? dim : dim - 1));
    end = std::max<int64_t>(step > 0 ? 0 : -1, std::min(end, step > 0 ? dim : dim - 1));
    const int64_t span = step > 0 ? end - start : start - end, stride = step > 0 ? step : -step;
    shape[d] = dim == 0 || span <= 0 ? 0 : (span - 1) / stride + 1;
    base += start * in_strides[d];
    strides[d] = step * in_strides[d];
  }
  if (product(shape, 0, shape.size()) == 0) base = 0;
  return one(take(*in[0], shape, strided_offsets(shape, base, strides)));
}

// Transpose: out dim d is input dim perm[d]; no perm reverses the dims.
Folded fold_transpose(const Node& node, const Inputs& in, int64_t) {
  const std::vector<int64_t>& s = in[0]->type.shape;
  std::vector<int64_t> perm = node.attr_ints("perm");
  if (!node.has_attr("perm"))
    for (size_t d = s.size(); d-- > 0;) perm.push_back(static_cast<int64_t>(d));
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (size_t d = 0; d < sorted.size(); ++d)
    if (sorted.size() != s.size() || sorted[d] != static_cast<int64_t>(d))
      fail(node, "perm " + shape_str(perm) + " is not a permutation of " + std::to_string(s.size()) + " dims");
  const std::vector<int64_t> in_strides = row_major_strides(s);
  std::vector<int64_t> shape, strides;
  for (int64_t p : perm) {
    shape.push_back(s[static_cast<size_t>(p)]);
    strides.push_back(in_strides[static_cast<size_t>(p)]);
  }
  return one(take(*in[0], shape, strided_offsets(shape, 0, strides)));
}

// Tile: out[i] = x[i mod shape(x)], out dims = dims * repeats.
Folded fold_tile(const Node& node, const Inputs& in, int64_t) {
  std::optional<std::vector<int64_t>> repeats = read_ints(in[1]);
  if (!repeats) return std::nullopt;
  const std::vector<int64_t>& s = in[0]->type.shape;
  if (repeats->size() != s.size())
    fail(node, "repeats " + shape_str(*repeats) + " does not match rank " + std::to_string(s.size()));
  std::vector<int64_t> shape;
  for (size_t d = 0; d < s.size(); ++d) {
    if ((*repeats)[d] < 0) fail(node, "repeats " + shape_str(*repeats) + " has a negative entry");
    int64_t dim = 0;
    if (__builtin_mul_overflow(s[d], (*repeats)[d], &dim)) throw TooLargeToFold{};
    shape.push_back(dim);
  }
  check_fold_size(shape, sizeof(int64_t));
  const std::vector<int64_t> strides = row_major_strides(s);
  std::vector<int64_t> offsets;
  for_each_index(shape, [&](const std::vector<int64_t>& idx) {
    int64_t o = 0;
    for (size_t d = 0; d < idx.size(); ++d) o += idx[d] % s[d] * strides[d];
    offsets.push_back(o);
  });
  return one(take(*in[0], shape, offsets));
}

// Trilu over the last two dims (i, j): upper keeps j - i >= k, lower keeps j - i <= k; the
// rest become 0 (all-zero bytes are 0 in every dtype).
Folded fold_trilu(const Node& node, const Inputs& in, int64_t) {
  const std::vector<int64_t>& s = in[0]->type.shape;
  if (s.size() < 2) fail(node, "input " + in[0]->type.str() + " has rank below 2");
  int64_t k = 0;
  if (const Tensor* kt = input(in, 1)) {
    std::optional<std::vector<int64_t>> kv = read_ints(kt);
    if (!kv || kv->size() != 1) return std::nullopt;
    k = (*kv)[0];
  }
  const bool upper = node.attr_int("upper", 1) != 0;
  Tensor out = *in[0];
  const int64_t rows = s[s.size() - 2], cols = s[s.size() - 1];
  const size_t elem = dtype_size(out.type.dtype);
  for (int64_t b = 0; b < product(s, 0, s.size() - 2); ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        if (upper ? j - i < k : j - i > k)
          std::memset(&out.data[static_cast<size_t>((b * rows + i) * cols + j) * elem], 0, elem);
  return one(std::move(out));
}

}  // namespace

namespace {

struct Folder {
  size_t required_inputs;  // inputs [0, required_inputs) must be present
  Folded (*fold)(const Node&, const Inputs&, int64_t opset);
};

// Every op folding handles, and the folder for it.
const std::map<std::string, Folder>& folders() {
  static const std::map<std::string, Folder> table = {
      // Data movement (this file).
      {"Constant", {0, fold_constant}},
      {"ConstantOfShape", {1, fold_constant_of_shape}},
      {"Concat", {1, fold_concat}},
      {"Expand", {2, fold_expand}},
      {"Gather", {2, fold_gather}},
      {"GatherElements", {2, fold_gather_elements}},
      {"GatherND", {2, fold_gather_nd}},
      {"CumSum", {2, fold_cumsum}},
      {"Identity", {1, fold_identity}},
      {"Reshape", {2, fold_reshape}},
      {"Shape", {1, fold_shape}},
      {"Size", {1, fold_size}},
      {"Slice", {1, fold_slice}},
      {"Squeeze", {1, fold_squeeze}},
      {"Tile", {2, fold_tile}},
      {"Transpose", {1, fold_transpose}},
      {"Trilu", {1, fold_trilu}},
      {"Unsqueeze", {1, fold_unsqueeze}},
      {"Where", {3, fold_where}},
      // Conversion and generation (fold_ops.cc).
      {"Cast", {1, fold_cast}},
      {"CastLike", {2, fold_cast_like}},
      {"Range", {3, fold_range}},
      // Broadcasting binary and variadic math.
      {"Add", {2, fold_add}},
      {"Sub", {2, fold_sub}},
      {"Mul", {2, fold_mul}},
      {"Div", {2, fold_div}},
      {"Pow", {2, fold_pow}},
      {"Min", {1, fold_min}},
      {"Max", {1, fold_max}},
      {"Equal", {2, fold_equal}},
      {"Less", {2, fold_less}},
      {"LessOrEqual", {2, fold_less_or_equal}},
      {"Greater", {2, fold_greater}},
      {"GreaterOrEqual", {2, fold_greater_or_equal}},
      {"And", {2, fold_and}},
      {"Or", {2, fold_or}},
      {"Xor", {2, fold_xor}},
      // Unary math.
      {"Not", {1, fold_not}},
      {"Neg", {1, fold_neg}},
      {"Abs", {1, fold_abs}},
      {"Sqrt", {1, fold_sqrt}},
      {"Floor", {1, fold_floor}},
      {"Ceil", {1, fold_ceil}},
      {"Reciprocal", {1, fold_reciprocal}},
      {"Sin", {1, fold_sin}},
      {"Cos", {1, fold_cos}},
      {"Exp", {1, fold_exp}},
      {"IsNaN", {1, fold_is_nan}},
      {"Mod", {2, fold_mod}},
      // Reductions.
      {"ReduceSum", {1, fold_reduce_sum}},
      {"ReduceProd", {1, fold_reduce_prod}},
      {"ReduceMax", {1, fold_reduce_max}},
      {"ReduceMin", {1, fold_reduce_min}},
  };
  return table;
}

}  // namespace
}  // namespace pt::fold_detail

namespace pt {

std::optional<std::vector<Tensor>> evaluate_constant(const Node& node,
                                                     const std::vector<const Tensor*>& inputs,
                                                     int64_t opset) {
  PT_CHECK(inputs.size() == node.inputs.size(), node.label() + ": " +
                                                    std::to_string(inputs.size()) + " values for " +
                                                    std::to_string(node.inputs.size()) + " inputs");
  if (!node.domain.empty() && node.domain != "ai.onnx") return std::nullopt;
  const auto& table = fold_detail::folders();
  auto it = table.find(node.op_type);
  if (it == table.end() || inputs.size() < it->second.required_inputs) return std::nullopt;
  for (size_t i = 0; i < it->second.required_inputs; ++i)
    if (!inputs[i]) return std::nullopt;
  std::optional<std::vector<Tensor>> out;
  try {
    out = it->second.fold(node, inputs, opset);
  } catch (const fold_detail::TooLargeToFold&) {
    return std::nullopt;
  }
  if (out && out->size() != node.outputs.size()) return std::nullopt;
  return out;
}

}  // namespace pt
