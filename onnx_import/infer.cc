#include "onnx_import/infer.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <string>

#include "core/error.h"

namespace pt {
namespace {

using Dims = std::vector<int64_t>;
using Types = std::vector<TensorType>;
using Result = std::optional<Types>;

// One node's inputs and outputs, as a rule reads them.
class Args {
 public:
  Args(const Node& node, const std::vector<const TensorType*>& types,
       const std::vector<const Tensor*>& constants, const std::string& where)
      : node(node), types_(types), constants_(constants), where_(where) {}

  const Node& node;
  bool has(size_t i) const { return i < types_.size() && types_[i]; }
  const TensorType& type(size_t i) const { return *types_[i]; }
  const Dims& shape(size_t i) const { return types_[i]->shape; }
  int64_t rank(size_t i) const { return static_cast<int64_t>(types_[i]->shape.size()); }
  // The int64/int32 values of constant input i; nullopt when it is not constant.
  std::optional<Dims> ints(size_t i) const {
    const Tensor* t = i < constants_.size() ? constants_[i] : nullptr;
    if (!t) return std::nullopt;
    return int_values(*t);
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw UserError(where_, what, "check the bound dimensions (--micro-batch, --dim) against the model");
  }
  int64_t axis(int64_t a, int64_t rank) const {
    if (a < -rank || a >= rank)
      fail("axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    return a < 0 ? a + rank : a;
  }

 private:
  const std::vector<const TensorType*>& types_;
  const std::vector<const Tensor*>& constants_;
  const std::string& where_;
};

Result one(DType dtype, Dims shape) { return Types{TensorType{dtype, std::move(shape)}}; }

int64_t product(const Dims& d, size_t begin, size_t end) {
  return std::accumulate(d.begin() + static_cast<std::ptrdiff_t>(begin),
                         d.begin() + static_cast<std::ptrdiff_t>(end), int64_t{1}, std::multiplies<>());
}

Dims broadcast(const Args& a, const std::vector<Dims>& shapes) {
  std::optional<Dims> out = broadcast_shapes(shapes);
  if (!out) a.fail("shapes " + shapes_str(shapes) + " do not broadcast");
  return *out;
}

// ---- rules ----------------------------------------------------------------------------------

Result same_as_input(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  return Types(a.node.outputs.size(), a.type(0));
}

Result elementwise(const Args& a, size_t inputs, size_t dtype_from, std::optional<DType> out) {
  std::vector<Dims> shapes;
  for (size_t i = 0; i < inputs; ++i) {
    if (!a.has(i)) return std::nullopt;
    shapes.push_back(a.shape(i));
  }
  return one(out.value_or(a.type(dtype_from).dtype), broadcast(a, shapes));
}

Result matmul(const Args& a) {
  if (!a.has(0) || !a.has(1)) return std::nullopt;
  Dims x = a.shape(0), y = a.shape(1);
  const bool x1 = x.size() == 1, y1 = y.size() == 1;
  if (x.empty() || y.empty()) a.fail("MatMul of a scalar");
  if (x1) x.insert(x.begin(), 1);
  if (y1) y.push_back(1);
  if (x.back() != y[y.size() - 2])
    a.fail("inner dims differ: " + shape_str(a.shape(0)) + " @ " + shape_str(a.shape(1)));
  Dims out = broadcast(a, {Dims(x.begin(), x.end() - 2), Dims(y.begin(), y.end() - 2)});
  if (!x1) out.push_back(x[x.size() - 2]);
  if (!y1) out.push_back(y.back());
  return one(a.type(0).dtype, out);
}

Result gemm(const Args& a) {
  if (!a.has(0) || !a.has(1)) return std::nullopt;
  if (a.rank(0) != 2 || a.rank(1) != 2) a.fail("Gemm takes 2-D A and B");
  const Dims& x = a.shape(0);
  const Dims& y = a.shape(1);
  const bool ta = a.node.attr_int("transA", 0) != 0, tb = a.node.attr_int("transB", 0) != 0;
  const int64_t m = ta ? x[1] : x[0], k = ta ? x[0] : x[1], n = tb ? y[0] : y[1];
  if (k != (tb ? y[1] : y[0])) a.fail("inner dims differ: " + shape_str(x) + " and " + shape_str(y));
  return one(a.type(0).dtype, {m, n});
}

Result layer_norm(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  const int64_t r = a.rank(0), axis = a.axis(a.node.attr_int("axis", -1), r);
  Dims stats(a.shape(0).begin(), a.shape(0).begin() + axis);
  stats.resize(static_cast<size_t>(r), 1);
  Types out{a.type(0)};
  for (size_t k = 1; k < a.node.outputs.size(); ++k) out.push_back(TensorType{DType::kFloat32, stats});
  return out;
}

Result batch_norm(const Args& a) {
  if (!a.has(0) || a.rank(0) < 2) return std::nullopt;
  Types out{a.type(0)};
  for (size_t k = 1; k < a.node.outputs.size(); ++k)
    out.push_back(TensorType{a.type(0).dtype, {a.shape(0)[1]}});
  return out;
}

// Spatial output sizes of Conv and the pools (NOTSET pads, SAME_*, VALID; ceil_mode drops a last
// window that would start past the input and its left padding).
Dims window_out(const Args& a, const Dims& in, const Dims& kernel, bool ceil_mode) {
  const size_t r = kernel.size();
  // Sizes past 2^31 are no window, and keep (kernel - 1) * dilation + pads in int64.
  auto ints = [&](const char* name, size_t n, int64_t fill) {
    Dims v = a.node.attr_ints(name);
    for (int64_t x : v)
      if (x > (int64_t{1} << 31) || x < -(int64_t{1} << 31)) a.fail(std::string(name) + " " + shape_str(v) + " are out of range");
    return v.empty() ? Dims(n, fill) : v;
  };
  for (int64_t k : kernel)
    if (k < 1 || k > (int64_t{1} << 31)) a.fail("kernel " + shape_str(kernel) + " is out of range");
  const Dims strides = ints("strides", r, 1), dil = ints("dilations", r, 1), pads = ints("pads", 2 * r, 0);
  const std::string pad = a.node.attr_string("auto_pad", "NOTSET");
  if (strides.size() != r || dil.size() != r || pads.size() != 2 * r || in.size() != r + 2)
    a.fail("kernel_shape, strides, dilations or pads do not match the input's " + std::to_string(r) + " spatial dims");
  Dims out{in[0]};
  for (size_t i = 0; i < r; ++i) {
    const int64_t x = in[i + 2], s = strides[i], dk = (kernel[i] - 1) * dil[i] + 1;
    if (s < 1) a.fail("stride " + std::to_string(s));
    int64_t o;
    if (pad == "SAME_UPPER" || pad == "SAME_LOWER") {
      o = (x + s - 1) / s;
    } else if (pad == "VALID") {
      o = (x - dk + s) / s;
    } else {
      const int64_t span = x + pads[i] + pads[i + r] - dk;
      if (span < 0) a.fail("the window (" + std::to_string(dk) + ") is larger than the padded input (" +
                           std::to_string(x + pads[i] + pads[i + r]) + ")");
      o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
      if (ceil_mode && (o - 1) * s >= x + pads[i]) --o;
    }
    out.push_back(o);
  }
  return out;
}

Result conv(const Args& a) {
  if (!a.has(0) || !a.has(1)) return std::nullopt;
  const Dims& w = a.shape(1);
  if (a.rank(0) < 3 || w.size() != a.shape(0).size()) a.fail("Conv takes X and W of one rank, 3 or more");
  Dims out = window_out(a, a.shape(0), Dims(w.begin() + 2, w.end()), false);
  out.insert(out.begin() + 1, w[0]);
  return one(a.type(0).dtype, out);
}

Result pool(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  const Dims kernel = a.node.attr_ints("kernel_shape");
  if (kernel.empty()) a.fail("kernel_shape is missing");
  Dims out = window_out(a, a.shape(0), kernel, a.node.attr_int("ceil_mode", 0) != 0);
  out.insert(out.begin() + 1, a.shape(0)[1]);
  Types types{TensorType{a.type(0).dtype, out}};
  if (a.node.outputs.size() > 1) types.push_back(TensorType{DType::kInt64, out});
  return types;
}

Result global_pool(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  if (a.rank(0) < 3) a.fail("takes an input [N, C, D1, ...] of rank 3 or more, not " + shape_str(a.shape(0)));
  Dims out(a.shape(0).begin(), a.shape(0).begin() + 2);
  out.resize(a.shape(0).size(), 1);
  return one(a.type(0).dtype, out);
}

Result flatten(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  const Dims& s = a.shape(0);
  const int64_t r = a.rank(0), axis = a.node.attr_int("axis", 1);
  if (axis < -r || axis > r) a.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(r));
  const size_t k = static_cast<size_t>(axis < 0 ? axis + r : axis);
  return one(a.type(0).dtype, {product(s, 0, k), product(s, k, s.size())});
}

Result reshape(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  std::optional<Dims> target = a.ints(1);
  if (!target) return std::nullopt;
  const Dims& s = a.shape(0);
  const bool allowzero = a.node.attr_int("allowzero", 0) != 0;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < target->size(); ++i) {
    int64_t& d = (*target)[i];
    if (d == 0 && !allowzero) {
      if (i >= s.size()) a.fail("shape entry 0 at " + std::to_string(i) + " copies a dim the input lacks");
      d = s[i];
    }
    if (d == -1) {
      if (infer >= 0) a.fail("more than one -1 in the shape");
      infer = static_cast<int64_t>(i);
    } else if (d < 0 || __builtin_mul_overflow(known, d, &known) || known > kMaxTensorElements) {
      a.fail("shape " + shape_str(*target) + " is not a size a tensor can have");
    }
  }
  const int64_t total = product(s, 0, s.size());
  if (infer >= 0) {
    if (known == 0 || total % known != 0) a.fail(shape_str(s) + " does not reshape to " + shape_str(*target));
    (*target)[static_cast<size_t>(infer)] = total / known;
  } else if (known != total) {
    a.fail(shape_str(s) + " does not reshape to " + shape_str(*target));
  }
  return one(a.type(0).dtype, *target);
}

Result transpose(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  const Dims& s = a.shape(0);
  Dims perm = a.node.attr_ints("perm");
  if (perm.empty())
    for (int64_t d = a.rank(0); d-- > 0;) perm.push_back(d);
  if (perm.size() != s.size()) a.fail("perm has " + std::to_string(perm.size()) + " entries for rank " + std::to_string(s.size()));
  Dims out;
  for (int64_t p : perm) out.push_back(s[static_cast<size_t>(a.axis(p, a.rank(0)))]);
  return one(a.type(0).dtype, out);
}

Result squeeze(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  const Dims& s = a.shape(0);
  std::vector<bool> drop(s.size(), false);
  if (a.has(1)) {
    std::optional<Dims> axes = a.ints(1);
    if (!axes) return std::nullopt;
    for (int64_t ax : *axes) {
      const size_t d = static_cast<size_t>(a.axis(ax, a.rank(0)));
      if (s[d] != 1) a.fail("dim " + std::to_string(d) + " of " + shape_str(s) + " is not 1");
      drop[d] = true;
    }
  } else {
    for (size_t d = 0; d < s.size(); ++d) drop[d] = s[d] == 1;
  }
  Dims out;
  for (size_t d = 0; d < s.size(); ++d)
    if (!drop[d]) out.push_back(s[d]);
  return one(a.type(0).dtype, out);
}

Result unsqueeze(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  std::optional<Dims> axes = a.ints(1);
  if (!axes) return std::nullopt;
  const int64_t r = a.rank(0) + static_cast<int64_t>(axes->size());
  std::vector<bool> added(static_cast<size_t>(r), false);
  for (int64_t ax : *axes) {
    const size_t d = static_cast<size_t>(a.axis(ax, r));
    if (added[d]) a.fail("axis " + std::to_string(ax) + " is repeated");
    added[d] = true;
  }
  Dims out;
  size_t next = 0;
  for (size_t d = 0; d < added.size(); ++d) out.push_back(added[d] ? 1 : a.shape(0)[next++]);
  return one(a.type(0).dtype, out);
}

Result concat(const Args& a) {
  for (size_t i = 0; i < a.node.inputs.size(); ++i)
    if (!a.has(i)) return std::nullopt;
  Dims out = a.shape(0);
  const int64_t axis = a.axis(a.node.attr_int("axis", 0), a.rank(0));
  for (size_t i = 1; i < a.node.inputs.size(); ++i) {
    const Dims& s = a.shape(i);
    if (s.size() != out.size()) a.fail("inputs of different ranks");
    for (size_t d = 0; d < s.size(); ++d)
      if (static_cast<int64_t>(d) != axis && s[d] != out[d])
        a.fail("shapes " + shape_str(a.shape(0)) + " and " + shape_str(s) + " differ off the axis");
    out[static_cast<size_t>(axis)] += s[static_cast<size_t>(axis)];
  }
  return one(a.type(0).dtype, out);
}

Result split(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  const Dims& s = a.shape(0);
  const size_t axis = static_cast<size_t>(a.axis(a.node.attr_int("axis", 0), a.rank(0)));
  const size_t parts = a.node.outputs.size();
  Dims sizes;
  if (a.has(1)) {
    std::optional<Dims> given = a.ints(1);
    if (!given) return std::nullopt;
    sizes = *given;
  } else {
    if (s[axis] % static_cast<int64_t>(parts) != 0)
      a.fail("dim " + std::to_string(s[axis]) + " does not split into " + std::to_string(parts) + " equal parts");
    sizes.assign(parts, s[axis] / static_cast<int64_t>(parts));
  }
  if (sizes.size() != parts || std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) != s[axis])
    a.fail("split sizes " + shape_str(sizes) + " do not cover dim " + std::to_string(s[axis]) + " in " +
           std::to_string(parts) + " outputs");
  Types out;
  for (int64_t n : sizes) {
    Dims d = s;
    d[axis] = n;
    out.push_back(TensorType{a.type(0).dtype, d});
  }
  return out;
}

// Slice: per axis, start and end clamped as ONNX does, then ceil((end - start) / step) elements.
Result slice(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  const std::optional<Dims> starts = a.ints(1), ends = a.ints(2);
  if (!starts || !ends) return std::nullopt;
  const int64_t r = a.rank(0);
  Dims axes, steps;
  if (a.has(3)) {
    std::optional<Dims> v = a.ints(3);
    if (!v) return std::nullopt;
    axes = *v;
  } else {
    for (size_t i = 0; i < starts->size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (a.has(4)) {
    std::optional<Dims> v = a.ints(4);
    if (!v) return std::nullopt;
    steps = *v;
  } else {
    steps.assign(starts->size(), 1);
  }
  if (ends->size() != starts->size() || axes.size() != starts->size() || steps.size() != starts->size())
    a.fail("starts, ends, axes and steps differ in length");
  Dims out = a.shape(0);
  for (size_t i = 0; i < axes.size(); ++i) {
    const size_t d = static_cast<size_t>(a.axis(axes[i], r));
    const int64_t dim = a.shape(0)[d], step = steps[i];
    if (step == 0) a.fail("step 0");
    int64_t start = (*starts)[i] < 0 ? (*starts)[i] + dim : (*starts)[i];
    int64_t end = (*ends)[i] < 0 ? (*ends)[i] + dim : (*ends)[i];
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      out[d] = end > start ? (end - start + step - 1) / step : 0;
    } else {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      out[d] = start > end ? (start - end - step - 1) / -step : 0;
    }
  }
  return one(a.type(0).dtype, out);
}

Result pad(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  const std::optional<Dims> pads = a.ints(1);
  if (!pads) return std::nullopt;
  const size_t r = a.shape(0).size();
  if (pads->size() != 2 * r) a.fail(std::to_string(pads->size()) + " pads for rank " + std::to_string(r));
  Dims out = a.shape(0);
  for (size_t d = 0; d < r; ++d) {
    if (std::abs((*pads)[d]) > kMaxTensorElements || std::abs((*pads)[d + r]) > kMaxTensorElements)
      a.fail("pads " + shape_str(*pads) + " are larger than any tensor");
    out[d] += (*pads)[d] + (*pads)[d + r];
  }
  return one(a.type(0).dtype, out);
}

Result gather(const Args& a) {
  if (!a.has(0) || !a.has(1)) return std::nullopt;
  const Dims& s = a.shape(0);
  const size_t axis = static_cast<size_t>(a.axis(a.node.attr_int("axis", 0), a.rank(0)));
  Dims out(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(axis));
  out.insert(out.end(), a.shape(1).begin(), a.shape(1).end());
  out.insert(out.end(), s.begin() + static_cast<std::ptrdiff_t>(axis) + 1, s.end());
  return one(a.type(0).dtype, out);
}

Result expand(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  const std::optional<Dims> shape = a.ints(1);
  if (!shape) return std::nullopt;
  return one(a.type(0).dtype, broadcast(a, {a.shape(0), *shape}));
}

Result dropout(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  Types out{a.type(0)};
  if (a.node.outputs.size() > 1) out.push_back(TensorType{DType::kBool, a.shape(0)});
  return out;
}

// ReduceMean (axes attribute, opset 13) and ReduceSum (axes input); none: every axis.
Result reduce(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  Dims axes = a.node.attr_ints("axes");
  if (a.has(1)) {
    std::optional<Dims> v = a.ints(1);
    if (!v) return std::nullopt;
    axes = *v;
  }
  const Dims& s = a.shape(0);
  if (axes.empty() && a.node.attr_int("noop_with_empty_axes", 0) != 0) return one(a.type(0).dtype, s);
  std::vector<bool> reduced(s.size(), axes.empty());
  for (int64_t ax : axes) reduced[static_cast<size_t>(a.axis(ax, a.rank(0)))] = true;
  const bool keep = a.node.attr_int("keepdims", 1) != 0;
  Dims out;
  for (size_t d = 0; d < s.size(); ++d)
    if (!reduced[d]) out.push_back(s[d]);
    else if (keep) out.push_back(1);
  return one(a.type(0).dtype, out);
}

Result cast(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  return one(static_cast<DType>(a.node.attr_int("to", 0)), a.shape(0));
}

// Bernoulli and RandomUniformLike: the input's shape, the dtype attribute (default the input's).
Result like_input(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  return one(static_cast<DType>(a.node.attr_int("dtype", static_cast<int64_t>(a.type(0).dtype))),
             a.shape(0));
}

// Tile(x, repeats): dim k is x's times repeats[k], repeats a constant.
Result tile(const Args& a) {
  if (!a.has(0)) return std::nullopt;
  const std::optional<Dims> repeats = a.ints(1);
  if (!repeats) return std::nullopt;
  const Dims& s = a.shape(0);
  if (repeats->size() != s.size())
    a.fail("its repeats have " + std::to_string(repeats->size()) + " entries for an input of rank " +
           std::to_string(s.size()));
  Dims out;
  for (size_t k = 0; k < s.size(); ++k) {
    if ((*repeats)[k] < 0) a.fail("repeats hold a negative count");
    out.push_back(s[k] * (*repeats)[k]);
  }
  return one(a.type(0).dtype, out);
}

using Rule = std::function<Result(const Args&)>;

// Every op the backends run, and its rule.
const std::map<std::string, Rule>& rules() {
  static const std::map<std::string, Rule> table = {
      {"MatMul", matmul},
      {"Gemm", gemm},
      {"Add", [](const Args& a) { return elementwise(a, 2, 0, std::nullopt); }},
      {"Sub", [](const Args& a) { return elementwise(a, 2, 0, std::nullopt); }},
      {"Mul", [](const Args& a) { return elementwise(a, 2, 0, std::nullopt); }},
      {"Div", [](const Args& a) { return elementwise(a, 2, 0, std::nullopt); }},
      {"Pow", [](const Args& a) { return elementwise(a, 2, 0, std::nullopt); }},
      {"Equal", [](const Args& a) { return elementwise(a, 2, 0, DType::kBool); }},
      {"Where", [](const Args& a) { return elementwise(a, 3, 1, std::nullopt); }},
      {"IsNaN", [](const Args& a) { return elementwise(a, 1, 0, DType::kBool); }},
      {"Cast", cast},
      {"Sqrt", same_as_input},       {"Neg", same_as_input},     {"Reciprocal", same_as_input},
      {"Sin", same_as_input},        {"Cos", same_as_input},     {"CumSum", same_as_input},
      {"Relu", same_as_input},       {"Erf", same_as_input},     {"Gelu", same_as_input},
      {"Tanh", same_as_input},       {"Sigmoid", same_as_input}, {"Clip", same_as_input},
      {"HardSigmoid", same_as_input}, {"HardSwish", same_as_input},
      {"Softmax", same_as_input},    {"LogSoftmax", same_as_input},
      {"Identity", same_as_input},
      {"LayerNormalization", layer_norm},
      {"BatchNormalization", batch_norm},
      {"Conv", conv},
      {"MaxPool", pool},
      {"AveragePool", pool},
      {"GlobalAveragePool", global_pool},
      {"Flatten", flatten},
      {"Reshape", reshape},
      {"Transpose", transpose},
      {"Squeeze", squeeze},
      {"Unsqueeze", unsqueeze},
      {"Concat", concat},
      {"Split", split},
      {"Slice", slice},
      {"Pad", pad},
      {"Gather", gather},
      {"Expand", expand},
      {"Dropout", dropout},
      {"Bernoulli", like_input},
      {"RandomUniformLike", like_input},
      {"ReduceMean", reduce},
      {"ReduceSum", reduce},
      {"ReduceMax", reduce},
      {"ReduceMin", reduce},
      {"ReduceProd", reduce},
      {"Less", [](const Args& a) { return elementwise(a, 2, 0, DType::kBool); }},
      {"Greater", [](const Args& a) { return elementwise(a, 2, 0, DType::kBool); }},
      {"LessOrEqual", [](const Args& a) { return elementwise(a, 2, 0, DType::kBool); }},
      {"GreaterOrEqual", [](const Args& a) { return elementwise(a, 2, 0, DType::kBool); }},
      {"And", [](const Args& a) { return elementwise(a, 2, 0, DType::kBool); }},
      {"Or", [](const Args& a) { return elementwise(a, 2, 0, DType::kBool); }},
      {"Xor", [](const Args& a) { return elementwise(a, 2, 0, DType::kBool); }},
      {"Mod", [](const Args& a) { return elementwise(a, 2, 0, std::nullopt); }},
      {"Min", [](const Args& a) { return elementwise(a, a.node.inputs.size(), 0, std::nullopt); }},
      {"Max", [](const Args& a) { return elementwise(a, a.node.inputs.size(), 0, std::nullopt); }},
      {"Not", same_as_input},        {"Abs", same_as_input},     {"Floor", same_as_input},
      {"Ceil", same_as_input},       {"Exp", same_as_input},     {"Trilu", same_as_input},
      {"Tile", tile},
  };
  return table;
}

}  // namespace

std::optional<std::vector<TensorType>> infer_types(const Node& node,
                                                   const std::vector<const TensorType*>& types,
                                                   const std::vector<const Tensor*>& constants,
                                                   const std::string& where) {
  const Args a(node, types, constants, where);
  // Ops of other domains (com.microsoft's Gelu): every output has the first input's type.
  if (!node.domain.empty() && node.domain != "ai.onnx") return same_as_input(a);
  auto it = rules().find(node.op_type);
  if (it == rules().end()) return std::nullopt;
  Result out = it->second(a);
  if (!out) return out;
  out->resize(node.outputs.size());  // omitted outputs stay kUndefined
  // Every rule's inputs hold at most 2^48 elements, and so does every output it gives: the bound
  // that keeps size arithmetic (here, in folding, the memory plan and the kernels) in int64.
  for (const TensorType& t : *out) {
    int64_t n = 1;
    for (int64_t d : t.shape)
      if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxTensorElements)
        a.fail("its output would be " + t.str() + ", " +
               (d < 0 ? std::string("a negative size") : "more than 2^48 elements"));
  }
  return out;
}

}  // namespace pt
