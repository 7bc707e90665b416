// autodiff/grad_context.h: what one gradient rule sees. In: a forward node of the work graph and
// the gradients of its outputs. Out: backward nodes (appended to a list kept apart from the
// forward nodes) and one gradient contribution per input that wants one.
//
// Values of the backward live in the same value table as the forward's, so a rule refers to
// forward tensors (X, Y) and backward ones (dY) alike by ValueId; build_backward later sorts the
// nodes into the F, B and W graphs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

class GradContext {
 public:
  using Attrs = std::map<std::string, AttrValue>;

  GradContext(Graph& work, int node_index, std::vector<Node>& backward,
              std::vector<ValueId> dys, std::vector<bool> wants, int* counter);

  const Node& node() const { return work_.nodes[static_cast<size_t>(index_)]; }
  ValueId x(size_t i) const;     // forward input i (kNoValue when omitted)
  // Data of input i when it is an initializer or folded constant (axes, pads), else nullptr.
  const Tensor* constant(size_t i) const;
  // W where v is Transpose(W) of a 2-D W (how exporters write a linear layer's weight for
  // MatMul), else kNoValue: a rule that reads W itself spares the backward the transposed copy,
  // which F would otherwise keep for every micro-batch in flight.
  ValueId untransposed(ValueId v) const;
  // Forward output k. An optional output the forward did not produce (LayerNormalization's
  // Mean, Dropout's mask) is added to the forward node on demand.
  ValueId y(size_t k);
  ValueId dy(size_t k = 0) const { return k < dys_.size() ? dys_[k] : kNoValue; }
  bool wants(size_t i) const { return i < wants_.size() && wants_[i]; }
  // Copies: emitting a node may grow the value table under a reference.
  TensorType type(ValueId v) const { return work_.value(v).type; }
  std::vector<int64_t> shape(ValueId v) const { return work_.value(v).type.shape; }

  // Adds `grad` to input i's gradient (inputs used twice get two contributions, summed later).
  void give(size_t i, ValueId grad);
  const std::vector<ValueId>& given() const { return given_; }

  // Appends a backward node with one output of type `out`; domain "pipetrain" for fused ops.
  ValueId emit(const std::string& op, std::vector<ValueId> inputs, const TensorType& out,
               Attrs attrs = {}, const std::string& domain = "");
  // Several outputs; an output whose dtype is kUndefined is omitted (kNoValue).
  std::vector<ValueId> emit_n(const std::string& op, std::vector<ValueId> inputs,
                              const std::vector<TensorType>& outs, Attrs attrs = {},
                              const std::string& domain = "");
  ValueId ints(const std::vector<int64_t>& data);  // constant int64 [n]
  ValueId scalar(float v);                         // constant float32 scalar

  // dY reduced to `shape` over the axes numpy broadcasting stretched, then reshaped.
  ValueId sum_to(ValueId g, std::vector<int64_t> shape);
  ValueId reshape(ValueId v, std::vector<int64_t> shape);
  ValueId transpose(ValueId v, const std::vector<int64_t>& perm);
  // Common element-wise ops on float tensors, with numpy broadcasting of shapes.
  ValueId mul(ValueId a, ValueId b);
  ValueId div(ValueId a, ValueId b);
  ValueId sub(ValueId a, ValueId b);
  ValueId neg(ValueId a);

 private:
  std::string fresh(const std::string& stem);
  Graph& work_;
  int index_;
  std::vector<Node>& backward_;
  std::vector<ValueId> dys_;
  std::vector<bool> wants_;
  std::vector<ValueId> given_;
  int* counter_;
};

// Shape of numpy broadcasting a with b (both valid to broadcast).
std::vector<int64_t> broadcast_shape(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

using GradRule = void (*)(GradContext&);

// The rule for an op ("" or "pipetrain" domain), or nullptr when pipetrain cannot differentiate it.
GradRule find_grad_rule(const std::string& domain, const std::string& op_type);
// Every op with a rule, as "op" or "domain::op".
std::vector<std::string> grad_rule_ops();

}  // namespace pt
