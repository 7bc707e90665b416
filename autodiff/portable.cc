// autodiff/portable.cc: the standard-ONNX form of each pipetrain-domain op (core/pipetrain_ops.h),
// one lowering per op with its form in a comment above it, all listed in kLowerings. Notation as
// in the spec; ReduceSum_A sums over the axes A, "keep" keeps them as size 1; constants are
// float32 scalars unless said otherwise. Only ops whose signature is the same in every opset from
// 17 on are emitted (no ReduceMean, whose axes moved from attribute to input in 18).
#include "autodiff/portable.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "autodiff/grad_context.h"
#include "core/error.h"
#include "core/pipetrain_ops.h"

namespace pt {
namespace {

using Attrs = std::map<std::string, AttrValue>;
using Shape = std::vector<int64_t>;

// LayerNormalization's opset; ScatterND and ScatterElements with reduction "add" need 16.
constexpr int64_t kPortableOpset = 17;

TensorType f32(const Shape& s) { return TensorType{DType::kFloat32, s}; }

Shape iota(int64_t lo, int64_t hi) {
  Shape v(static_cast<size_t>(std::max<int64_t>(hi - lo, 0)));
  std::iota(v.begin(), v.end(), lo);
  return v;
}

Shape concat(Shape a, const Shape& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Shape spatial(const Shape& s) { return Shape(s.begin() + 2, s.end()); }

int64_t product(const Shape& s, size_t lo, size_t hi) {
  int64_t p = 1;
  for (size_t i = lo; i < hi; ++i) p *= s[i];
  return p;
}

int64_t norm_axis(int64_t axis, size_t rank) {
  return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
}

// Emits the standard nodes that replace one pipetrain node. Each helper appends one node and
// returns its output: a fresh value, or `into` when given (an output of the replaced node, whose
// type the helper's result must have).
//
// Shapes and types are taken by value: emitting grows the graph's value table, which would leave a
// reference into it dangling.
class Lowering {
 public:
  Lowering(Graph& g, const Node& n, std::vector<Node>& out) : g_(g), n_(n), out_(out) {}

  const Node& node() const { return n_; }
  ValueId in(size_t i) const { return i < n_.inputs.size() ? n_.inputs[i] : kNoValue; }
  ValueId out(size_t k) const { return k < n_.outputs.size() ? n_.outputs[k] : kNoValue; }
  const TensorType& type(ValueId v) const { return g_.value(v).type; }
  const Shape& shape(ValueId v) const { return type(v).shape; }
  [[noreturn]] void fail(const std::string& why) const {
    throw UserError(n_.label(), "has no portable form: " + why,
                    "export without --portable, or change the attribute in the model");
  }

  ValueId emit(const std::string& op, std::vector<ValueId> inputs, TensorType t, Attrs attrs = {},
               ValueId into = kNoValue) {
    return emit_n(op, std::move(inputs), {t}, std::move(attrs), into)[0];
  }

  std::vector<ValueId> emit_n(const std::string& op, std::vector<ValueId> inputs,
                              const std::vector<TensorType>& outs, Attrs attrs = {},
                              ValueId into = kNoValue) {
    Node n;
    n.op_type = op;
    n.inputs = std::move(inputs);
    n.attrs = std::move(attrs);
    for (size_t k = 0; k < outs.size(); ++k) {
      if (k == 0 && into != kNoValue) {
        PT_CHECK(type(into) == outs[0], n_.label() + ": lowered " + op + " gives " + outs[0].str() +
                                            " for " + type(into).str());
        n.outputs.push_back(into);
      } else {
        n.outputs.push_back(g_.add_value(fresh(op), outs[k]));
      }
    }
    n.name = g_.value(n.outputs[0]).name;
    out_.push_back(std::move(n));
    return out_.back().outputs;
  }

  ValueId constant(Tensor t, const std::string& stem) {
    return g_.add_initializer(fresh(stem), std::move(t), /*constant=*/true);
  }

  ValueId ints(Shape v) {  // int64 [n]
    Tensor t{TensorType{DType::kInt64, {static_cast<int64_t>(v.size())}}, {}};
    t.data.resize(v.size() * sizeof(int64_t));
    std::memcpy(t.data.data(), v.data(), t.data.size());
    return constant(std::move(t), "ints");
  }

  ValueId int_scalar(int64_t v) {  // int64 []
    Tensor t{TensorType{DType::kInt64, {}}, std::vector<std::byte>(sizeof v)};
    std::memcpy(t.data.data(), &v, sizeof v);
    return constant(std::move(t), "int");
  }

  ValueId scalar(float v) {  // float32 [], one initializer per value and node
    auto it = scalars_.find(v);
    if (it != scalars_.end()) return it->second;
    Tensor t{f32({}), std::vector<std::byte>(sizeof v)};
    std::memcpy(t.data.data(), &v, sizeof v);
    return scalars_[v] = constant(std::move(t), "scalar");
  }

  // Numpy-broadcasting binary op; the result has a's dtype (bool for comparisons and And).
  ValueId binary(const std::string& op, ValueId a, ValueId b, ValueId into = kNoValue) {
    const bool logical = op == "Greater" || op == "Less" || op == "Equal" || op == "And";
    const DType dt = logical ? DType::kBool : type(a).dtype;
    return emit(op, {a, b}, TensorType{dt, broadcast_shape(shape(a), shape(b))}, {}, into);
  }
  ValueId add(ValueId a, ValueId b, ValueId into = kNoValue) { return binary("Add", a, b, into); }
  ValueId sub(ValueId a, ValueId b, ValueId into = kNoValue) { return binary("Sub", a, b, into); }
  ValueId mul(ValueId a, ValueId b, ValueId into = kNoValue) { return binary("Mul", a, b, into); }
  ValueId div(ValueId a, ValueId b, ValueId into = kNoValue) { return binary("Div", a, b, into); }

  ValueId unary(const std::string& op, ValueId a, ValueId into = kNoValue) {
    return emit(op, {a}, type(a), {}, into);
  }

  ValueId where(ValueId c, ValueId a, ValueId b, ValueId into = kNoValue) {
    const Shape s = broadcast_shape(shape(c), broadcast_shape(shape(a), shape(b)));
    return emit("Where", {c, a, b}, TensorType{type(a).dtype, s}, {}, into);
  }

  // ReduceSum over `axes` (all axes when empty).
  ValueId reduce_sum(ValueId v, Shape axes, bool keep, ValueId into = kNoValue) {
    Shape s;
    for (size_t d = 0; d < shape(v).size(); ++d) {
      const bool reduced =
          axes.empty() || std::count(axes.begin(), axes.end(), static_cast<int64_t>(d));
      if (!reduced)
        s.push_back(shape(v)[d]);
      else if (keep)
        s.push_back(1);
    }
    std::vector<ValueId> inputs = {v};
    if (!axes.empty()) inputs.push_back(ints(axes));
    return emit("ReduceSum", inputs, TensorType{type(v).dtype, s},
                {{"keepdims", int64_t{keep ? 1 : 0}}}, into);
  }

  // v summed over `axes` (none: a copy) and reshaped to into's shape (same element count).
  void sum_into(ValueId v, Shape axes, ValueId into) {
    if (axes.empty()) return void(reshape(v, shape(into), into));
    const ValueId s = reduce_sum(v, axes, false);
    reshape(s, shape(into), into);
  }

  ValueId reshape(ValueId v, Shape s, ValueId into = kNoValue) {
    return emit("Reshape", {v, ints(s)}, TensorType{type(v).dtype, s}, {}, into);
  }

  ValueId transpose(ValueId v, Shape perm, ValueId into = kNoValue) {
    Shape s;
    for (int64_t p : perm) s.push_back(shape(v)[static_cast<size_t>(p)]);
    return emit("Transpose", {v}, TensorType{type(v).dtype, s}, {{"perm", perm}}, into);
  }

  ValueId unsqueeze_last(ValueId v) {
    return emit("Unsqueeze", {v, ints({-1})}, TensorType{type(v).dtype, concat(shape(v), {1})});
  }

  // The leading block of v of shape s (every axis sliced from 0).
  ValueId crop(ValueId v, Shape s) {
    const ValueId starts = ints(Shape(s.size(), 0));
    return emit("Slice", {v, starts, ints(s), ints(iota(0, static_cast<int64_t>(s.size())))},
                TensorType{type(v).dtype, s});
  }

  ValueId zeros(Shape s) {
    Tensor zero{f32({1}), std::vector<std::byte>(sizeof(float))};  // all bits 0 is 0.0f
    return emit("ConstantOfShape", {ints(s)}, f32(s), {{"value", zero}});
  }

 private:
  std::string fresh(const std::string& stem) {
    const std::string base = (n_.name.empty() ? n_.op_type : n_.name) + "/" + stem;
    std::string name = base;
    for (int k = 1; g_.find(name) != kNoValue; ++k) name = base + "." + std::to_string(k);
    return name;
  }

  Graph& g_;
  const Node& n_;
  std::vector<Node>& out_;
  std::map<float, ValueId> scalars_;
};

// ---- element-wise ---------------------------------------------------------------------------

// dX = Where(Y > 0, dY, 0)
void lower_relu_grad(Lowering& L) {
  const ValueId zero = L.scalar(0.f);
  L.where(L.binary("Greater", L.in(1), zero), L.in(0), zero, L.out(0));
}

// dX = Where(And(X > min, X < max), dY, 0); an omitted bound drops its comparison; with both
// omitted dX = Identity(dY)
void lower_clip_grad(Lowering& L) {
  const ValueId x = L.in(1);
  ValueId inside = kNoValue;
  if (L.in(2) != kNoValue) inside = L.binary("Greater", x, L.in(2));
  if (L.in(3) != kNoValue) {
    const ValueId below = L.binary("Less", x, L.in(3));
    inside = inside == kNoValue ? below : L.binary("And", inside, below);
  }
  if (inside == kNoValue)
    L.unary("Identity", L.in(0), L.out(0));
  else
    L.where(inside, L.in(0), L.scalar(0.f), L.out(0));
}

// dX = dY * (Exp(-(X * X)) * 2/sqrt(pi))
void lower_erf_grad(Lowering& L) {
  const ValueId x = L.in(1);
  const ValueId e = L.unary("Exp", L.unary("Neg", L.mul(x, x)));
  L.mul(L.in(0), L.mul(e, L.scalar(static_cast<float>(M_2_SQRTPI))), L.out(0));
}

// "none":  gelu'(x) = Phi(x) + x * phi(x),  Phi(x) = 0.5 * (1 + Erf(x / sqrt(2))),
//          phi(x) = Exp(-x^2 / 2) / sqrt(2 pi)
// "tanh":  t = Tanh(k * x * (1 + a x^2)), k = sqrt(2/pi), a = 0.044715,
//          gelu'(x) = 0.5 * (1 + t) + 0.5 x * (1 - t^2) * (k + 3 a k x^2)
// dX = dY * gelu'(X)
void lower_gelu_grad(Lowering& L) {
  const ValueId x = L.in(1), x2 = L.mul(x, x), one = L.scalar(1.f), half = L.scalar(0.5f);
  const std::string mode = L.node().attr_string("approximate", "none");
  ValueId d = kNoValue;
  if (mode == "none") {
    const ValueId erf = L.unary("Erf", L.mul(x, L.scalar(static_cast<float>(M_SQRT1_2))));
    const ValueId cdf = L.mul(L.add(erf, one), half);
    const ValueId pdf = L.mul(L.unary("Exp", L.mul(x2, L.scalar(-0.5f))),
                              L.scalar(static_cast<float>(0.5 * M_2_SQRTPI * M_SQRT1_2)));
    d = L.add(cdf, L.mul(x, pdf));
  } else if (mode == "tanh") {
    const double k = std::sqrt(2.0 / M_PI), a = 0.044715;
    const ValueId inner = L.mul(x, L.add(L.mul(x2, L.scalar(static_cast<float>(a))), one));
    const ValueId t = L.unary("Tanh", L.mul(inner, L.scalar(static_cast<float>(k))));
    const ValueId sech2 = L.sub(one, L.mul(t, t));
    const ValueId du =
        L.add(L.mul(x2, L.scalar(static_cast<float>(3 * a * k))), L.scalar(static_cast<float>(k)));
    d = L.add(L.mul(L.add(t, one), half), L.mul(L.mul(x, half), L.mul(sech2, du)));
  } else {
    L.fail("approximate '" + mode + "' (none or tanh)");
  }
  L.mul(L.in(0), d, L.out(0));
}

// ---- softmax and normalisation --------------------------------------------------------------

// dX = Y * (dY - ReduceSum_axis(dY * Y, keep))
void lower_softmax_grad(Lowering& L) {
  const ValueId dy = L.in(0), y = L.in(1);
  const int64_t axis = norm_axis(L.node().attr_int("axis", -1), L.shape(y).size());
  L.mul(y, L.sub(dy, L.reduce_sum(L.mul(dy, y), {axis}, true)), L.out(0));
}

// dX = dY - Exp(Y) * ReduceSum_axis(dY, keep)
void lower_log_softmax_grad(Lowering& L) {
  const ValueId dy = L.in(0), y = L.in(1);
  const int64_t axis = norm_axis(L.node().attr_int("axis", -1), L.shape(y).size());
  L.sub(dy, L.mul(L.unary("Exp", y), L.reduce_sum(dy, {axis}, true)), L.out(0));
}

// A = [axis, rank), n = |A|; xhat = (X - Mean) * InvStdDev, g = dY * Scale (Mean and InvStdDev
// are [.., 1, 1] over A, so they broadcast against X)
// dX = InvStdDev * (g - ReduceSum_A(g, keep)/n - xhat * ReduceSum_A(g * xhat, keep)/n)
// dScale = ReduceSum_[0,axis)(dY * xhat), dBias = ReduceSum_[0,axis)(dY), reshaped to their types
void lower_layer_norm_grad(Lowering& L) {
  const ValueId dy = L.in(0), x = L.in(1), istd = L.in(4);
  const size_t rank = L.shape(x).size();
  const int64_t axis = norm_axis(L.node().attr_int("axis", -1), rank);
  const ValueId xhat = L.mul(L.sub(x, L.in(3)), istd);
  if (L.out(0) != kNoValue) {
    const Shape a = iota(axis, static_cast<int64_t>(rank));
    const ValueId inv_n =
        L.scalar(1.f / static_cast<float>(product(L.shape(x), static_cast<size_t>(axis), rank)));
    const ValueId g = L.mul(dy, L.in(2));
    const ValueId m1 = L.mul(L.reduce_sum(g, a, true), inv_n);
    const ValueId m2 = L.mul(L.reduce_sum(L.mul(g, xhat), a, true), inv_n);
    L.mul(istd, L.sub(L.sub(g, m1), L.mul(xhat, m2)), L.out(0));
  }
  const Shape lead = iota(0, axis);
  if (L.out(1) != kNoValue) L.sum_into(L.mul(dy, xhat), lead, L.out(1));
  if (L.out(2) != kNoValue) L.sum_into(dy, lead, L.out(2));
}

// R = all axes but 1, n = |R|; per channel, kept as [1, C, 1, ..]:
//   mean = ReduceSum_R(X)/n, var = ReduceSum_R((X - mean)^2)/n, istd = Reciprocal(Sqrt(var + eps))
//   xhat = (X - mean) * istd, dBias = ReduceSum_R(dY), dScale = ReduceSum_R(dY * xhat)
// dX = Scale * istd * (dY - dBias/n - xhat * dScale/n); dScale, dBias reshaped to [C]
void lower_batch_norm_grad(Lowering& L) {
  const ValueId dy = L.in(0), x = L.in(1);
  const Shape xs = L.shape(x);
  if (xs.size() < 2) L.fail("X must be [N, C, ...]");
  Shape r = {0}, per_channel(xs.size(), 1);
  for (size_t d = 2; d < xs.size(); ++d) r.push_back(static_cast<int64_t>(d));
  per_channel[1] = xs[1];
  const ValueId inv_n = L.scalar(static_cast<float>(xs[1]) / static_cast<float>(L.type(x).numel()));
  const ValueId xc = L.sub(x, L.mul(L.reduce_sum(x, r, true), inv_n));
  const ValueId var = L.mul(L.reduce_sum(L.mul(xc, xc), r, true), inv_n);
  const float eps = L.node().attr_float("epsilon", 1e-5f);
  const ValueId istd = L.unary("Reciprocal", L.unary("Sqrt", L.add(var, L.scalar(eps))));
  const ValueId xhat = L.mul(xc, istd);
  const bool dx = L.out(0) != kNoValue;
  const ValueId dbias = dx || L.out(2) != kNoValue ? L.reduce_sum(dy, r, true) : kNoValue;
  const ValueId dscale =
      dx || L.out(1) != kNoValue ? L.reduce_sum(L.mul(dy, xhat), r, true) : kNoValue;
  if (dx) {
    const ValueId k = L.mul(L.reshape(L.in(2), per_channel), istd);
    const ValueId centred =
        L.sub(L.sub(dy, L.mul(dbias, inv_n)), L.mul(xhat, L.mul(dscale, inv_n)));
    L.mul(k, centred, L.out(0));
  }
  if (L.out(1) != kNoValue) L.reshape(dscale, L.shape(L.out(1)), L.out(1));
  if (L.out(2) != kNoValue) L.reshape(dbias, L.shape(L.out(2)), L.out(2));
}

// R = all axes but 1, n = |R|; per channel, kept as [1, C, 1, ..]:
//   mean = ReduceSum_R(X)/n, var = ReduceSum_R((X - mean)^2)/n
//   Y = (X - mean) * (Scale / Sqrt(var + eps)) + B
//   batch_mean = mean, batch_var = var * n/(n - 1), reshaped to [C]
void lower_batch_norm_training(Lowering& L) {
  const ValueId x = L.in(0);
  const Shape xs = L.shape(x);
  if (xs.size() < 2) L.fail("X must be [N, C, ...]");
  const int64_t n = L.type(x).numel() / xs[1];
  if (n < 2) L.fail("the unbiased variance needs two values per channel");
  Shape r = {0}, per_channel(xs.size(), 1);
  for (size_t d = 2; d < xs.size(); ++d) r.push_back(static_cast<int64_t>(d));
  per_channel[1] = xs[1];
  const ValueId inv_n = L.scalar(1.f / static_cast<float>(n));
  const ValueId mean = L.mul(L.reduce_sum(x, r, true), inv_n);
  const ValueId xc = L.sub(x, mean);
  const ValueId var = L.mul(L.reduce_sum(L.mul(xc, xc), r, true), inv_n);
  const float eps = L.node().attr_float("epsilon", 1e-5f);
  const ValueId a =
      L.div(L.reshape(L.in(1), per_channel), L.unary("Sqrt", L.add(var, L.scalar(eps))));
  L.add(L.mul(xc, a), L.reshape(L.in(2), per_channel), L.out(0));
  if (L.out(1) != kNoValue) L.reshape(mean, L.shape(L.out(1)), L.out(1));
  if (L.out(2) != kNoValue) {
    const ValueId unbiased = L.mul(var, L.scalar(static_cast<float>(n) / static_cast<float>(n - 1)));
    L.reshape(unbiased, L.shape(L.out(2)), L.out(2));
  }
}

// SeededDropout and SeededBernoulli have none: no standard op draws from a counter-based
// generator, and ONNX's Dropout and Bernoulli draw masks that neither pipetrain nor a recompute
// could reproduce.
void lower_seeded_dropout(Lowering& L) {
  throw UserError(L.node().label(), "has no portable form: training-mode dropout draws its mask "
                                    "from pipetrain's own generator",
                  "turn training-mode dropout off for the portable export");
}

// ---- convolution and pooling ----------------------------------------------------------------

// A window op's attributes per spatial dim, ONNX defaults filled in (auto_pad NOTSET only).
struct Window {
  Shape kernel, strides, dilations, pad_begin, pad_end;
};

Shape ints_or(const Node& n, const char* key, size_t count, int64_t fallback) {
  Shape v = n.attr_ints(key);
  return v.empty() ? Shape(count, fallback) : v;
}

Window window_of(const Lowering& L, const Shape& kernel) {
  const Node& n = L.node();
  const size_t r = kernel.size();
  const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET") L.fail("auto_pad " + auto_pad + " (explicit pads only)");
  Window w{kernel, ints_or(n, "strides", r, 1), ints_or(n, "dilations", r, 1), {}, {}};
  const Shape pads = ints_or(n, "pads", 2 * r, 0);
  if (w.strides.size() != r || w.dilations.size() != r || pads.size() != 2 * r)
    L.fail("strides, dilations or pads do not match " + std::to_string(r) + " spatial dims");
  w.pad_begin.assign(pads.begin(), pads.begin() + static_cast<long>(r));
  w.pad_end.assign(pads.begin() + static_cast<long>(r), pads.end());
  return w;
}

// ConvTranspose attributes that map a window op's output (spatial dims `out`) back onto its input
// (`in`): the transposed extent (out - 1) * s + (k - 1) * d + 1 starts pad_begin before the input;
// what runs past the input's end is cropped as end pad, what falls short of it is filled with
// zeros as output_padding (less than s, as the forward rounds down).
Attrs transposed_window(const Window& w, const Shape& in, const Shape& out) {
  Shape pads = w.pad_begin, end, extra;
  for (size_t i = 0; i < in.size(); ++i) {
    const int64_t extent = (out[i] - 1) * w.strides[i] + (w.kernel[i] - 1) * w.dilations[i] + 1;
    const int64_t past = extent - w.pad_begin[i] - in[i];
    end.push_back(std::max<int64_t>(past, 0));
    extra.push_back(std::max<int64_t>(-past, 0));
  }
  return {{"strides", w.strides},
          {"dilations", w.dilations},
          {"pads", concat(pads, end)},
          {"output_padding", extra}};
}

// dX = ConvTranspose(dY, W) with Conv's group, strides, dilations and begin pads; end pads and
// output_padding from transposed_window make dX exactly input_shape
void lower_conv_grad_input(Lowering& L) {
  const ValueId dy = L.in(0), w = L.in(1), dx = L.out(0);
  const Window win = window_of(L, spatial(L.shape(w)));
  Attrs a = transposed_window(win, spatial(L.shape(dx)), spatial(L.shape(dy)));
  a["group"] = L.node().attr_int("group", 1);
  L.emit("ConvTranspose", {dy, w}, L.type(dx), a, dx);
}

// dW[m, c, k] = sum over n, o of dY[n, m, o] * Xpad[n, g*Cg + c, o*s + k*d - pad_begin]: a Conv of
// X against dY with batch and channels swapped (G groups, Cg = C/G; M = G*Og outputs):
//   X [N, G*Cg, in..] -> Reshape [N, G, Cg, in..] -> Transpose -> [Cg, G, N, ..] -> [Cg, G*N, in..]
//   dY [N, M, out..] -> Transpose -> [M, N, out..] (the kernel; group g's rows stay together)
//   Conv(group G, strides = d, dilations = s, pads = pad_begin and the least end pad that reaches
//   every tap) -> [Cg, M, k'..], k' >= k -> Slice to k -> Transpose -> dW [M, Cg, k..]
void lower_conv_grad_weight(Lowering& L) {
  const ValueId dy = L.in(0), x = L.in(1), dw = L.out(0);
  const Shape xs = L.shape(x), ys = L.shape(dy), ws = L.shape(dw);
  const int64_t r = static_cast<int64_t>(xs.size()) - 2, group = L.node().attr_int("group", 1);
  if (group < 1 || xs[1] % group != 0) L.fail("group does not divide X's channels");
  const int64_t cg = xs[1] / group;
  const Window win = window_of(L, spatial(ws));
  Shape swap01 = iota(0, r + 2);
  std::swap(swap01[0], swap01[1]);
  ValueId xt = L.transpose(x, swap01);
  if (group > 1) {
    const Shape perm = concat({2, 1, 0}, iota(3, r + 3));
    const ValueId split = L.reshape(x, concat({xs[0], group, cg}, spatial(xs)));
    xt = L.reshape(L.transpose(split, perm), concat({cg, group * xs[0]}, spatial(xs)));
  }
  Shape pads_end, full = {cg, ys[1]};
  for (size_t i = 0; i < static_cast<size_t>(r); ++i) {
    const int64_t in = xs[i + 2], out = ys[i + 2], s = win.strides[i], d = win.dilations[i];
    const int64_t reach = (win.kernel[i] - 1) * d + (out - 1) * s + 1;  // padded taps needed
    const int64_t pe = std::max<int64_t>(0, reach - in - win.pad_begin[i]);
    pads_end.push_back(pe);
    full.push_back((in + win.pad_begin[i] + pe - ((out - 1) * s + 1)) / d + 1);
  }
  const Attrs a{{"group", group},
                {"strides", win.dilations},
                {"dilations", win.strides},
                {"pads", concat(win.pad_begin, pads_end)}};
  ValueId c = L.emit("Conv", {xt, L.transpose(dy, swap01)}, f32(full), a);
  const Shape wanted = concat({cg, ys[1]}, spatial(ws));
  if (full != wanted) c = L.crop(c, wanted);
  L.transpose(c, swap01, dw);
}

// (Y, I) = MaxPool(X) with the same attributes; I holds the flat index into X of each window's
// first maximum (onnxruntime keeps the first of equal values, as the spec does);
// dX = Reshape(ScatterElements(zeros[|X|], Reshape(I, [-1]), Reshape(dY, [-1]), add), X's shape)
void lower_max_pool_grad(Lowering& L) {
  const ValueId dy = L.in(0), x = L.in(1);
  window_of(L, L.node().attr_ints("kernel_shape"));  // rejects auto_pad
  if (L.node().attr_int("storage_order", 0) != 0) L.fail("storage_order 1");
  Attrs a;
  for (const char* k : {"kernel_shape", "strides", "pads", "dilations", "ceil_mode"})
    if (L.node().has_attr(k)) a[k] = L.node().attrs.at(k);
  const TensorType yt = L.type(dy);
  const auto yi = L.emit_n("MaxPool", {x}, {yt, TensorType{DType::kInt64, yt.shape}}, a);
  const int64_t numel = L.type(x).numel(), m = yt.numel();
  const ValueId flat =
      L.emit("ScatterElements", {L.zeros({numel}), L.reshape(yi[1], {m}), L.reshape(dy, {m})},
             f32({numel}), {{"axis", int64_t{0}}, {"reduction", std::string("add")}});
  L.reshape(flat, L.shape(x), L.out(0));
}

// count[o] = the cells window o divides by, per spatial dim those of [o*s - pad_begin, + k)
// that lie in [0, in) (count_include_pad 0) or in [-pad_begin, in + pad_end) (1; cells ceil_mode
// adds past the end pad never count, as in onnxruntime), multiplied over dims; then on planes
// [N*C, 1, ..]: dX = ConvTranspose(dY / count, ones[1, 1, k..]) (transposed_window), reshaped
// to [N, C, in..]
void lower_average_pool_grad(Lowering& L) {
  const ValueId dy = L.in(0), dx = L.out(0);
  const Shape xs = L.shape(dx), ys = L.shape(dy);
  const Window w = window_of(L, L.node().attr_ints("kernel_shape"));
  if (w.kernel.size() + 2 != xs.size()) L.fail("kernel_shape does not match X's spatial dims");
  const bool include_pad = L.node().attr_int("count_include_pad", 0) != 0;
  Tensor count{f32(spatial(ys)), {}};
  count.data.resize(static_cast<size_t>(count.type.bytes()));
  float* c = count.as<float>();
  std::fill(c, c + count.type.numel(), 1.f);
  for (size_t i = 0, inner = 1; i < w.kernel.size(); ++i) {
    const int64_t in = xs[i + 2], out = ys[i + 2];
    const int64_t lo = include_pad ? -w.pad_begin[i] : 0,
                  hi = in + (include_pad ? w.pad_end[i] : 0);
    inner = static_cast<size_t>(product(ys, i + 3, ys.size()));
    for (int64_t k = 0; k < count.type.numel(); ++k) {
      const int64_t o = (k / static_cast<int64_t>(inner)) % out;
      const int64_t start = o * w.strides[i] - w.pad_begin[i];
      c[k] *= static_cast<float>(std::min(start + w.kernel[i], hi) - std::max(start, lo));
    }
  }
  const int64_t planes = xs[0] * xs[1];
  Tensor ones{f32(concat({1, 1}, w.kernel)), {}};
  ones.data.resize(static_cast<size_t>(ones.type.bytes()));
  std::fill(ones.as<float>(), ones.as<float>() + ones.type.numel(), 1.f);
  const ValueId scaled =
      L.div(L.reshape(dy, concat({planes, 1}, spatial(ys))), L.constant(std::move(count), "count"));
  const ValueId spread =
      L.emit("ConvTranspose", {scaled, L.constant(std::move(ones), "ones")},
             f32(concat({planes, 1}, spatial(xs))), transposed_window(w, spatial(xs), spatial(ys)));
  L.reshape(spread, xs, dx);
}

// ---- attention ------------------------------------------------------------------------------

// FusedAttention's operands in standard form: K and V with each kv head repeated for the G = H /
// Hkv heads that read it (Reshape [B, Hkv, 1, T, .], Expand [B, Hkv, G, T, .], Reshape
// [B, H, T, .]), and P = Softmax(S, -1), S = MatMul(Q, Transpose(K)) * scale, then + Mask (float)
// or Where(Mask, S, -inf) (bool), then Where(causal, S, -inf) with causal a constant bool [S, T]
// (j <= i).
struct Attention {
  ValueId k, v, s, p;
  float scale;
  int64_t groups;
};

ValueId repeat_heads(Lowering& L, ValueId x, int64_t groups) {
  if (groups == 1) return x;
  const Shape xs = L.shape(x);
  const Shape one = {xs[0], xs[1], 1, xs[2], xs[3]}, many = {xs[0], xs[1], groups, xs[2], xs[3]};
  const ValueId e = L.emit("Expand", {L.reshape(x, one), L.ints(many)}, f32(many));
  return L.reshape(e, {xs[0], xs[1] * groups, xs[2], xs[3]});
}

// Sums the G heads that share a kv head: [B, H, T, .] -> [B, Hkv, T, .] into `into`.
void sum_groups(Lowering& L, ValueId x, int64_t groups, ValueId into) {
  if (groups == 1) return void(L.unary("Identity", x, into));
  const Shape xs = L.shape(x);
  L.sum_into(L.reshape(x, {xs[0], xs[1] / groups, groups, xs[2], xs[3]}), {2}, into);
}

Attention attention_probs(Lowering& L, ValueId q, ValueId k, ValueId v, ValueId mask) {
  Attention a;
  const Shape qs = L.shape(q), ks = L.shape(k);
  if (qs.size() != 4 || ks.size() != 4 || ks[1] <= 0 || qs[1] % ks[1] != 0) L.fail("Q, K, V must be [B, H, S, D]");
  a.groups = qs[1] / ks[1];
  a.scale = L.node().attr_float("scale", 1.f / std::sqrt(static_cast<float>(qs[3])));
  a.k = repeat_heads(L, k, a.groups);
  a.v = repeat_heads(L, v, a.groups);
  const Shape ss = {qs[0], qs[1], qs[2], ks[2]};
  ValueId s = L.mul(L.emit("MatMul", {q, L.transpose(a.k, {0, 1, 3, 2})}, f32(ss)), L.scalar(a.scale));
  const ValueId minus_inf = L.scalar(-INFINITY);
  if (mask != kNoValue)
    s = L.type(mask).dtype == DType::kBool ? L.where(mask, s, minus_inf) : L.add(s, mask);
  if (L.node().attr_int("causal", 0) != 0) {
    Tensor seen{TensorType{DType::kBool, {qs[2], ks[2]}}, {}};
    seen.data.resize(static_cast<size_t>(qs[2] * ks[2]));
    for (int64_t i = 0; i < qs[2]; ++i)
      for (int64_t j = 0; j < ks[2]; ++j) seen.as<bool>()[i * ks[2] + j] = j <= i;
    s = L.where(L.constant(std::move(seen), "causal"), s, minus_inf);
  }
  a.s = s;
  a.p = L.emit("Softmax", {s}, f32(ss), {{"axis", int64_t{-1}}});
  return a;
}

// Y = MatMul(P, V); LogSumExp = M + Log(ReduceSum_-1(Exp(S - M))), M = TopK(S, 1) (the row max;
// ReduceMax's axes moved to an input in 18)
void lower_fused_attention(Lowering& L) {
  const Attention a = attention_probs(L, L.in(0), L.in(1), L.in(2), L.in(3));
  L.emit("MatMul", {a.p, a.v}, L.type(L.out(0)), {}, L.out(0));
  if (L.out(1) == kNoValue) return;
  const Shape ss = L.shape(a.s);
  const Shape row = {ss[0], ss[1], ss[2], 1};
  const auto top = L.emit_n("TopK", {a.s, L.ints({1})}, {f32(row), TensorType{DType::kInt64, row}},
                            {{"axis", int64_t{-1}}});
  const ValueId sum = L.reduce_sum(L.unary("Exp", L.sub(a.s, top[0])), {3}, false);
  L.add(L.unary("Log", sum), L.reshape(top[0], L.shape(L.out(1))), L.out(1));
}

// P recomputed as in the forward (LogSumExp unused); dS = P * (dP - ReduceSum_-1(dP * P, keep)),
// dP = MatMul(dY, Transpose(V));
// dQ = MatMul(dS, K) * scale, dK = groups summed of MatMul(Transpose(dS), Q) * scale,
// dV = groups summed of MatMul(Transpose(P), dY)
void lower_fused_attention_grad(Lowering& L) {
  const ValueId dy = L.in(0), q = L.in(1);
  const Attention a = attention_probs(L, q, L.in(2), L.in(3), L.in(6));
  const Shape ss = L.shape(a.s), qs = L.shape(q), vs = L.shape(a.v);
  const ValueId dp = L.emit("MatMul", {dy, L.transpose(a.v, {0, 1, 3, 2})}, f32(ss));
  const ValueId ds = L.mul(a.p, L.sub(dp, L.reduce_sum(L.mul(dp, a.p), {3}, true)));
  const ValueId scale = L.scalar(a.scale);
  if (L.out(0) != kNoValue) L.mul(L.emit("MatMul", {ds, a.k}, f32(qs)), scale, L.out(0));
  if (L.out(1) != kNoValue) {
    const ValueId dk = L.emit("MatMul", {L.transpose(ds, {0, 1, 3, 2}), q}, f32({qs[0], qs[1], ss[3], qs[3]}));
    sum_groups(L, L.mul(dk, scale), a.groups, L.out(1));
  }
  if (L.out(2) != kNoValue) {
    const ValueId dv = L.emit("MatMul", {L.transpose(a.p, {0, 1, 3, 2}), dy}, f32(vs));
    sum_groups(L, dv, a.groups, L.out(2));
  }
}

// ---- gather and loss ------------------------------------------------------------------------

// Indices as int64 with negative entries wrapped: Where(I < 0, I + size, I)
ValueId wrapped_indices(Lowering& L, ValueId indices, int64_t size) {
  ValueId i = indices;
  if (L.type(i).dtype != DType::kInt64)
    i = L.emit("Cast", {i}, TensorType{DType::kInt64, L.shape(i)},
               {{"to", static_cast<int64_t>(DType::kInt64)}});
  const ValueId negative = L.binary("Less", i, L.int_scalar(0));
  return L.where(negative, L.add(i, L.int_scalar(size)), i);
}

// D = data_shape, a = axis, q = rank(I); J = Unsqueeze(wrapped I, -1) [I.., 1]
// a = 0:  dData = ScatterND(zeros(D), J, dY, reduction add)
// a > 0:  dY [D[:a], I.., D[a+1:]] -> Transpose -> [I.., D[:a], D[a+1:]],
//         S = ScatterND(zeros([D[a], D[:a], D[a+1:]]), J, that, add),
//         dData = Transpose(S, [1, .., a, 0, a+1, ..])
void lower_gather_grad(Lowering& L) {
  const ValueId dy = L.in(0), indices = L.in(1), dd = L.out(0);
  const Shape ds = L.shape(dd);
  const int64_t r = static_cast<int64_t>(ds.size());
  const int64_t a = norm_axis(L.node().attr_int("axis", 0), ds.size());
  if (a < 0 || a >= r) L.fail("axis out of range");
  const int64_t q = static_cast<int64_t>(L.shape(indices).size());
  const ValueId j = L.unsqueeze_last(wrapped_indices(L, indices, ds[static_cast<size_t>(a)]));
  const Attrs add{{"reduction", std::string("add")}};
  if (a == 0) return void(L.emit("ScatterND", {L.zeros(ds), j, dy}, L.type(dd), add, dd));
  const Shape forward = concat(concat(iota(a, a + q), iota(0, a)), iota(a + q, r - 1 + q));
  Shape moved = {ds[static_cast<size_t>(a)]}, back;
  for (int64_t d = 0; d < r; ++d)
    if (d != a) moved.push_back(ds[static_cast<size_t>(d)]);
  back = concat(concat(iota(1, a + 1), {0}), iota(a + 1, r));
  const ValueId s =
      L.emit("ScatterND", {L.zeros(moved), j, L.transpose(dy, forward)}, f32(moved), add);
  L.transpose(s, back, dd);
}

// valid = Not(Target == ignore_index); T' = Where(valid, Target, 0) (OneHot and GatherElements
// take no ignore_index: an ignored -100 would wrap)
struct Targets {
  ValueId valid, safe;  // bool and int64 of Target's shape
};

Targets valid_targets(Lowering& L, ValueId target) {
  const ValueId ignore = L.int_scalar(L.node().attr_int("ignore_index", -100));
  const ValueId valid = L.unary("Not", L.binary("Equal", target, ignore));
  return {valid, L.where(valid, target, L.int_scalar(0))};
}

// Loss = Scale * ReduceSum(Where(valid, -P, 0)),
//   P = GatherElements(LogSoftmax(Logits, -1), T'[.., None], axis -1)
//      (-log softmax(l)[t] = logsumexp(l) - l[t])
void lower_softmax_cross_entropy(Lowering& L) {
  const ValueId logits = L.in(0);
  const Targets t = valid_targets(L, L.in(1));
  const ValueId logp = L.emit("LogSoftmax", {logits}, L.type(logits), {{"axis", int64_t{-1}}});
  const ValueId picked = L.emit("GatherElements", {logp, L.unsqueeze_last(t.safe)},
                                f32(concat(L.shape(t.safe), {1})), {{"axis", int64_t{-1}}});
  const ValueId nll = L.where(L.unsqueeze_last(t.valid), L.unary("Neg", picked), L.scalar(0.f));
  L.mul(L.reduce_sum(nll, {}, false), L.in(2), L.out(0));
}

// dLogits = Where(valid[.., None], Softmax(Logits, -1) - OneHot(T', C), 0) * (dLoss * Scale)
void lower_softmax_cross_entropy_grad(Lowering& L) {
  const ValueId logits = L.in(1);
  const TensorType lt = L.type(logits);
  const Targets t = valid_targets(L, L.in(2));
  const ValueId p = L.emit("Softmax", {logits}, lt, {{"axis", int64_t{-1}}});
  Tensor off_on{f32({2}), std::vector<std::byte>(2 * sizeof(float))};
  off_on.as<float>()[1] = 1.f;
  const ValueId onehot = L.emit(
      "OneHot", {t.safe, L.int_scalar(lt.shape.back()), L.constant(std::move(off_on), "off_on")},
      lt, {{"axis", int64_t{-1}}});
  const ValueId diff = L.where(L.unsqueeze_last(t.valid), L.sub(p, onehot), L.scalar(0.f));
  L.mul(diff, L.mul(L.in(0), L.in(3)), L.out(0));
}

using LowerFn = void (*)(Lowering&);

struct LoweringEntry {
  const char* op;
  LowerFn lower;
};

// Every op of core/pipetrain_ops.h.
constexpr LoweringEntry kLowerings[] = {
    {"ReluGrad", lower_relu_grad},
    {"ClipGrad", lower_clip_grad},
    {"ErfGrad", lower_erf_grad},
    {"GeluGrad", lower_gelu_grad},
    {"SoftmaxGrad", lower_softmax_grad},
    {"LogSoftmaxGrad", lower_log_softmax_grad},
    {"LayerNormGrad", lower_layer_norm_grad},
    {"BatchNormGrad", lower_batch_norm_grad},
    {"BatchNormTraining", lower_batch_norm_training},
    {"SeededDropout", lower_seeded_dropout},
    {"SeededBernoulli", lower_seeded_dropout},
    {"ConvGradInput", lower_conv_grad_input},
    {"ConvGradWeight", lower_conv_grad_weight},
    {"MaxPoolGrad", lower_max_pool_grad},
    {"AveragePoolGrad", lower_average_pool_grad},
    {"GatherGrad", lower_gather_grad},
    {"SoftmaxCrossEntropy", lower_softmax_cross_entropy},
    {"SoftmaxCrossEntropyGrad", lower_softmax_cross_entropy_grad},
    {"FusedAttention", lower_fused_attention},
    {"FusedAttentionGrad", lower_fused_attention_grad},
};

LowerFn find_lowering(const std::string& op) {
  for (const LoweringEntry& e : kLowerings)
    if (op == e.op) return e.lower;
  return nullptr;
}

}  // namespace

void lower_to_standard(Graph& g) {
  std::vector<Node> lowered;
  lowered.reserve(g.nodes.size());
  for (const Node& n : g.nodes) {
    if (n.domain != kPipetrainDomain) {
      lowered.push_back(n);
      continue;
    }
    const LowerFn lower = find_lowering(n.op_type);
    if (!lower)
      throw UserError(n.label(), "is not an op of the pipetrain domain (core/pipetrain_ops.h)",
                      "export without --portable");
    Lowering l(g, n, lowered);
    lower(l);
  }
  g.nodes = std::move(lowered);
  g.rebuild_uses();
  g.opsets.erase(kPipetrainDomain);
  const std::string onnx_domain = !g.opsets.count("") && g.opsets.count("ai.onnx") ? "ai.onnx" : "";
  g.opsets[onnx_domain] = std::max(g.opsets[onnx_domain], kPortableOpset);
  g.ir_version = std::max<int64_t>(g.ir_version, 8);
}

}  // namespace pt
