#include "partition/cost_model.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "core/pipetrain_ops.h"

namespace pt {
namespace {

// Per-element FLOPs of element-wise ops: forward, and backward per differentiable input.
struct Elementwise {
  int64_t fwd;
  int64_t bwd;
};

const std::map<std::string, Elementwise>& elementwise_table() {
  static const std::map<std::string, Elementwise> t = {
      {"Add", {1, 1}},  {"Sub", {1, 1}},     {"Mul", {1, 2}},   {"Div", {1, 3}},
      {"Pow", {10, 12}}, {"Sqrt", {1, 2}},   {"Neg", {1, 1}},   {"Relu", {1, 1}},
      {"Erf", {8, 6}},  {"Gelu", {12, 16}},  {"Tanh", {8, 2}},  {"Sigmoid", {4, 3}},
      {"Clip", {2, 2}}, {"Where", {1, 1}},   {"Dropout", {2, 1}},
      {"Reciprocal", {1, 3}}, {"IsNaN", {1, 0}}, {"Sin", {10, 11}}, {"Cos", {10, 11}},
      {"CumSum", {1, 1}}, {"HardSigmoid", {3, 4}}, {"HardSwish", {5, 9}},
      {"SeededDropout", {12, 2}},  // a 64-bit hash per element
      {"SeededBernoulli", {12, 0}}, {"Bernoulli", {12, 0}},  // the same hash; no gradient
      {"Less", {1, 0}}, {"Greater", {1, 0}}, {"LessOrEqual", {1, 0}}, {"GreaterOrEqual", {1, 0}},
      {"And", {1, 0}}, {"Or", {1, 0}}, {"Xor", {1, 0}}, {"Not", {1, 0}},
      {"Floor", {1, 0}}, {"Ceil", {1, 0}}, {"Mod", {4, 0}},
      {"Min", {1, 6}}, {"Max", {1, 6}}, {"Abs", {1, 5}}, {"Exp", {8, 1}}, {"Trilu", {1, 1}},
  };
  return t;
}

// Per element of a row a softmax (and the loss's) sweeps: the max, x - max, an exp and the sum.
constexpr int64_t kSoftmaxRowFlops = 3 + kFlopsPerExp;

// MaxPoolGrad's search for each window's first maximum (exec/cpu/nn_grad.cc): per cell a load,
// a compare and two selects with the cell's offset computed, on one lane; measured ~0.9 ns a
// cell (2,304 cells in 2.2 us), what ~180 FLOP-equivalents take on the vector units.
constexpr int64_t kFlopsPerWindowVisit = 180;

int64_t numel(const Graph& g, ValueId v) { return v == kNoValue ? 0 : g.value(v).type.numel(); }
int64_t nbytes(const Graph& g, ValueId v) { return v == kNoValue ? 0 : g.value(v).type.bytes(); }

struct Shape3 {
  int64_t batch = 1, m = 1, k = 1, n = 1;
};

Shape3 matmul_dims(const Graph& g, const Node& node) {
  const auto& a = g.value(node.inputs[0]).type.shape;
  const auto& y = g.value(node.outputs[0]).type.shape;
  Shape3 s;
  if (node.op_type == "Gemm") {
    const bool ta = node.attr_int("transA", 0) != 0;
    s.m = y[0];
    s.n = y[1];
    s.k = ta ? a[0] : a[1];
    return s;
  }
  s.k = a.empty() ? 1 : a.back();
  s.n = y.empty() ? 1 : y.back();
  const int64_t out = g.value(node.outputs[0]).type.numel();
  s.m = 1;
  s.batch = s.n ? out / s.n : 0;  // batch * M folded: only the product matters
  return s;
}

int64_t conv_flops(const Graph& g, const Node& node) {
  const auto& w = g.value(node.inputs[1]).type.shape;  // [C_out, C_in/group, kh, kw...]
  int64_t per_out = 1;
  for (size_t i = 1; i < w.size(); ++i) per_out *= w[i];
  return 2 * numel(g, node.outputs[0]) * per_out;
}

// Adds the gradient cost of input i: W if it is a parameter, B otherwise, nothing if it needs
// no gradient.
void add_grad(const Graph& g, const std::vector<bool>& needs, const Node& n, size_t i,
              int64_t flops, NodeCost* c) {
  if (i >= n.inputs.size() || n.inputs[i] == kNoValue) return;
  const ValueId v = n.inputs[i];
  if (!needs[static_cast<size_t>(v)] || !input_differentiable(n, i)) return;
  (g.value(v).is_parameter() ? c->flops_bwd_weight : c->flops_bwd_input) += flops;
}

// FusedAttention (core/pipetrain_ops.h) from Q [B, H, S, D] and V [B, Hkv, T, Dv] (inputs q_at,
// q_at + 2): the (query, key) pairs it visits, the causal ones above the diagonal skipped, and per
// pair the forward (q.k, the online softmax, p v) or the backward (exec/cpu/attention.cc runs
// q.k, the exp and dy.v twice, once for dQ and once for dK and dV, then dv, ds, dq and dk).
struct AttentionFlops {
  int64_t fwd = 0, bwd = 0;
};

AttentionFlops attention_flops(const Graph& g, const Node& n, size_t q_at) {
  const auto& q = g.value(n.inputs[q_at]).type.shape;
  const auto& v = g.value(n.inputs[q_at + 2]).type.shape;
  if (q.size() != 4 || v.size() != 4) return {};
  const int64_t s = q[2], t = v[2], d = q[3], dv = v[3];
  int64_t pairs = s * t;
  if (n.attr_int("causal", 0) != 0) {
    pairs = 0;
    for (int64_t i = 0; i < s; ++i) pairs += std::min(t, i + 1);
  }
  pairs *= q[0] * q[1];
  const int64_t softmax = kSoftmaxRowFlops + 1;
  return {pairs * (2 * d + 2 * dv + softmax), pairs * (2 * (2 * d + 2 * dv + kFlopsPerExp) + 2 * dv + 4 * d + 3)};
}

// Gradient ops (core/pipetrain_ops.h) priced by the
// formulas above: a gradient op's forward FLOPs are what compute_flops charges its forward op's
// backward, so a B or W graph is counted by the same rules as the model (no second table).
// N = elements of dY (the forward op's output). False for every other op.
bool gradient_op_flops(const Graph& g, const std::vector<bool>& needs, const Node& n, NodeCost* c) {
  if (n.domain != kPipetrainDomain) return false;
  const std::string& op = n.op_type;
  const int64_t dy = n.inputs.empty() ? 0 : numel(g, n.inputs[0]);
  const auto present = [&](size_t k) { return k < n.outputs.size() && n.outputs[k] != kNoValue; };
  const std::string forward = op.ends_with("Grad") ? op.substr(0, op.size() - 4) : "";
  if (auto it = elementwise_table().find(forward); it != elementwise_table().end()) {
    c->flops_fwd = it->second.bwd * dy;  // ReluGrad, ClipGrad, ErfGrad, GeluGrad
  } else if (op == "SoftmaxGrad" || op == "LogSoftmaxGrad") {
    c->flops_fwd = 4 * dy;
  } else if (op == "LayerNormGrad" || op == "BatchNormGrad") {
    c->flops_fwd = (present(0) ? 10 * dy : 0) + (present(1) ? 2 * dy : 0) + (present(2) ? 2 * dy : 0);
  } else if (op == "ConvGradInput" || op == "ConvGradWeight") {
    // 2 * N_out * (C_in/group) * prod(kernel), the weight [C_out, C_in/group, k...] being input
    // 1 of ConvGradInput and the output of ConvGradWeight.
    const auto& w = g.value(op == "ConvGradInput" ? n.inputs[1] : n.outputs[0]).type.shape;
    int64_t per_out = 1;
    for (size_t i = 1; i < w.size(); ++i) per_out *= w[i];
    c->flops_fwd = 2 * dy * per_out;
  } else if (op == "MaxPoolGrad" || op == "AveragePoolGrad") {
    int64_t window = 1;
    for (int64_t d : n.attr_ints("kernel_shape")) window *= d;
    c->flops_fwd = dy * window * (op == "MaxPoolGrad" ? kFlopsPerWindowVisit : 1);
  } else if (op == "GatherGrad") {
    c->flops_fwd = dy;  // scatter-add into the table
  } else if (op == "SoftmaxCrossEntropyGrad") {
    c->flops_fwd = (kSoftmaxRowFlops + 1) * numel(g, n.inputs[1]);  // softmax again, then the scale
  } else if (op == "FusedAttentionGrad") {
    c->flops_fwd = attention_flops(g, n, 1).bwd;
  } else if (op == "FusedAttention") {
    const AttentionFlops f = attention_flops(g, n, 0);
    c->flops_fwd = f.fwd;
    for (size_t i = 0; i < 3; ++i)  // one kernel makes dQ, dK and dV: charged to the first wanted
      if (c->flops_bwd() == 0) add_grad(g, needs, n, i, f.bwd, c);
  } else {
    return false;
  }
  return true;
}

// Whether n is an Add that a matrix product applies as it writes its output (exec/cpu/linalg.cc
// take_add: the CPU backend's epilogue, cuBLAS's beta): Add(P, B) or Add(B, P), P the output of a
// MatMul or a Gemm without a C of its own, read by this Add alone (and not a graph output), B a
// float tensor of P's shape (a weight gradient summed into its accumulator) or a row bias (N
// elements, every leading dim 1). It runs no kernel: the product reads B, nothing else moves.
bool fused_into_product(const Graph& g, const Node& n, ValueId* other) {
  if (n.op_type != "Add" || !n.domain.empty() || n.inputs.size() != 2) return false;
  for (size_t k = 0; k < 2; ++k) {
    const Value& p = g.value(n.inputs[k]);
    if (p.producer < 0 || p.consumers.size() != 1 ||
        std::find(g.outputs.begin(), g.outputs.end(), n.inputs[k]) != g.outputs.end())
      continue;
    const Node& product = g.nodes[static_cast<size_t>(p.producer)];
    if (!product.domain.empty() || (product.op_type != "MatMul" && product.op_type != "Gemm") ||
        product.inputs.size() > 2 || product.attr_float("alpha", 1.f) != 1.f)
      continue;
    const TensorType& b = g.value(n.inputs[1 - k]).type;
    const TensorType& y = g.value(n.outputs[0]).type;
    if (b.dtype != DType::kFloat32 || !(y == p.type)) continue;
    const bool row_bias = !b.shape.empty() && !y.shape.empty() && b.shape.back() == y.shape.back() &&
                          std::all_of(b.shape.begin(), b.shape.end() - 1, [](int64_t d) { return d == 1; });
    if (b.shape == y.shape || row_bias) {
      *other = n.inputs[1 - k];
      return true;
    }
  }
  return false;
}

// Bytes a kernel moves beyond reading its inputs and writing its outputs once. The loss's kernels
// (exec/cpu/loss.cc) sweep the logits more than once: the forward reads them for the row max and
// again for the exps; the gradient reads them twice, writes dX and rescales it in place.
void add_extra_sweeps(const Graph& g, const Node& n, NodeCost* c) {
  // A Gemm reading A transposed (transA: a weight gradient X^T dY, the reduction along X's rows)
  // copies A into row blocks before multiplying (oneDNN's brgemm): A is read and written again.
  if (n.op_type == "Gemm" && n.domain.empty() && n.attr_int("transA", 0) != 0)
    c->bytes_read += nbytes(g, n.inputs[0]), c->bytes_written += nbytes(g, n.inputs[0]);
  if (n.domain != kPipetrainDomain) return;
  if (n.op_type == "SoftmaxCrossEntropy") c->bytes_read += nbytes(g, n.inputs[0]);
  if (n.op_type == "SoftmaxCrossEntropyGrad") {
    const int64_t logits = nbytes(g, n.inputs[1]);
    c->bytes_read += 2 * logits;
    c->bytes_written += logits;
  }
}

void compute_flops(const Graph& g, const std::vector<bool>& needs, const Node& n, NodeCost* c) {
  const std::string& op = n.op_type;
  if (gradient_op_flops(g, needs, n, c)) return;
  const int64_t out = numel(g, n.outputs.empty() ? kNoValue : n.outputs[0]);
  const int64_t in0 = n.inputs.empty() ? 0 : numel(g, n.inputs[0]);
  if (op == "MatMul" || op == "Gemm") {
    const Shape3 s = matmul_dims(g, n);
    const int64_t f = 2 * s.batch * s.m * s.k * s.n;
    c->flops_fwd = f + (op == "Gemm" && n.inputs.size() > 2 ? out : 0);
    add_grad(g, needs, n, 0, f, c);
    add_grad(g, needs, n, 1, f, c);
    add_grad(g, needs, n, 2, out, c);
  } else if (op == "Conv") {
    const int64_t f = conv_flops(g, n);
    c->flops_fwd = f + (n.inputs.size() > 2 ? out : 0);
    add_grad(g, needs, n, 0, f, c);
    add_grad(g, needs, n, 1, f, c);
    add_grad(g, needs, n, 2, out, c);
  } else if (op == "Softmax" || op == "LogSoftmax") {
    c->flops_fwd = (kSoftmaxRowFlops + 1) * out;  // then the scale by the sum's reciprocal
    add_grad(g, needs, n, 0, 4 * out, c);
  } else if (op == "SoftmaxCrossEntropy") {  // the loss (autodiff/loss.h): max, exp, sum per logit
    c->flops_fwd = kSoftmaxRowFlops * in0;
    add_grad(g, needs, n, 0, (kSoftmaxRowFlops + 1) * in0, c);
  } else if (op == "LayerNormalization" || op == "BatchNormalization" ||
             op == "BatchNormTraining") {
    c->flops_fwd = 8 * out;
    add_grad(g, needs, n, 0, 10 * out, c);
    add_grad(g, needs, n, 1, 2 * out, c);
    add_grad(g, needs, n, 2, 2 * out, c);
  } else if (op == "MaxPool" || op == "AveragePool") {
    const auto k = n.attr_ints("kernel_shape");
    int64_t window = 1;
    for (int64_t d : k) window *= d;
    c->flops_fwd = out * window;
    add_grad(g, needs, n, 0, out * window, c);
  } else if (op == "GlobalAveragePool" || op == "ReduceMean" || op == "ReduceSum") {
    c->flops_fwd = in0;
    add_grad(g, needs, n, 0, in0, c);
  } else if (op == "Gather") {
    add_grad(g, needs, n, 0, out, c);  // scatter-add into the table
  } else if (auto it = elementwise_table().find(op); it != elementwise_table().end()) {
    c->flops_fwd = it->second.fwd * out;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      // A broadcast operand's gradient is also reduced back to its shape: N more.
      const int64_t reduce = numel(g, n.inputs[i]) < out ? out : 0;
      add_grad(g, needs, n, i, it->second.bwd * out + reduce, c);
    }
  } else {
    // Data movement (Transpose, Concat, Split, Slice, Expand, Cast...): gradients move as many
    // elements back.
    for (size_t i = 0; i < n.inputs.size(); ++i) add_grad(g, needs, n, i, numel(g, n.inputs[i]), c);
  }
}

// Values each op's backward reads (indices into inputs, or -1-k for output k).
std::vector<int> saved_for_backward(const Node& n) {
  const std::string& op = n.op_type;
  if (op == "MatMul" || op == "Gemm" || op == "Conv" || op == "Mul" || op == "Div" ||
      op == "Pow")
    return {0, 1};
  if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "Sqrt" || op == "Softmax" ||
      op == "LogSoftmax")
    return {-1};
  if (op == "Erf" || op == "Gelu" || op == "Clip" || op == "LayerNormalization" ||
      op == "BatchNormalization" || op == "BatchNormTraining" || op == "MaxPool")
    return {0};
  if (op == "Dropout" || op == "SeededDropout") return {-2};  // the mask
  if (op == "FusedAttention") return {0, 1, 2, 3, -1, -2};    // Q, K, V, Mask, Y, LogSumExp
  if (op == "Where") return {0};
  if (op == "Gather") return {1};
  return {};
}

}  // namespace

// Ops through which no gradient flows to any input.
static bool is_non_differentiable(const std::string& op) {
  static const std::set<std::string> ops = {
      "Equal", "IsNaN", "Shape", "Size", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
      "And", "Or", "Xor", "Not",
      "Floor", "Ceil",                  // piecewise constant: a zero gradient, as PyTorch's
      "Bernoulli", "SeededBernoulli"};  // a draw is piecewise constant in its probabilities
  return ops.count(op) != 0;
}

// Inputs (by index) that carry a gradient when their value needs one. Index inputs, masks,
// shapes and axes never do.
bool input_differentiable(const Node& n, size_t i) {
  const std::string& op = n.op_type;
  if (is_non_differentiable(op)) return false;
  if (op == "Where") return i != 0;
  if (op == "Gather") return i == 0;
  if (op == "Reshape" || op == "Expand" || op == "Squeeze" || op == "Unsqueeze" ||
      op == "Dropout" || op == "SeededDropout" || op == "Split" || op == "ReduceSum" ||
      op == "ReduceMean" || op == "ReduceMax" || op == "ReduceMin" || op == "ReduceProd" ||
      op == "Pad" || op == "SoftmaxCrossEntropy" || op == "Trilu" || op == "Tile")
    return i == 0;
  if (op == "FusedAttention") return i <= 2;  // the mask gets no gradient
  if (op == "Slice" || op == "CumSum") return i == 0;
  if (op == "Clip") return i == 0;
  if (op == "BatchNormalization") return i <= 2;  // running mean and variance are buffers
  return true;
}

// Outputs (by index) that carry a gradient back: BatchNormalization's running statistics,
// BatchNormTraining's batch statistics, LayerNormalization's Mean and InvStdDev, Dropout's and
// SeededDropout's masks and MaxPool's indices never do.
bool output_differentiable(const Node& n, size_t k) {
  const std::string& op = n.op_type;
  if (op == "BatchNormalization" || op == "BatchNormTraining" || op == "LayerNormalization" ||
      op == "Dropout" || op == "SeededDropout" || op == "MaxPool" || op == "FusedAttention")
    return k == 0;
  return !is_non_differentiable(op);
}

int64_t NodeCost::byte_flops() const {
  return kFlopsPerByte * (bytes_read + bytes_written - cached_bytes) + kFlopsPerCachedByte * cached_bytes;
}

int64_t NodeCost::cost() const { return flops_fwd + flops_bwd() + 3 * (byte_flops() + launch); }

std::vector<bool> needs_gradient(const Graph& g, const std::vector<ValueId>& seeds) {
  std::vector<bool> needs(g.values.size(), false);
  for (size_t v = 0; v < g.values.size(); ++v) needs[v] = g.values[v].is_parameter();
  for (ValueId v : seeds) needs[static_cast<size_t>(v)] = is_floating(g.value(v).type.dtype);
  for (const Node& n : g.nodes) {
    bool any = false;
    for (size_t i = 0; i < n.inputs.size(); ++i)
      any = any || (n.inputs[i] != kNoValue && needs[static_cast<size_t>(n.inputs[i])] &&
                    input_differentiable(n, i));
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const ValueId o = n.outputs[k];
      if (o == kNoValue) continue;
      needs[static_cast<size_t>(o)] =
          any && output_differentiable(n, k) && is_floating(g.value(o).type.dtype);
    }
  }
  return needs;
}

std::vector<bool> gradient_reaches(const Graph& g) {
  std::vector<bool> reached(g.values.size(), false);
  for (ValueId v : g.outputs) reached[static_cast<size_t>(v)] = is_floating(g.value(v).type.dtype);
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    bool any = false;
    for (size_t k = 0; k < n.outputs.size(); ++k)
      any = any || (n.outputs[k] != kNoValue && reached[static_cast<size_t>(n.outputs[k])] &&
                    output_differentiable(n, k));
    if (!any) continue;
    for (size_t j = 0; j < n.inputs.size(); ++j)
      if (n.inputs[j] != kNoValue && input_differentiable(n, j) &&
          is_floating(g.value(n.inputs[j]).type.dtype))
        reached[static_cast<size_t>(n.inputs[j])] = true;
  }
  return reached;
}

// A Conv or ConvGradInput the CPU runs as one matrix product (exec/cpu/nn.cc
// build_pixel_product, nn_grad.cc build_pixel_grad_input): ungrouped, a 1x1 kernel, no pads and
// one pixel per image on both sides (MobileNetV2's late 1x1 convolutions; a 1x1 kernel on one
// pixel has no pads under any auto_pad).
static bool convolution_as_product(const Graph& g, const Node& n) {
  const bool conv = n.domain.empty() && n.op_type == "Conv";
  if (!(conv || (n.domain == kPipetrainDomain && n.op_type == "ConvGradInput")) || n.inputs.size() < 2 ||
      n.outputs.empty() || n.attr_int("group", 1) != 1)
    return false;
  const auto one_pixel = [](const std::vector<int64_t>& d, int64_t from) {
    return d.size() > static_cast<size_t>(from) &&
           std::all_of(d.begin() + from, d.end(), [](int64_t e) { return e == 1; });
  };
  const std::vector<int64_t> pads = n.attr_ints("pads");
  return one_pixel(g.value(n.inputs[1]).type.shape, 2) && one_pixel(g.value(n.inputs[0]).type.shape, 2) &&
         one_pixel(g.value(n.outputs[0]).type.shape, 2) &&
         std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; });
}

// A depthwise Conv or ConvGradInput the CPU runs as a loop of its own rather than on oneDNN
// (exec/cpu/depthwise.cc small_depthwise_maps): W (C, 1, k...) with C >= 16 and maps of at most 4
// pixels on both sides (MobileNetV2's late 3x3s on 2x2 and 1x1 maps). Such a loop starts as any of
// pipetrain's own kernels does (kFlopsPerKernel), where oneDNN's convolution reordered its sides
// into and out of 16-channel blocks first. The weight gradient keeps its convolution's price:
// its loop on such maps (and on the planes oneDNN has no JIT kernel for) reads X saved by the
// forward, cold by then, and took 1.5-2x the forward's time a call (`train --profile`).
static bool depthwise_as_own_loop(const Graph& g, const Node& n) {
  const bool conv = n.domain.empty() && n.op_type == "Conv";
  const bool grad = n.domain == kPipetrainDomain && n.op_type == "ConvGradInput";
  if (!(conv || grad) || n.inputs.size() < 2 || n.outputs.empty()) return false;
  // Conv (X, W) -> Y; ConvGradInput (dY, W) -> dX.
  const std::vector<int64_t>& w = g.value(n.inputs[1]).type.shape;
  const std::vector<int64_t>& x = g.value(conv ? n.inputs[0] : n.outputs[0]).type.shape;
  const std::vector<int64_t>& y = g.value(conv ? n.outputs[0] : n.inputs[0]).type.shape;
  if (w.size() < 3 || x.size() != w.size() || y.size() != w.size() || w[1] != 1 || x[1] < 16 || w[0] != x[1] ||
      y[1] != x[1] || n.attr_int("group", 1) != x[1])
    return false;
  int64_t in = 1, out = 1;
  for (size_t i = 2; i < x.size(); ++i) in *= x[i], out *= y[i];
  return in <= 4 && out <= 4;
}

std::vector<NodeCost> estimate_costs(const Graph& g) {
  const std::vector<bool> needs = needs_gradient(g);
  std::vector<NodeCost> costs(g.nodes.size());
  std::vector<bool> saved(g.values.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    NodeCost& c = costs[i];
    compute_flops(g, needs, n, &c);
    std::set<ValueId> params;
    for (ValueId v : n.inputs)
      if (v != kNoValue && g.value(v).is_parameter()) params.insert(v);
    for (ValueId v : params) c.param_bytes += nbytes(g, v);
    if (ValueId b = kNoValue; fused_into_product(g, n, &b)) {
      // A row bias is read; an accumulator of the product's shape is the output's own lines.
      if (!(g.value(b).type == g.value(n.outputs[0]).type)) c.bytes_read = nbytes(g, b);
    } else if (!g.moves_no_bytes(n)) {
      c.launch = convolution_as_product(g, n)  ? kFlopsPerProduct
                 : depthwise_as_own_loop(g, n) ? kFlopsPerKernel
                                               : launch_flops(n);
      for (ValueId v : n.inputs) c.bytes_read += nbytes(g, v);
      for (ValueId v : n.outputs) c.bytes_written += nbytes(g, v);
      add_extra_sweeps(g, n, &c);
    }
    if (c.bytes_read + c.bytes_written <= kCacheBytes) c.cached_bytes = c.bytes_read + c.bytes_written;
    // Mark what this node's backward reads; it is charged to the producer below.
    bool any_grad = false;
    for (size_t k = 0; k < n.inputs.size(); ++k)
      any_grad = any_grad || (n.inputs[k] != kNoValue &&
                              needs[static_cast<size_t>(n.inputs[k])] && input_differentiable(n, k));
    if (!any_grad) continue;
    for (int s : saved_for_backward(n)) {
      const size_t idx = static_cast<size_t>(s >= 0 ? s : -1 - s);
      const auto& list = s >= 0 ? n.inputs : n.outputs;
      if (idx >= list.size() || list[idx] == kNoValue) continue;
      const Value& v = g.value(list[idx]);
      if (v.is_initializer()) continue;  // parameters and constants are not activations
      // A MatMul's B = Transpose(W) of a 2-D W: its backward reads W itself (grad_matmul).
      if (n.op_type == "MatMul" && s == 1 && v.producer >= 0) {
        const Node& t = g.nodes[static_cast<size_t>(v.producer)];
        const std::vector<int64_t> perm = t.attr_ints("perm");
        if (t.op_type == "Transpose" && t.inputs.size() == 1 && g.value(t.inputs[0]).type.shape.size() == 2 &&
            (perm.empty() || perm == std::vector<int64_t>{1, 0})) {
          if (!g.value(t.inputs[0]).is_initializer()) saved[static_cast<size_t>(t.inputs[0])] = true;
          continue;
        }
      }
      saved[static_cast<size_t>(list[idx])] = true;
    }
  }
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (!saved[v] || g.values[v].producer < 0) continue;
    costs[static_cast<size_t>(g.values[v].producer)].saved_bytes += g.values[v].type.bytes();
  }
  return costs;
}

bool is_product(const Node& n) {
  if (n.domain.empty()) return n.op_type == "MatMul" || n.op_type == "Gemm" || n.op_type == "Conv";
  return n.domain == kPipetrainDomain && (n.op_type == "ConvGradInput" || n.op_type == "ConvGradWeight");
}

// Kernels priced as a library call (kFlopsPerLibraryCall): oneDNN's layer normalisation and
// pooling, and the kernels that normalise rows, a reduction per row before it is written.
static bool runs_like_a_library_call(const Node& n) {
  static const std::set<std::string> onnx = {"LayerNormalization", "MaxPool", "AveragePool", "Softmax",
                                             "LogSoftmax", "BatchNormalization"};
  static const std::set<std::string> own = {"SoftmaxGrad", "LogSoftmaxGrad", "LayerNormGrad", "BatchNormTraining",
                                            "BatchNormGrad", "SoftmaxCrossEntropy", "SoftmaxCrossEntropyGrad"};
  if (n.domain.empty()) return onnx.count(n.op_type) != 0;
  return n.domain == kPipetrainDomain && own.count(n.op_type) != 0;
}

int64_t launch_flops(const Node& n) {
  if (!is_product(n)) return runs_like_a_library_call(n) ? kFlopsPerLibraryCall : kFlopsPerKernel;
  if (n.op_type == "MatMul" || n.op_type == "Gemm") return kFlopsPerProduct;
  if (n.op_type == "ConvGradInput") return kFlopsPerConvolutionGradInput;
  return n.op_type == "ConvGradWeight" ? kFlopsPerConvolutionGradWeight : kFlopsPerConvolution;
}

NodeCost total_cost(const std::vector<NodeCost>& costs) {
  NodeCost t;
  for (const NodeCost& c : costs) {
    t.flops_fwd += c.flops_fwd;
    t.flops_bwd_input += c.flops_bwd_input;
    t.flops_bwd_weight += c.flops_bwd_weight;
    t.bytes_read += c.bytes_read;
    t.bytes_written += c.bytes_written;
    t.param_bytes += c.param_bytes;
    t.saved_bytes += c.saved_bytes;
    t.launch += c.launch;
    t.cached_bytes += c.cached_bytes;
  }
  return t;
}

}  // namespace pt
