#include "autodiff/grad_context.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace pt {

GradContext::GradContext(Graph& work, int node_index, std::vector<Node>& backward,
                         std::vector<ValueId> dys, std::vector<bool> wants, int* counter)
    : work_(work), index_(node_index), backward_(backward), dys_(std::move(dys)),
      wants_(std::move(wants)), given_(node().inputs.size(), kNoValue), counter_(counter) {}

ValueId GradContext::x(size_t i) const {
  return i < node().inputs.size() ? node().inputs[i] : kNoValue;
}

ValueId GradContext::untransposed(ValueId v) const {
  const int p = work_.value(v).producer;
  if (p < 0) return kNoValue;
  const Node& t = work_.nodes[static_cast<size_t>(p)];
  if (t.op_type != "Transpose" || !t.domain.empty() || t.inputs.size() != 1 || work_.value(t.inputs[0]).type.shape.size() != 2)
    return kNoValue;
  const std::vector<int64_t> perm = t.attr_ints("perm");
  return perm.empty() || perm == std::vector<int64_t>{1, 0} ? t.inputs[0] : kNoValue;
}

const Tensor* GradContext::constant(size_t i) const {
  const ValueId v = x(i);
  return v == kNoValue ? nullptr : work_.value(v).init.get();
}

// Types of the optional outputs a rule may ask for, from the forward node's inputs.
static TensorType optional_output_type(const Graph& g, const Node& n, size_t k) {
  const TensorType x = g.value(n.inputs[0]).type;
  if (n.op_type == "LayerNormalization" && (k == 1 || k == 2)) {
    int64_t axis = n.attr_int("axis", -1);
    if (axis < 0) axis += static_cast<int64_t>(x.shape.size());
    TensorType t{DType::kFloat32, x.shape};
    for (size_t d = static_cast<size_t>(axis); d < t.shape.size(); ++d) t.shape[d] = 1;
    return t;
  }
  if ((n.op_type == "Dropout" || n.op_type == "SeededDropout") && k == 1)
    return TensorType{DType::kBool, x.shape};
  if (n.op_type == "FusedAttention" && k == 1 && x.shape.size() == 4)  // LogSumExp [B, H, S]
    return TensorType{DType::kFloat32, {x.shape[0], x.shape[1], x.shape[2]}};
  PT_CHECK(false, "no optional output " + std::to_string(k) + " for " + n.label());
  return {};
}

ValueId GradContext::y(size_t k) {
  Node& n = work_.nodes[static_cast<size_t>(index_)];
  if (k < n.outputs.size() && n.outputs[k] != kNoValue) return n.outputs[k];
  const TensorType t = optional_output_type(work_, n, k);
  const ValueId v = work_.add_value(fresh("saved"), t);
  work_.value(v).producer = index_;
  if (n.outputs.size() <= k) n.outputs.resize(k + 1, kNoValue);
  n.outputs[k] = v;
  return v;
}

void GradContext::give(size_t i, ValueId grad) {
  PT_CHECK(wants(i), node().label() + ": gradient given for input " + std::to_string(i) +
                         " that wants none");
  PT_CHECK(given_[i] == kNoValue, node().label() + ": input gradient given twice");
  PT_CHECK(type(grad).shape == shape(x(i)),
           node().label() + ": gradient " + type(grad).str() + " for input " + type(x(i)).str());
  given_[i] = grad;
}

std::string GradContext::fresh(const std::string& stem) {
  return "bwd/" + node().name + "/" + stem + "." + std::to_string((*counter_)++);
}

std::vector<ValueId> GradContext::emit_n(const std::string& op, std::vector<ValueId> inputs,
                                         const std::vector<TensorType>& outs, Attrs attrs,
                                         const std::string& domain) {
  Node n;
  n.name = fresh(op);
  n.op_type = op;
  n.domain = domain;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  for (const TensorType& t : outs)
    n.outputs.push_back(t.dtype == DType::kUndefined ? kNoValue : work_.add_value(fresh("g"), t));
  backward_.push_back(n);
  return backward_.back().outputs;
}

ValueId GradContext::emit(const std::string& op, std::vector<ValueId> inputs,
                          const TensorType& out, Attrs attrs, const std::string& domain) {
  return emit_n(op, std::move(inputs), {out}, std::move(attrs), domain)[0];
}

ValueId GradContext::ints(const std::vector<int64_t>& data) {
  Tensor t;
  t.type = TensorType{DType::kInt64, {static_cast<int64_t>(data.size())}};
  t.data.resize(data.size() * sizeof(int64_t));
  if (!data.empty()) std::memcpy(t.data.data(), data.data(), t.data.size());
  return work_.add_initializer(fresh("const"), std::move(t), /*constant=*/true);
}

ValueId GradContext::scalar(float v) {
  Tensor t;
  t.type = TensorType{DType::kFloat32, {}};
  t.data.resize(sizeof(float));
  std::memcpy(t.data.data(), &v, sizeof(float));
  return work_.add_initializer(fresh("const"), std::move(t), /*constant=*/true);
}

std::vector<int64_t> broadcast_shape(const std::vector<int64_t>& a,
                                     const std::vector<int64_t>& b) {
  const size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> out(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    const int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

ValueId GradContext::sum_to(ValueId g, std::vector<int64_t> target) {
  const std::vector<int64_t> s = shape(g);
  if (s == target) return g;
  PT_CHECK(target.size() <= s.size(), "sum_to: target has more axes than the gradient");
  const size_t lead = s.size() - target.size();
  std::vector<int64_t> axes;
  std::vector<int64_t> kept = s;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i < lead || (target[i - lead] == 1 && s[i] != 1)) {
      axes.push_back(static_cast<int64_t>(i));
      kept[i] = 1;
    }
  }
  ValueId r = g;
  if (!axes.empty())
    r = emit("ReduceSum", {g, ints(axes)}, TensorType{type(g).dtype, kept},
             {{"keepdims", int64_t{1}}});
  return reshape(r, target);
}

ValueId GradContext::reshape(ValueId v, std::vector<int64_t> shape_to) {
  if (shape(v) == shape_to) return v;
  return emit("Reshape", {v, ints(shape_to)}, TensorType{type(v).dtype, shape_to});
}

ValueId GradContext::transpose(ValueId v, const std::vector<int64_t>& perm) {
  std::vector<int64_t> s(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) s[i] = shape(v)[static_cast<size_t>(perm[i])];
  return emit("Transpose", {v}, TensorType{type(v).dtype, s}, {{"perm", perm}});
}

static ValueId binary(GradContext& c, const char* op, ValueId a, ValueId b) {
  return c.emit(op, {a, b}, TensorType{c.type(a).dtype, broadcast_shape(c.shape(a), c.shape(b))});
}

ValueId GradContext::mul(ValueId a, ValueId b) { return binary(*this, "Mul", a, b); }
ValueId GradContext::div(ValueId a, ValueId b) { return binary(*this, "Div", a, b); }
ValueId GradContext::sub(ValueId a, ValueId b) { return binary(*this, "Sub", a, b); }
ValueId GradContext::neg(ValueId a) { return emit("Neg", {a}, type(a)); }

}  // namespace pt
