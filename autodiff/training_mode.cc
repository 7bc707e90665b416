#include "autodiff/training_mode.h"

#include <algorithm>

#include "core/error.h"
#include "core/pipetrain_ops.h"

namespace pt {
namespace {

bool is_onnx_op(const Node& n, const char* op) {
  return (n.domain.empty() || n.domain == "ai.onnx") && n.op_type == op;
}

// A new value named `name`; UserError naming the node when the model already has one.
ValueId add_named(Graph& g, const Node& n, const std::string& name, const TensorType& t) {
  if (g.find(name) != kNoValue)
    throw UserError(n.label(), "the model already has a value named '" + name + "'",
                    "rename it in the model before exporting");
  return g.add_value(name, t);
}

// Output k of n, when present, must be read by nothing (no node, not a graph output).
void expect_unread(const Graph& g, const Node& n, size_t k, const std::string& what) {
  if (k >= n.outputs.size() || n.outputs[k] == kNoValue) return;
  const ValueId v = n.outputs[k];
  if (!g.value(v).consumers.empty() ||
      std::count(g.outputs.begin(), g.outputs.end(), v) != 0)
    throw UserError(n.label(), "its " + what + " output '" + g.value(v).name + "' is read",
                    "pipetrain keeps running statistics on the host: export the model without "
                    "reading them");
}

// BatchNormalization(X, Scale, B, mean, var) -> BatchNormTraining(X, Scale, B) -> (Y,
// batch_mean, batch_var), the statistics appended to the graph's outputs.
BatchNormStats to_batch_norm_training(Graph& g, Node& n) {
  if (n.inputs.size() != 5 || n.outputs.empty())
    throw UserError(n.label(), "needs inputs X, scale, B, mean, var and output Y",
                    "export the model at opset 14 or later");
  for (size_t i = 3; i < 5; ++i)
    if (n.inputs[i] == kNoValue || !g.value(n.inputs[i]).is_initializer())
      throw UserError(n.label(), "its running " + std::string(i == 3 ? "mean" : "variance") +
                                     " is not an initializer",
                      "export the model with its BatchNorm buffers as initializers");
  expect_unread(g, n, 1, "running mean");
  expect_unread(g, n, 2, "running variance");
  const TensorType x = g.value(n.inputs[0]).type;
  if (x.shape.size() < 2 || x.shape[1] == 0 || x.numel() / x.shape[1] < 2)
    throw UserError(n.label(), "sees " + x.str() + ": fewer than two values per channel",
                    "train with a micro-batch of at least 2 samples");
  BatchNormStats s;
  s.node = n.name;
  s.running_mean = g.value(n.inputs[3]).name;
  s.running_var = g.value(n.inputs[4]).name;
  s.batch_mean = n.name + ".batch_mean";
  s.batch_var = n.name + ".batch_var";
  s.momentum = n.attr_float("momentum", 0.9f);
  const TensorType per_channel{DType::kFloat32, {x.shape[1]}};
  const ValueId mean = add_named(g, n, s.batch_mean, per_channel);
  const ValueId var = add_named(g, n, s.batch_var, per_channel);
  for (ValueId v : {n.inputs[3], n.inputs[4]}) g.value(v).constant = true;
  n.op_type = "BatchNormTraining";
  n.domain = kPipetrainDomain;
  n.inputs.resize(3);
  n.outputs = {n.outputs[0], mean, var};
  n.attrs = {{"epsilon", n.attr_float("epsilon", 1e-5f)}};
  g.outputs.push_back(mean);
  g.outputs.push_back(var);
  return s;
}

// Constant input i of a Dropout as a double (ratio: float or double; training_mode: bool), or
// `fallback` when omitted.
double dropout_constant(const Graph& g, const Node& n, size_t i, double fallback) {
  if (i >= n.inputs.size() || n.inputs[i] == kNoValue) return fallback;
  const Value& v = g.value(n.inputs[i]);
  const char* what = i == 1 ? "ratio" : "training_mode";
  if (!v.is_initializer() || v.type.numel() != 1)
    throw UserError(n.label(), std::string("its ") + what + " is not a constant scalar",
                    "export the model with a fixed dropout ratio");
  switch (v.type.dtype) {
    case DType::kFloat32: return v.init->as<float>()[0];
    case DType::kFloat64: return v.init->as<double>()[0];
    case DType::kBool: return v.init->as<bool>()[0] ? 1.0 : 0.0;
    default:
      throw UserError(n.label(), std::string("its ") + what + " is " + v.type.str(),
                      "export the ratio as float32");
  }
}

// Dropout -> SeededDropout(X, key) -> (Y, mask) when `train`, else the identity.
void rewrite_dropout(Graph& g, Node& n, bool train, ValueId* key) {
  const double ratio = n.has_attr("ratio") ? n.attr_float("ratio", 0.5f)
                                           : dropout_constant(g, n, 1, 0.5);
  dropout_constant(g, n, 2, 0);  // checks that training_mode is a constant
  if (!train || ratio == 0) {
    n.inputs.resize(1);
    n.attrs.clear();
    return;
  }
  if (!(ratio > 0 && ratio < 1))
    throw UserError(n.label(), "has ratio " + std::to_string(ratio) + ", outside [0, 1)",
                    "export the model with a dropout ratio below 1");
  const TensorType x = g.value(n.inputs[0]).type;
  if (x.dtype != DType::kFloat32)
    throw UserError(n.label(), "drops out " + x.str() + "; training dropout takes float32",
                    "turn training-mode dropout off");
  if (*key == kNoValue) {
    *key = add_named(g, n, kDropoutKey, TensorType{DType::kInt64, {}});
    g.inputs.push_back(*key);
  }
  n.op_type = "SeededDropout";
  n.domain = kPipetrainDomain;
  n.inputs = {n.inputs[0], *key};
  n.attrs = {{"ratio", static_cast<float>(ratio)}, {"stream", dropout_stream(n.name)}};
}

// Bernoulli(P) {dtype} -> SeededBernoulli(P, key) when `train` or when the file holds the node
// (Graph::file_draws: torch.bernoulli draws in eval() too), else, for stochastic depth's mask,
// its expected value Cast(P) {to: dtype} (Identity where P already has that dtype): a
// stochastic-depth branch x * M / p then gives x * (p / p) = x exactly, as PyTorch's eval() does.
void rewrite_bernoulli(Graph& g, Node& n, bool train, ValueId* key) {
  const TensorType p = g.value(n.inputs[0]).type;
  const TensorType y = g.value(n.outputs[0]).type;
  const bool file_draw = g.file_draws.count(n.name) != 0;
  if (!train && !file_draw) {
    n.attrs.clear();
    if (y.dtype == p.dtype) {
      n.op_type = "Identity";
    } else {
      n.op_type = "Cast";
      n.attrs = {{"to", static_cast<int64_t>(y.dtype)}};
    }
    return;
  }
  if (p.dtype != DType::kFloat32 || y.dtype != DType::kFloat32)
    throw UserError(n.label(), "draws " + y.str() + " from " + p.str() +
                                   (file_draw ? "; draws take float32" : "; training draws take float32"),
                    file_draw ? "export the Bernoulli draw in float32"
                              : "turn training-mode dropout off (dropout: off)");
  if (*key == kNoValue) {
    *key = add_named(g, n, kDropoutKey, TensorType{DType::kInt64, {}});
    g.inputs.push_back(*key);
  }
  n.op_type = "SeededBernoulli";
  n.domain = kPipetrainDomain;
  n.inputs = {n.inputs[0], *key};
  n.attrs = {{"stream", dropout_stream(n.name)}};
}

}  // namespace

void dropout_as_identity(Graph& g) {
  ValueId key = kNoValue;
  for (Node& n : g.nodes) {
    if (is_onnx_op(n, "Dropout")) rewrite_dropout(g, n, false, &key);
    if (is_onnx_op(n, "Bernoulli")) rewrite_bernoulli(g, n, false, &key);
  }
  if (key != kNoValue) g.opsets[kPipetrainDomain] = 1;
  g.rebuild_uses();
}

TrainingForm to_training_mode(Graph& g, const TrainingModeOptions& options) {
  g.rebuild_uses();
  TrainingForm form;
  ValueId key = kNoValue;
  for (Node& n : g.nodes) {
    if (is_onnx_op(n, "BatchNormalization")) {
      form.batch_norms.push_back(to_batch_norm_training(g, n));
    } else if (is_onnx_op(n, "Dropout")) {
      rewrite_dropout(g, n, options.dropout, &key);
      form.dropouts += n.op_type == "SeededDropout";
    } else if (is_onnx_op(n, "Bernoulli")) {
      rewrite_bernoulli(g, n, options.dropout, &key);
      form.draws += n.op_type == "SeededBernoulli";
    }
  }
  form.dropout_key = key != kNoValue;
  if (!form.batch_norms.empty() || form.dropouts > 0 || form.draws > 0)
    g.opsets[kPipetrainDomain] = 1;
  g.rebuild_uses();
  return form;
}

int64_t dropout_stream(const std::string& node_name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char ch : node_name) h = (h ^ ch) * 0x100000001b3ull;
  return static_cast<int64_t>(h);
}

int64_t dropout_key_for(uint64_t seed, int64_t step, int64_t micro_batch) {
  // splitmix64's finaliser over each field in turn: distinct (seed, step, micro_batch) give
  // unrelated keys.
  const auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(seed + 0x9e3779b97f4a7c15ull);
  h = mix(h ^ static_cast<uint64_t>(step));
  h = mix(h ^ static_cast<uint64_t>(micro_batch));
  return static_cast<int64_t>(h);
}

void update_running_statistics(Tensor& running_mean, Tensor& running_var, const Tensor& batch_mean,
                               const Tensor& batch_var, float momentum) {
  const auto update = [momentum](Tensor& running, const Tensor& batch) {
    PT_CHECK(running.type == batch.type && running.type.dtype == DType::kFloat32,
             "running statistics " + running.type.str() + " against batch " + batch.type.str());
    float* r = running.as<float>();
    const float* b = batch.as<float>();
    for (int64_t c = 0; c < running.type.numel(); ++c)
      r[c] = r[c] * momentum + b[c] * (1.0f - momentum);
  };
  update(running_mean, batch_mean);
  update(running_var, batch_var);
}

}  // namespace pt
