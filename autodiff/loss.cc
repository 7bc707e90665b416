#include "autodiff/loss.h"

#include <algorithm>

#include "core/error.h"
#include "core/pipetrain_ops.h"

namespace pt {

LossSpec::Kind LossSpec::parse_kind(const std::string& text, const std::string& where) {
  if (text == "cross_entropy") return Kind::kCrossEntropy;
  if (text == "mse") return Kind::kMse;
  if (text == "model") return Kind::kModel;
  throw UserError(where, "unknown loss '" + text + "'", "use cross_entropy, mse or model");
}

namespace {

ValueId add_op(Graph& g, const std::string& op, std::vector<ValueId> inputs,
               const TensorType& type, const std::string& out, std::map<std::string, AttrValue> attrs = {},
               const std::string& domain = "") {
  Node n;
  n.name = out;
  n.op_type = op;
  n.domain = domain;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  const ValueId v = g.add_value(out, type);
  n.outputs = {v};
  g.add_node(std::move(n));
  return v;
}

}  // namespace

void add_loss(Graph& g, const LossSpec& spec) {
  PT_CHECK(!g.outputs.empty(), "add_loss: graph has no outputs");
  const ValueId pred = spec.output.empty() ? g.outputs[0] : g.find(spec.output);
  if (pred == kNoValue || !std::count(g.outputs.begin(), g.outputs.end(), pred))
    throw UserError("loss.output", "'" + spec.output + "' is not an output of the model",
                    "name one of the model's outputs (pipetrain inspect lists them)");
  const TensorType pt = g.value(pred).type;
  const std::string where = "loss on output '" + g.value(pred).name + "'";
  if (pt.dtype != DType::kFloat32)
    throw UserError(where, "the output is " + pt.str() + ", not float32",
                    "point the loss at the model's float32 logits or prediction");
  for (const char* name : {kLossOutput, kLossTarget, kLossScale})
    if (g.find(name) != kNoValue)
      throw UserError(where, std::string("the model already has a value named '") + name + "'",
                      "rename it in the model before exporting");
  const TensorType scalar{DType::kFloat32, {}};
  const ValueId scale = g.add_value(kLossScale, scalar);
  std::vector<ValueId> inputs = {scale};
  ValueId loss = kNoValue;
  switch (spec.kind) {
    case LossSpec::Kind::kCrossEntropy: {
      if (pt.shape.empty())
        throw UserError(where, "cross_entropy needs logits with a class axis, got a scalar",
                        "use loss kind model for a model that computes its own loss");
      std::vector<int64_t> ts(pt.shape.begin(), pt.shape.end() - 1);
      const ValueId target = g.add_value(kLossTarget, TensorType{DType::kInt64, ts});
      inputs.insert(inputs.begin(), target);
      loss = add_op(g, "SoftmaxCrossEntropy", {pred, target, scale}, scalar, kLossOutput,
                    {{"ignore_index", spec.ignore_index}}, kPipetrainDomain);
      break;
    }
    case LossSpec::Kind::kMse: {
      const ValueId target = g.add_value(kLossTarget, pt);
      inputs.insert(inputs.begin(), target);
      const ValueId diff = add_op(g, "Sub", {pred, target}, pt, "loss/diff");
      const ValueId sq = add_op(g, "Mul", {diff, diff}, pt, "loss/squared");
      const ValueId sum = add_op(g, "ReduceSum", {sq}, scalar, "loss/sum",
                                 {{"keepdims", int64_t{0}}});
      loss = add_op(g, "Mul", {sum, scale}, scalar, kLossOutput);
      break;
    }
    case LossSpec::Kind::kModel: {
      if (pt.numel() != 1)
        throw UserError(where, "loss kind model needs a scalar output, got " + pt.str(),
                        "use cross_entropy or mse, which reduce the output themselves");
      loss = add_op(g, "Mul", {pred, scale}, pt, kLossOutput);
      break;
    }
  }
  g.inputs.insert(g.inputs.end(), inputs.begin(), inputs.end());
  g.outputs.insert(g.outputs.begin(), loss);
  g.rebuild_uses();
}

float loss_scale(const LossSpec& spec, const std::vector<const Tensor*>& targets,
                 const std::string& where) {
  if (spec.kind == LossSpec::Kind::kModel) return 1.0f / static_cast<float>(targets.size());
  int64_t counted = 0;
  for (const Tensor* t : targets) {
    if (spec.kind == LossSpec::Kind::kMse) {
      counted += t->type.numel();
      continue;
    }
    const int64_t* v = t->as<int64_t>();
    for (int64_t i = 0; i < t->type.numel(); ++i) counted += v[i] != spec.ignore_index;
  }
  if (counted == 0)
    throw UserError(where, "every target equals ignore_index", "give at least one real target");
  return 1.0f / static_cast<float>(counted);
}

}  // namespace pt
