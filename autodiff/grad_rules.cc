// autodiff/grad_rules.cc: one gradient rule per op, each with its math above it. Notation: X, A,
// B inputs, Y output, dY its gradient; sum_to reduces a broadcast gradient back to its operand's
// shape. Rules emit gradients only for the inputs that want one (ctx.wants).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>

#include "autodiff/grad_context.h"
#include "core/error.h"
#include "core/pipetrain_ops.h"

namespace pt {
namespace {

using Attrs = GradContext::Attrs;
using Shape = std::vector<int64_t>;

TensorType f32(const Shape& s) { return TensorType{DType::kFloat32, s}; }

[[noreturn]] void unsupported(GradContext& c, const std::string& why) {
  throw UserError(c.node().label(), "cannot differentiate: " + why,
                  "mark what feeds it as frozen, or change the model to avoid it");
}

Shape read_ints(const Tensor& t) {
  Shape out(static_cast<size_t>(t.type.numel()));
  for (size_t k = 0; k < out.size(); ++k)
    out[k] = t.type.dtype == DType::kInt32 ? t.as<int32_t>()[k] : t.as<int64_t>()[k];
  return out;
}

// The int64 data of constant input i (axes, pads, starts), or nullopt when it is omitted.
std::optional<Shape> const_ints(GradContext& c, size_t i) {
  if (c.x(i) == kNoValue) return std::nullopt;
  const Tensor* t = c.constant(i);
  if (!t) unsupported(c, "input " + std::to_string(i) + " is not a constant");
  return read_ints(*t);
}

int64_t norm_axis(int64_t axis, size_t rank) {
  return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
}

Shape swap_last2(size_t rank) {
  Shape p(rank);
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[rank - 1], p[rank - 2]);
  return p;
}

// ---- element-wise ---------------------------------------------------------------------------

// Y = A + B  =>  dA = sum_to(dY), dB = sum_to(dY)
void grad_add(GradContext& c) {
  for (size_t i = 0; i < 2; ++i)
    if (c.wants(i)) c.give(i, c.sum_to(c.dy(), c.shape(c.x(i))));
}

// Y = A - B  =>  dA = sum_to(dY), dB = -sum_to(dY)
void grad_sub(GradContext& c) {
  if (c.wants(0)) c.give(0, c.sum_to(c.dy(), c.shape(c.x(0))));
  if (c.wants(1)) c.give(1, c.neg(c.sum_to(c.dy(), c.shape(c.x(1)))));
}

// Y = A * B  =>  dA = sum_to(dY * B), dB = sum_to(dY * A)
void grad_mul(GradContext& c) {
  for (size_t i = 0; i < 2; ++i)
    if (c.wants(i)) c.give(i, c.sum_to(c.mul(c.dy(), c.x(1 - i)), c.shape(c.x(i))));
}

// Y = A / B  =>  dA = sum_to(dY / B), dB = -sum_to(dY * Y / B)
void grad_div(GradContext& c) {
  if (c.wants(0)) c.give(0, c.sum_to(c.div(c.dy(), c.x(1)), c.shape(c.x(0))));
  if (c.wants(1))
    c.give(1, c.neg(c.sum_to(c.div(c.mul(c.dy(), c.y(0)), c.x(1)), c.shape(c.x(1)))));
}

// Y = A ^ E  =>  dA = sum_to(dY * E * A^(E-1)); dE (= dY * Y * ln A) is not supported. A constant
// float scalar E gives E - 1 as a constant (the same float), so that the Pow's kernel sees it.
void grad_pow(GradContext& c) {
  if (c.wants(1)) unsupported(c, "the gradient of Pow's exponent is not supported");
  const Tensor* e = c.constant(1);
  const bool scalar = e && e->type.dtype == DType::kFloat32 && e->type.numel() == 1;
  const ValueId e1 = scalar ? c.scalar(e->as<float>()[0] - 1.0f) : c.sub(c.x(1), c.scalar(1.0f));
  const ValueId p = c.emit("Pow", {c.x(0), e1}, c.type(c.y(0)));
  c.give(0, c.sum_to(c.mul(c.dy(), c.mul(c.x(1), p)), c.shape(c.x(0))));
}

// Y = sqrt(X)  =>  dX = dY * 0.5 / Y
void grad_sqrt(GradContext& c) {
  c.give(0, c.mul(c.div(c.dy(), c.y(0)), c.scalar(0.5f)));
}

// Y = -X  =>  dX = -dY
void grad_neg(GradContext& c) { c.give(0, c.neg(c.dy())); }

// Y = exp(X)  =>  dX = dY * Y
void grad_exp(GradContext& c) { c.give(0, c.mul(c.dy(), c.y(0))); }

// Y = |X|  =>  dX = dY * sign(X), sign(0) = 0 (PyTorch's): (X > 0) - (X < 0) as floats
void grad_abs(GradContext& c) {
  const TensorType t = c.type(c.x(0));
  const TensorType mask_t{DType::kBool, t.shape};
  const Attrs to_float{{"to", static_cast<int64_t>(DType::kFloat32)}};
  const ValueId pos = c.emit("Cast", {c.emit("Greater", {c.x(0), c.scalar(0.0f)}, mask_t)}, t, to_float);
  const ValueId neg = c.emit("Cast", {c.emit("Less", {c.x(0), c.scalar(0.0f)}, mask_t)}, t, to_float);
  c.give(0, c.mul(c.dy(), c.sub(pos, neg)));
}

// Y = 1 / X  =>  dX = -dY * Y^2
void grad_reciprocal(GradContext& c) { c.give(0, c.neg(c.mul(c.dy(), c.mul(c.y(0), c.y(0))))); }

// Y = h(X) = clip(alpha X + beta, 0, 1)  =>  dX = alpha * ClipGrad(dY, alpha X + beta, 0, 1)
// Y = X h(X), alpha = 1/6, beta = 1/2   =>  dX = dY h(X) + X * alpha * ClipGrad(dY, alpha X + beta, 0, 1)
ValueId hard_sigmoid_slope(GradContext& c, float alpha, float beta) {
  const ValueId z = c.emit("Add", {c.mul(c.x(0), c.scalar(alpha)), c.scalar(beta)}, c.type(c.x(0)));
  const ValueId inside = c.emit("ClipGrad", {c.dy(), z, c.scalar(0.f), c.scalar(1.f)}, c.type(c.dy()), {},
                                kPipetrainDomain);
  return c.mul(inside, c.scalar(alpha));
}
void grad_hard_sigmoid(GradContext& c) {
  c.give(0, hard_sigmoid_slope(c, c.node().attr_float("alpha", 0.2f), c.node().attr_float("beta", 0.5f)));
}
void grad_hard_swish(GradContext& c) {
  const ValueId h = c.emit("HardSigmoid", {c.x(0)}, c.type(c.x(0)),
                           {{"alpha", 1.f / 6}, {"beta", 0.5f}});
  c.give(0, c.emit("Add", {c.mul(c.dy(), h), c.mul(c.x(0), hard_sigmoid_slope(c, 1.f / 6, 0.5f))},
                   c.type(c.dy())));
}

// Y = sin(X)  =>  dX = dY * cos(X);   Y = cos(X)  =>  dX = -dY * sin(X)
void grad_sin(GradContext& c) { c.give(0, c.mul(c.dy(), c.emit("Cos", {c.x(0)}, c.type(c.x(0))))); }
void grad_cos(GradContext& c) { c.give(0, c.neg(c.mul(c.dy(), c.emit("Sin", {c.x(0)}, c.type(c.x(0)))))); }

// Y[k] = sum of X[j] over j <= k along the axis  =>  dX[j] = sum of dY[k] over k >= j: the same
// scan in the other direction (exclusive stays exclusive).
void grad_cumsum(GradContext& c) {
  GradContext::Attrs attrs = {{"reverse", int64_t{c.node().attr_int("reverse", 0) == 0}},
                              {"exclusive", c.node().attr_int("exclusive", 0)}};
  c.give(0, c.emit("CumSum", {c.dy(), c.x(1)}, c.type(c.dy()), attrs));
}

// Y = max(X, 0)  =>  dX = dY where Y > 0
void grad_relu(GradContext& c) {
  c.give(0, c.emit("ReluGrad", {c.dy(), c.y(0)}, c.type(c.dy()), {}, kPipetrainDomain));
}

// Y = erf(X)  =>  dX = dY * 2/sqrt(pi) * exp(-X^2)
void grad_erf(GradContext& c) {
  c.give(0, c.emit("ErfGrad", {c.dy(), c.x(0)}, c.type(c.dy()), {}, kPipetrainDomain));
}

// Y = gelu(X)  =>  dX = dY * gelu'(X) (exact or tanh form, as the forward)
void grad_gelu(GradContext& c) {
  const Attrs a{{"approximate", c.node().attr_string("approximate", "none")}};
  c.give(0, c.emit("GeluGrad", {c.dy(), c.x(0)}, c.type(c.dy()), a, kPipetrainDomain));
}

// Y = tanh(X)  =>  dX = dY * (1 - Y^2)
void grad_tanh(GradContext& c) {
  const ValueId y = c.y(0);
  c.give(0, c.mul(c.dy(), c.sub(c.scalar(1.0f), c.mul(y, y))));
}

// Y = sigmoid(X)  =>  dX = dY * Y * (1 - Y)
void grad_sigmoid(GradContext& c) {
  const ValueId y = c.y(0);
  c.give(0, c.mul(c.dy(), c.mul(y, c.sub(c.scalar(1.0f), y))));
}

// Y = clip(X, lo, hi)  =>  dX = dY where lo < X < hi
void grad_clip(GradContext& c) {
  c.give(0, c.emit("ClipGrad", {c.dy(), c.x(0), c.x(1), c.x(2)}, c.type(c.dy()), {},
                   kPipetrainDomain));
}

// Y = where(C, A, B)  =>  dA = sum_to(where(C, dY, 0)), dB = sum_to(where(C, 0, dY))
void grad_where(GradContext& c) {
  const ValueId zero = c.scalar(0.0f);
  const TensorType t = c.type(c.dy());
  if (c.wants(1)) c.give(1, c.sum_to(c.emit("Where", {c.x(0), c.dy(), zero}, t), c.shape(c.x(1))));
  if (c.wants(2)) c.give(2, c.sum_to(c.emit("Where", {c.x(0), zero, c.dy()}, t), c.shape(c.x(2))));
}

// Y = cast(X)  =>  dX = cast(dY) back to X's type
void grad_cast(GradContext& c) {
  const TensorType& xt = c.type(c.x(0));
  if (xt.dtype == c.type(c.dy()).dtype) return c.give(0, c.dy());
  c.give(0, c.emit("Cast", {c.dy()}, xt, {{"to", static_cast<int64_t>(xt.dtype)}}));
}

// Y = X * mask / (1 - ratio)  =>  dX = dY * mask / (1 - ratio), mask output 1 of the node
void give_masked(GradContext& c, float ratio) {
  const ValueId mask = c.emit("Cast", {c.y(1)}, c.type(c.dy()),
                              {{"to", static_cast<int64_t>(DType::kFloat32)}});
  c.give(0, c.mul(c.mul(c.dy(), mask), c.scalar(1.0f / (1.0f - ratio))));
}

// Y = X (Identity, inference Dropout)  =>  dX = dY
// Y = X * mask / (1 - ratio) (training Dropout)  =>  dX = dY * mask / (1 - ratio)
void grad_identity(GradContext& c) {
  if (c.node().op_type != "Dropout" || c.x(2) == kNoValue) return c.give(0, c.dy());
  const Tensor* training = c.constant(2);
  if (!training) unsupported(c, "Dropout's training_mode is not a constant");
  if (training->as<bool>()[0] == 0) return c.give(0, c.dy());
  float ratio = 0.5f;
  if (c.x(1) != kNoValue) {
    if (!c.constant(1)) unsupported(c, "Dropout's ratio is not a constant");
    ratio = c.constant(1)->as<float>()[0];
  }
  give_masked(c, ratio);
}

// Y, mask = SeededDropout(X, key)  =>  dX = dY * mask / (1 - ratio)
void grad_seeded_dropout(GradContext& c) { give_masked(c, c.node().attr_float("ratio", 0.5f)); }

// ---- normalisation and softmax --------------------------------------------------------------

// Y = softmax(X)  =>  dX = Y * (dY - sum_axis(dY * Y))
void grad_softmax(GradContext& c) {
  const Attrs a{{"axis", c.node().attr_int("axis", -1)}};
  const std::string op = c.node().op_type == "Softmax" ? "SoftmaxGrad" : "LogSoftmaxGrad";
  // Y = logsoftmax(X)  =>  dX = dY - exp(Y) * sum_axis(dY)
  c.give(0, c.emit(op, {c.dy(), c.y(0)}, c.type(c.dy()), a, kPipetrainDomain));
}

// Y = (X - mean) * istd * Scale + Bias over axes [axis, rank)
//   =>  dX, dScale, dBias = LayerNormGrad(dY, X, Scale, Mean, InvStdDev) (core/pipetrain_ops.h)
void grad_layer_norm(GradContext& c) {
  const TensorType none{};
  const std::vector<TensorType> outs = {c.wants(0) ? c.type(c.x(0)) : none,
                                        c.wants(1) ? c.type(c.x(1)) : none,
                                        c.wants(2) ? c.type(c.x(2)) : none};
  const Attrs a{{"axis", c.node().attr_int("axis", -1)}};
  const auto g = c.emit_n("LayerNormGrad", {c.dy(), c.x(0), c.x(1), c.y(1), c.y(2)}, outs, a,
                          kPipetrainDomain);
  for (size_t i = 0; i < 3; ++i)
    if (c.wants(i)) c.give(i, g[i]);
}

// Training mode (BatchNormalization with training_mode=1, BatchNormTraining):
//   Y = (X - batch mean) * istd * Scale + Bias per channel
//   =>  dX, dScale, dBias = BatchNormGrad(dY, X, Scale) (core/pipetrain_ops.h)
void grad_batch_norm_training(GradContext& c) {
  const TensorType none{};
  const std::vector<TensorType> outs = {c.wants(0) ? c.type(c.x(0)) : none,
                                        c.wants(1) ? c.type(c.x(1)) : none,
                                        c.wants(2) ? c.type(c.x(2)) : none};
  const auto g = c.emit_n("BatchNormGrad", {c.dy(), c.x(0), c.x(1)}, outs,
                          {{"epsilon", c.node().attr_float("epsilon", 1e-5f)}}, kPipetrainDomain);
  for (size_t i = 0; i < 3; ++i)
    if (c.wants(i)) c.give(i, g[i]);
}

// Inference mode: Y = (X - mean) * Scale / sqrt(var + eps) + Bias
//   =>  dX = dY * Scale / sqrt(var + eps), dScale = sum_R(dY * (X - mean) / sqrt(var + eps)),
//       dBias = sum_R(dY)
void grad_batch_norm(GradContext& c) {
  if (c.node().attr_int("training_mode", 0) != 0) return grad_batch_norm_training(c);
  const float eps = c.node().attr_float("epsilon", 1e-5f);
  const Shape& xs = c.shape(c.x(0));
  Shape per_channel(xs.size(), 1);
  per_channel[1] = xs[1];
  Shape reduce_axes = {0};
  for (size_t d = 2; d < xs.size(); ++d) reduce_axes.push_back(static_cast<int64_t>(d));
  const ValueId var_eps = c.emit("Add", {c.x(4), c.scalar(eps)}, c.type(c.x(4)));
  const ValueId istd = c.reshape(c.div(c.scalar(1.0f), c.emit("Sqrt", {var_eps}, c.type(var_eps))),
                                 per_channel);
  if (c.wants(0)) c.give(0, c.mul(c.dy(), c.mul(istd, c.reshape(c.x(1), per_channel))));
  const auto reduce = [&](ValueId v) {
    return c.emit("ReduceSum", {v, c.ints(reduce_axes)}, f32({xs[1]}), {{"keepdims", int64_t{0}}});
  };
  if (c.wants(1)) {
    const ValueId xhat = c.mul(c.sub(c.x(0), c.reshape(c.x(3), per_channel)), istd);
    c.give(1, reduce(c.mul(c.dy(), xhat)));
  }
  if (c.wants(2)) c.give(2, reduce(c.dy()));
}

// ---- linear algebra -------------------------------------------------------------------------

// Y = A @ B (batched, broadcasting)  =>  dA = sum_to(dY @ B^T), dB = sum_to(A^T @ dY).
// A 2-D B (a weight) folds A's batch dims into rows: dA = dY2 @ B^T and dB = A2^T @ dY2 as Gemms.
void grad_matmul(GradContext& c) {
  const Shape& as = c.shape(c.x(0));
  const Shape& bs = c.shape(c.x(1));
  if (as.size() < 2 || bs.size() < 2) unsupported(c, "MatMul with a 1-D operand");
  const ValueId dy = c.dy();
  if (bs.size() == 2) {
    const int64_t k = bs[0], n = bs[1];
    const int64_t rows = c.type(c.x(0)).numel() / k;
    const ValueId dy2 = c.reshape(dy, {rows, n});
    if (c.wants(0)) {
      // B = W^T (a linear layer's weight as exporters write it): dA = dY2 @ W reads W itself.
      const ValueId w = c.untransposed(c.x(1));
      const ValueId g = w != kNoValue ? c.emit("Gemm", {dy2, w}, f32({rows, k}))
                                      : c.emit("Gemm", {dy2, c.x(1)}, f32({rows, k}), {{"transB", int64_t{1}}});
      c.give(0, c.reshape(g, as));
    }
    if (c.wants(1)) {
      const ValueId a2 = c.reshape(c.x(0), {rows, k});
      c.give(1, c.emit("Gemm", {a2, dy2}, f32({k, n}), {{"transA", int64_t{1}}}));
    }
    return;
  }
  const Shape& ys = c.shape(dy);
  if (c.wants(0)) {
    const ValueId bt = c.transpose(c.x(1), swap_last2(bs.size()));
    Shape s = ys;
    s.back() = as.back();
    c.give(0, c.sum_to(c.emit("MatMul", {dy, bt}, f32(s)), as));
  }
  if (c.wants(1)) {
    const ValueId at = c.transpose(c.x(0), swap_last2(as.size()));
    Shape s = ys;
    s[s.size() - 2] = as.back();
    c.give(1, c.sum_to(c.emit("MatMul", {at, dy}, f32(s)), bs));
  }
}

// Y = alpha * op(A) @ op(B) + beta * C, op a transpose when transA/transB
//   =>  dA = alpha * dY @ op(B)^T (transposed back when transA), dB = alpha * op(A)^T @ dY
//       (transposed back when transB), dC = beta * sum_to(dY)
void grad_gemm(GradContext& c) {
  const Node& n = c.node();
  const float alpha = n.attr_float("alpha", 1.0f), beta = n.attr_float("beta", 1.0f);
  const int64_t ta = n.attr_int("transA", 0), tb = n.attr_int("transB", 0);
  const ValueId dy = c.dy();
  if (c.wants(0)) {
    Attrs a{{"alpha", alpha}};
    ValueId g;
    if (!ta) {
      a["transB"] = int64_t{tb ? 0 : 1};
      g = c.emit("Gemm", {dy, c.x(1)}, c.type(c.x(0)), a);
    } else {
      a["transA"] = tb;
      a["transB"] = int64_t{1};
      g = c.emit("Gemm", {c.x(1), dy}, c.type(c.x(0)), a);
    }
    c.give(0, g);
  }
  if (c.wants(1)) {
    Attrs a{{"alpha", alpha}};
    ValueId g;
    if (!tb) {
      a["transA"] = int64_t{ta ? 0 : 1};
      g = c.emit("Gemm", {c.x(0), dy}, c.type(c.x(1)), a);
    } else {
      a["transA"] = int64_t{1};
      a["transB"] = ta;
      g = c.emit("Gemm", {dy, c.x(0)}, c.type(c.x(1)), a);
    }
    c.give(1, g);
  }
  if (c.wants(2)) {
    ValueId g = c.sum_to(dy, c.shape(c.x(2)));
    if (beta != 1.0f) g = c.mul(g, c.scalar(beta));
    c.give(2, g);
  }
}

// ---- convolution and pooling ----------------------------------------------------------------

Attrs window_attrs(GradContext& c, std::initializer_list<const char*> keys) {
  Attrs a;
  for (const char* k : keys)
    if (c.node().has_attr(k)) a[k] = c.node().attrs.at(k);
  const std::string pad = c.node().attr_string("auto_pad", "NOTSET");
  if (pad != "NOTSET") unsupported(c, "auto_pad " + pad + " (export with explicit pads)");
  return a;
}

// Y = conv(X, W) + B  =>  dX = ConvGradInput(dY, W), dW = ConvGradWeight(dY, X),
//                         dB = sum over all axes but 1 of dY
void grad_conv(GradContext& c) {
  Attrs a = window_attrs(c, {"dilations", "group", "kernel_shape", "pads", "strides"});
  if (c.wants(0)) {
    Attrs ai = a;
    ai["input_shape"] = c.shape(c.x(0));
    c.give(0, c.emit("ConvGradInput", {c.dy(), c.x(1)}, c.type(c.x(0)), ai, kPipetrainDomain));
  }
  if (c.wants(1)) {
    Attrs aw = a;
    aw["weight_shape"] = c.shape(c.x(1));
    c.give(1, c.emit("ConvGradWeight", {c.dy(), c.x(0)}, c.type(c.x(1)), aw, kPipetrainDomain));
  }
  if (c.wants(2)) {
    Shape axes = {0};
    for (size_t d = 2; d < c.shape(c.dy()).size(); ++d) axes.push_back(static_cast<int64_t>(d));
    c.give(2, c.emit("ReduceSum", {c.dy(), c.ints(axes)}, c.type(c.x(2)),
                     {{"keepdims", int64_t{0}}}));
  }
}

// Y = maxpool(X)  =>  dX = MaxPoolGrad(dY, X): each dY to the first maximum of its window
void grad_max_pool(GradContext& c) {
  const Attrs a = window_attrs(c, {"ceil_mode", "dilations", "kernel_shape", "pads", "strides"});
  if (c.node().attr_int("storage_order", 0) != 0) unsupported(c, "storage_order 1");
  c.give(0, c.emit("MaxPoolGrad", {c.dy(), c.x(0)}, c.type(c.x(0)), a, kPipetrainDomain));
}

// Y = avgpool(X)  =>  dX = AveragePoolGrad(dY): each dY spread over its window's counted cells
void grad_average_pool(GradContext& c) {
  Attrs a = window_attrs(c, {"ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"});
  a["input_shape"] = c.shape(c.x(0));
  c.give(0, c.emit("AveragePoolGrad", {c.dy()}, c.type(c.x(0)), a, kPipetrainDomain));
}

// Y[n,c] = mean over spatial X[n,c,...]  =>  dX = expand(dY / spatial size)
void grad_global_average_pool(GradContext& c) {
  const Shape& xs = c.shape(c.x(0));
  int64_t spatial = 1;
  for (size_t d = 2; d < xs.size(); ++d) spatial *= xs[d];
  const ValueId scaled = c.mul(c.dy(), c.scalar(1.0f / static_cast<float>(spatial)));
  c.give(0, c.emit("Expand", {scaled, c.ints(xs)}, c.type(c.x(0))));
}

// ---- data movement --------------------------------------------------------------------------

// Y = reshape(X) (Reshape, Flatten, Squeeze, Unsqueeze)  =>  dX = reshape(dY, X's shape)
void grad_reshape(GradContext& c) { c.give(0, c.reshape(c.dy(), c.shape(c.x(0)))); }

// Y = transpose(X, perm)  =>  dX = transpose(dY, inverse perm)
void grad_transpose(GradContext& c) {
  const size_t r = c.shape(c.x(0)).size();
  Shape perm = c.node().attr_ints("perm");
  if (perm.empty())
    for (size_t i = 0; i < r; ++i) perm.push_back(static_cast<int64_t>(r - 1 - i));
  Shape inv(r);
  for (size_t i = 0; i < r; ++i) inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  c.give(0, c.transpose(c.dy(), inv));
}

// Y = concat(X_0..X_k, axis)  =>  dX_i = the slice of dY where X_i sits (one Split)
void grad_concat(GradContext& c) {
  const size_t k = c.node().inputs.size();
  const int64_t axis = norm_axis(c.node().attr_int("axis", 0), c.shape(c.dy()).size());
  Shape sizes;
  std::vector<TensorType> outs;
  for (size_t i = 0; i < k; ++i) {
    sizes.push_back(c.shape(c.x(i))[static_cast<size_t>(axis)]);
    outs.push_back(c.type(c.x(i)));
  }
  const auto parts = c.emit_n("Split", {c.dy(), c.ints(sizes)}, outs, {{"axis", axis}});
  for (size_t i = 0; i < k; ++i)
    if (c.wants(i)) c.give(i, parts[i]);
}

// Zeros shaped like v: 0 expanded (outputs of Split whose gradient nobody sends).
ValueId zeros_like(GradContext& c, ValueId v) {
  return c.emit("Expand", {c.scalar(0.0f), c.ints(c.shape(v))}, c.type(v));
}

// Y_0..Y_k = split(X, axis)  =>  dX = concat(dY_0..dY_k) (zeros for outputs without gradient)
void grad_split(GradContext& c) {
  const int64_t axis = norm_axis(c.node().attr_int("axis", 0), c.shape(c.x(0)).size());
  std::vector<ValueId> parts;
  for (size_t k = 0; k < c.node().outputs.size(); ++k)
    parts.push_back(c.dy(k) != kNoValue ? c.dy(k) : zeros_like(c, c.y(k)));
  c.give(0, c.emit("Concat", parts, c.type(c.x(0)), {{"axis", axis}}));
}

// Y = X[starts:ends] (step 1)  =>  dX = pad(dY) with zeros back to X's shape
void grad_slice(GradContext& c) {
  const Shape& xs = c.shape(c.x(0));
  const size_t r = xs.size();
  const Shape starts = *const_ints(c, 1), ends = *const_ints(c, 2);
  Shape axes = const_ints(c, 3).value_or(Shape{});
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  const Shape steps = const_ints(c, 4).value_or(Shape(starts.size(), 1));
  Shape pads(2 * r, 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (steps[i] != 1) unsupported(c, "Slice with a step other than 1");
    const size_t a = static_cast<size_t>(norm_axis(axes[i], r));
    const auto clamp = [&](int64_t v) {
      if (v < 0) v += xs[a];
      return std::clamp<int64_t>(v, 0, xs[a]);
    };
    pads[a] = clamp(starts[i]);
    pads[a + r] = xs[a] - std::max(clamp(ends[i]), pads[a]);
  }
  c.give(0, c.emit("Pad", {c.dy(), c.ints(pads)}, c.type(c.x(0))));
}

// Y = gather(D, I, axis)  =>  dD = GatherGrad(dY, I): dY's rows added at I
void grad_gather(GradContext& c) {
  const Attrs a{{"axis", c.node().attr_int("axis", 0)}, {"data_shape", c.shape(c.x(0))}};
  c.give(0, c.emit("GatherGrad", {c.dy(), c.x(1)}, c.type(c.x(0)), a, kPipetrainDomain));
}

// Y = expand(X, shape)  =>  dX = sum_to(dY, X's shape)
void grad_expand(GradContext& c) { c.give(0, c.sum_to(c.dy(), c.shape(c.x(0)))); }

// Y = pad(X, pads) (constant)  =>  dX = slice of dY without the padding
void grad_pad(GradContext& c) {
  const Shape& xs = c.shape(c.x(0));
  const Shape pads = *const_ints(c, 1);
  if (c.node().attr_string("mode", "constant") != "constant") unsupported(c, "Pad mode other than constant");
  if (c.x(3) != kNoValue) unsupported(c, "Pad with an axes input");
  Shape starts(xs.size()), ends(xs.size());
  for (size_t a = 0; a < xs.size(); ++a) {
    if (pads[a] < 0 || pads[a + xs.size()] < 0) unsupported(c, "negative pads");
    starts[a] = pads[a];
    ends[a] = pads[a] + xs[a];
  }
  c.give(0, c.emit("Slice", {c.dy(), c.ints(starts), c.ints(ends)}, c.type(c.x(0))));
}

// Y = Trilu(X, k) {upper}  =>  dX = Trilu(dY, k) {upper}: the kept elements pass dY through
void grad_trilu(GradContext& c) {
  std::vector<ValueId> in = {c.dy()};
  if (c.x(1) != kNoValue) in.push_back(c.x(1));
  c.give(0, c.emit("Trilu", in, c.type(c.x(0)), {{"upper", c.node().attr_int("upper", 1)}}));
}

// Y = Tile(X, r), Y viewed as [r_0, d_0, r_1, d_1, ...]  =>  dX = sum of dY over the r axes
void grad_tile(GradContext& c) {
  const Shape xs = c.shape(c.x(0));
  const Shape r = *const_ints(c, 1);
  Shape view, axes;
  for (size_t k = 0; k < xs.size(); ++k) {
    axes.push_back(static_cast<int64_t>(view.size()));
    view.push_back(r[k]);
    view.push_back(xs[k]);
  }
  const ValueId g = c.reshape(c.dy(), view);
  c.give(0, c.emit("ReduceSum", {g, c.ints(axes)}, c.type(c.x(0)), {{"keepdims", int64_t{0}}}));
}

// ---- reductions and loss --------------------------------------------------------------------

// Y = sum/mean of X over axes  =>  dX = expand(dY with the reduced axes kept, X's shape) (/ n)
void grad_reduce(GradContext& c) {
  const Node& n = c.node();
  const Shape& xs = c.shape(c.x(0));
  Shape axes = n.has_attr("axes") ? n.attr_ints("axes") : const_ints(c, 1).value_or(Shape{});
  if (axes.empty() && n.attr_int("noop_with_empty_axes", 0) != 0) return c.give(0, c.dy());
  if (axes.empty())
    for (size_t a = 0; a < xs.size(); ++a) axes.push_back(static_cast<int64_t>(a));
  Shape kept = xs;
  int64_t count = 1;
  for (int64_t a : axes) {
    const size_t d = static_cast<size_t>(norm_axis(a, xs.size()));
    count *= xs[d];
    kept[d] = 1;
  }
  ValueId g = c.reshape(c.dy(), kept);
  if (n.op_type == "ReduceMean") g = c.mul(g, c.scalar(1.0f / static_cast<float>(count)));
  c.give(0, c.emit("Expand", {g, c.ints(xs)}, c.type(c.x(0))));
}

// Y = max (min) of X over axes  =>  dX = where(X == Y, dY / count, 0), Y and dY with the reduced
// axes kept and broadcast, count the elements of each reduced group equal to its Y: tied
// extremes share the gradient evenly, as PyTorch's amax and amin give it.
void grad_reduce_extreme(GradContext& c) {
  const Node& n = c.node();
  const Shape xs = c.shape(c.x(0));
  Shape axes = n.has_attr("axes") ? n.attr_ints("axes") : const_ints(c, 1).value_or(Shape{});
  if (axes.empty() && n.attr_int("noop_with_empty_axes", 0) != 0) return c.give(0, c.dy());
  if (axes.empty())
    for (size_t a = 0; a < xs.size(); ++a) axes.push_back(static_cast<int64_t>(a));
  Shape kept = xs, normalized;
  for (int64_t a : axes) {
    normalized.push_back(norm_axis(a, xs.size()));
    kept[static_cast<size_t>(normalized.back())] = 1;
  }
  const TensorType xt = c.type(c.x(0));
  const TensorType mask_t{DType::kBool, xs};
  const ValueId hit = c.emit("Equal", {c.x(0), c.reshape(c.y(0), kept)}, mask_t);
  const ValueId ones = c.emit("Cast", {hit}, xt, {{"to", static_cast<int64_t>(DType::kFloat32)}});
  const ValueId count = c.emit("ReduceSum", {ones, c.ints(normalized)}, TensorType{DType::kFloat32, kept},
                               {{"keepdims", int64_t{1}}});
  const ValueId share = c.div(c.reshape(c.dy(), kept), count);
  c.give(0, c.emit("Where", {hit, share, c.scalar(0.0f)}, xt));
}

// Y = max(A, B) (min(A, B))  =>  dA = sum_to(where(A == B, dY / 2, where(A wins, dY, 0))), and dB
// alike: a tie splits the gradient in half, as PyTorch's maximum and minimum give it.
void grad_extreme2(GradContext& c) {
  if (c.node().inputs.size() != 2) unsupported(c, "Min and Max differentiate with two inputs");
  const bool max = c.node().op_type == "Max";
  const TensorType t = c.type(c.dy());
  const TensorType mask_t{DType::kBool, t.shape};
  const ValueId tie = c.emit("Equal", {c.x(0), c.x(1)}, mask_t);
  const ValueId half = c.mul(c.dy(), c.scalar(0.5f));
  for (size_t i = 0; i < 2; ++i) {
    if (!c.wants(i)) continue;
    // input i wins where it is the greater (max) or the smaller (min) of the two
    const bool greater = max == (i == 0);
    const ValueId wins = c.emit(greater ? "Greater" : "Less", {c.x(0), c.x(1)}, mask_t);
    const ValueId mine = c.emit("Where", {wins, c.dy(), c.scalar(0.0f)}, t);
    c.give(i, c.sum_to(c.emit("Where", {tie, half, mine}, t), c.shape(c.x(i))));
  }
}

// L = SoftmaxCrossEntropy(Z, T, s)  =>  dZ = SoftmaxCrossEntropyGrad(dL, Z, T, s)
void grad_softmax_cross_entropy(GradContext& c) {
  const Attrs a{{"ignore_index", c.node().attr_int("ignore_index", -100)}};
  c.give(0, c.emit("SoftmaxCrossEntropyGrad", {c.dy(), c.x(0), c.x(1), c.x(2)}, c.type(c.x(0)),
                   a, kPipetrainDomain));
}

// Y, L = FusedAttention(Q, K, V, Mask)  (L the rows' log-sum-exp, core/pipetrain_ops.h)
//   =>  dQ, dK, dV = FusedAttentionGrad(dY, Q, K, V, Y, L, Mask), the scores recomputed per tile
// The mask gets no gradient (its scores are never held): a mask made from parameters stays
// unfused (onnx_import's attention fusion checks).
void grad_fused_attention(GradContext& c) {
  if (c.wants(3)) unsupported(c, "a FusedAttention's mask has no gradient");
  if (c.dy(1) != kNoValue) unsupported(c, "a FusedAttention's LogSumExp has no gradient");
  const Attrs a{{"scale", c.node().attr_float("scale", 1.f / std::sqrt(static_cast<float>(c.shape(c.x(0)).back())))},
                {"causal", c.node().attr_int("causal", 0)}};
  const TensorType none{};
  const bool kv = c.wants(1) || c.wants(2);
  std::vector<ValueId> in = {c.dy(), c.x(0), c.x(1), c.x(2), c.y(0), c.y(1)};
  if (c.x(3) != kNoValue) in.push_back(c.x(3));
  const auto g = c.emit_n("FusedAttentionGrad", in,
                          {c.wants(0) ? c.type(c.x(0)) : none, kv ? c.type(c.x(1)) : none, kv ? c.type(c.x(2)) : none},
                          a, kPipetrainDomain);
  for (size_t i = 0; i < 3; ++i)
    if (c.wants(i)) c.give(i, g[i]);
}

struct RuleEntry {
  const char* domain;
  const char* op;
  GradRule rule;
};

// The one list of gradient rules.
const RuleEntry kRules[] = {
    {"", "Add", grad_add},
    {"", "Sub", grad_sub},
    {"", "Mul", grad_mul},
    {"", "Div", grad_div},
    {"", "Pow", grad_pow},
    {"", "Sqrt", grad_sqrt},
    {"", "Neg", grad_neg},
    {"", "Reciprocal", grad_reciprocal},
    {"", "HardSigmoid", grad_hard_sigmoid},
    {"", "HardSwish", grad_hard_swish},
    {"", "Sin", grad_sin},
    {"", "Cos", grad_cos},
    {"", "CumSum", grad_cumsum},
    {"", "Relu", grad_relu},
    {"", "Erf", grad_erf},
    {"", "Gelu", grad_gelu},
    {"com.microsoft", "Gelu", grad_gelu},
    {"", "Tanh", grad_tanh},
    {"", "Sigmoid", grad_sigmoid},
    {"", "Clip", grad_clip},
    {"", "Where", grad_where},
    {"", "Cast", grad_cast},
    {"", "Identity", grad_identity},
    {"", "Dropout", grad_identity},
    {"", "Softmax", grad_softmax},
    {"", "LogSoftmax", grad_softmax},
    {"", "LayerNormalization", grad_layer_norm},
    {"", "BatchNormalization", grad_batch_norm},
    {"", "MatMul", grad_matmul},
    {"", "Gemm", grad_gemm},
    {"", "Conv", grad_conv},
    {"", "MaxPool", grad_max_pool},
    {"", "AveragePool", grad_average_pool},
    {"", "GlobalAveragePool", grad_global_average_pool},
    {"", "Reshape", grad_reshape},
    {"", "Flatten", grad_reshape},
    {"", "Squeeze", grad_reshape},
    {"", "Unsqueeze", grad_reshape},
    {"", "Transpose", grad_transpose},
    {"", "Concat", grad_concat},
    {"", "Split", grad_split},
    {"", "Slice", grad_slice},
    {"", "Gather", grad_gather},
    {"", "Expand", grad_expand},
    {"", "Pad", grad_pad},
    {"", "ReduceSum", grad_reduce},
    {"", "ReduceMean", grad_reduce},
    {"", "ReduceMax", grad_reduce_extreme},
    {"", "ReduceMin", grad_reduce_extreme},
    {"", "Max", grad_extreme2},
    {"", "Min", grad_extreme2},
    {"", "Exp", grad_exp},
    {"", "Abs", grad_abs},
    {"", "Trilu", grad_trilu},
    {"", "Tile", grad_tile},
    {kPipetrainDomain, "SoftmaxCrossEntropy", grad_softmax_cross_entropy},
    {kPipetrainDomain, "BatchNormTraining", grad_batch_norm_training},
    {kPipetrainDomain, "SeededDropout", grad_seeded_dropout},
    {kPipetrainDomain, "FusedAttention", grad_fused_attention},
    // No rule for Bernoulli and SeededBernoulli: a draw is piecewise constant in its
    // probabilities (dP = 0), so partition/cost_model.cc lists them as non-differentiable and
    // no gradient is asked of them; a stochastic-depth branch x * M / p differentiates through
    // Mul and Div (case StochasticDepthBranch in tests/autodiff/grad_rules_test.cc).
};

}  // namespace

GradRule find_grad_rule(const std::string& domain, const std::string& op_type) {
  const std::string d = domain == "ai.onnx" ? "" : domain;
  for (const RuleEntry& e : kRules)
    if (d == e.domain && op_type == e.op) return e.rule;
  return nullptr;
}

std::vector<std::string> grad_rule_ops() {
  std::vector<std::string> out;
  for (const RuleEntry& e : kRules)
    out.push_back(std::string(e.domain).empty() ? e.op : std::string(e.domain) + "::" + e.op);
  return out;
}

}  // namespace pt
