#include "onnx_import/fold_batch_norm.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace pt {
namespace {

// The float32 constant data of input k of n, or nullptr.
const Tensor* float_constant(const Graph& g, const Node& n, size_t k) {
  if (k >= n.inputs.size() || n.inputs[k] == kNoValue) return nullptr;
  const Value& v = g.value(n.inputs[k]);
  return v.init && v.type.dtype == DType::kFloat32 ? v.init.get() : nullptr;
}

bool is_graph_output(const Graph& g, ValueId v) {
  return std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end();
}

// The Conv node whose output the inference-form BatchNormalization `bn` alone reads, with its
// weights and per-channel statistics all float32 constants of one channel count; -1 otherwise.
int foldable_conv(const Graph& g, const Node& bn) {
  if (bn.op_type != "BatchNormalization" || !bn.domain.empty() || bn.outputs.size() != 1 ||
      bn.attr_int("training_mode", 0) != 0 || bn.inputs.size() != 5 || bn.inputs[0] == kNoValue)
    return -1;
  const Value& x = g.value(bn.inputs[0]);
  if (x.producer < 0 || x.consumers.size() != 1 || is_graph_output(g, bn.inputs[0])) return -1;
  const Node& conv = g.nodes[static_cast<size_t>(x.producer)];
  if (conv.op_type != "Conv" || !conv.domain.empty() || conv.outputs.size() != 1) return -1;
  const Tensor* w = float_constant(g, conv, 1);
  if (!w || w->type.shape.empty()) return -1;
  const int64_t channels = w->type.shape[0];
  const bool has_bias = conv.inputs.size() > 2 && conv.inputs[2] != kNoValue;
  if (has_bias && (!float_constant(g, conv, 2) || float_constant(g, conv, 2)->type.numel() != channels))
    return -1;
  for (size_t k = 1; k < 5; ++k) {
    const Tensor* t = float_constant(g, bn, k);
    if (!t || t->type.numel() != channels) return -1;
  }
  return x.producer;
}

// A float32 tensor of `shape`, its data zeros until written.
Tensor float_tensor(std::vector<int64_t> shape) {
  Tensor t;
  t.type = {DType::kFloat32, std::move(shape)};
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  return t;
}

}  // namespace

int fold_batch_norms(Graph& g) {
  g.rebuild_uses();
  std::vector<bool> gone(g.nodes.size(), false);
  int folded = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const int c = foldable_conv(g, g.nodes[i]);
    if (c < 0) continue;
    const Node& bn = g.nodes[i];
    Node& conv = g.nodes[static_cast<size_t>(c)];
    // The constants' data lives in shared tensors: adding initializers below moves none of it.
    const Tensor& w = *float_constant(g, conv, 1);
    const Tensor* b = float_constant(g, conv, 2);
    const float* scale = float_constant(g, bn, 1)->as<float>();
    const float* beta = float_constant(g, bn, 2)->as<float>();
    const float* mean = float_constant(g, bn, 3)->as<float>();
    const float* var = float_constant(g, bn, 4)->as<float>();
    const double eps = bn.attr_float("epsilon", 1e-5f);
    const int64_t channels = w.type.shape[0], per = w.type.numel() / channels;
    Tensor w2 = float_tensor(w.type.shape), b2 = float_tensor({channels});
    for (int64_t o = 0; o < channels; ++o) {
      const double s = scale[o] / std::sqrt(static_cast<double>(var[o]) + eps);
      for (int64_t j = 0; j < per; ++j)
        w2.as<float>()[o * per + j] = static_cast<float>(w.as<float>()[o * per + j] * s);
      b2.as<float>()[o] = static_cast<float>(((b ? b->as<float>()[o] : 0.0) - mean[o]) * s + beta[o]);
    }
    // Named after the BatchNormalization's output, a value name no other fold takes (node names
    // may be empty or repeat).
    const std::string base = g.value(bn.outputs[0]).name;
    const ValueId wv = g.add_initializer(base + "/folded_W", std::move(w2), true);
    const ValueId bv = g.add_initializer(base + "/folded_B", std::move(b2), true);
    conv.inputs.resize(std::max<size_t>(conv.inputs.size(), 3), kNoValue);
    conv.inputs[1] = wv;
    conv.inputs[2] = bv;
    conv.outputs[0] = bn.outputs[0];
    gone[i] = true;
    ++folded;
  }
  if (folded > 0) g.remove_nodes(gone);
  return folded;
}

}  // namespace pt
