#include "onnx_import/fused_ops.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/ir.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

[[noreturn]] void refuse(const FusedFacts& f, const std::string& what, const std::string& todo) {
  throw UserError(f.where, what, todo);
}

const onnx::AttributeProto* find(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}
int64_t attr_i(const onnx::NodeProto& n, const std::string& name, int64_t fallback) {
  const auto* a = find(n, name);
  return a ? a->i() : fallback;
}
float attr_f(const onnx::NodeProto& n, const std::string& name, float fallback) {
  const auto* a = find(n, name);
  return a ? a->f() : fallback;
}
bool has_input(const onnx::NodeProto& n, int i) { return n.input_size() > i && !n.input(i).empty(); }

void set_ints(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
void set_int(onnx::NodeProto& n, const std::string& name, int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

// Appends the replacement's nodes (named after the fused node) and its constants.
class Writer {
 public:
  Writer(const onnx::NodeProto& n, onnx::GraphProto* g, std::vector<onnx::NodeProto>* out)
      : base_((n.name().empty() ? n.output(0) : n.name()) + "/"), g_(g), out_(out) {}

  // op(inputs) -> `output`, or a fresh value; the node, for attributes (valid until the next add).
  onnx::NodeProto& add(const std::string& op, const std::vector<std::string>& inputs,
                       const std::string& output = "") {
    onnx::NodeProto& n = out_->emplace_back();
    n.set_name(base_ + op + "_" + std::to_string(count_++));
    n.set_op_type(op);
    for (const std::string& i : inputs) n.add_input(i);
    n.add_output(output.empty() ? n.name() : output);
    return n;
  }
  std::string value(const std::string& op, const std::vector<std::string>& inputs) {
    return add(op, inputs).output(0);
  }
  std::string floats(const std::vector<int64_t>& shape, const std::vector<float>& v) {
    Tensor t;
    t.type = TensorType{DType::kFloat32, shape};
    t.data.resize(v.size() * sizeof(float));
    std::memcpy(t.data.data(), v.data(), t.data.size());
    return constant(t);
  }
  std::string scalar(float v) { return floats({}, {v}); }
  std::string ints(const std::vector<int64_t>& v) {
    Tensor t;
    t.type = TensorType{DType::kInt64, {static_cast<int64_t>(v.size())}};
    t.data.resize(v.size() * sizeof(int64_t));
    std::memcpy(t.data.data(), v.data(), t.data.size());
    return constant(t);
  }

 private:
  std::string constant(const Tensor& t) {
    const std::string name = base_ + "const_" + std::to_string(count_++);
    tensor_to_proto(t, name, g_->add_initializer());
    return name;
  }

  std::string base_;
  onnx::GraphProto* g_;
  std::vector<onnx::NodeProto>* out_;
  int count_ = 0;
};

// Y = X * Reciprocal(Sqrt(ReduceMean(X * X, axes axis..-1) + epsilon)) * scale
void rms_normalization(const onnx::NodeProto& n, const FusedFacts& f, Writer& w) {
  int64_t axis = attr_i(n, "axis", -1);
  if (axis >= 0) {
    const auto shape = f.shape(n.input(0));
    if (!shape) refuse(f, "the rank of its input is not stated in the model", "export with shape information");
    axis -= static_cast<int64_t>(shape->size());
  }
  std::vector<int64_t> axes;
  for (int64_t a = axis; a < 0; ++a) axes.push_back(a);
  const std::string& x = n.input(0);
  onnx::NodeProto& mean = w.add("ReduceMean", {w.value("Mul", {x, x})});
  set_ints(mean, "axes", axes);
  set_int(mean, "keepdims", 1);
  const std::string ms = mean.output(0);
  const std::string inv = w.value("Reciprocal", {w.value("Sqrt", {w.value("Add", {ms, w.scalar(attr_f(n, "epsilon", 1e-5f))})})});
  w.add("Mul", {w.value("Mul", {x, inv}), n.input(1)}, n.output(0));
}

// K or V with `kv` heads repeated to `q` heads: (B, kv, S, D) -> (B, kv, q/kv, S, D) -> (B, q, S, D).
std::string repeat_heads(Writer& w, const std::string& t, const std::vector<int64_t>& s, int64_t q) {
  const int64_t kv = s[1];
  const std::string grouped = w.value("Reshape", {t, w.ints({0, kv, 1, s[2], s[3]})});
  const std::string expanded = w.value("Expand", {grouped, w.ints({1, 1, q / kv, 1, 1})});
  return w.value("Reshape", {expanded, w.ints({0, q, s[2], s[3]})});
}

// Y = Softmax(Q @ K^T * scale + mask + causal) @ V over (batch, heads, seq, head size).
void attention(const onnx::NodeProto& n, const FusedFacts& f, Writer& w) {
  if (has_input(n, 4) || has_input(n, 5))
    refuse(f, "a KV cache (past_key, past_value) is not supported", "export without a cache (use_cache=False)");
  for (int k = 1; k < n.output_size(); ++k)
    if (!n.output(k).empty())
      refuse(f, "output " + std::to_string(k) + " (the KV cache or the QK product) is not supported",
             "export without a cache (use_cache=False)");
  if (attr_f(n, "softcap", 0.f) != 0.f) refuse(f, "softcap is not supported", "export without logit softcapping");
  const auto qs = f.shape(n.input(0)), ks = f.shape(n.input(1)), vs = f.shape(n.input(2));
  if (!qs || !ks || !vs || qs->size() != 4 || ks->size() != 4 || vs->size() != 4)
    refuse(f, "only the 4-D form (batch, heads, sequence, head size) with stated shapes is supported",
           "export with shape information and 4-D query, key and value");
  for (const auto* s : {&*qs, &*ks, &*vs})
    for (size_t d = 1; d < 4; ++d)
      if ((*s)[d] < 1) refuse(f, "its heads, sequence and head sizes must be static", "export with a static sequence length");
  const int64_t heads = (*qs)[1];
  if (heads % (*ks)[1] != 0 || heads % (*vs)[1] != 0 || (*ks)[1] != (*vs)[1])
    refuse(f, "key and value heads do not divide the query's " + std::to_string(heads), "export the model again");
  const std::string k = (*ks)[1] == heads ? n.input(1) : repeat_heads(w, n.input(1), *ks, heads);
  const std::string v = (*vs)[1] == heads ? n.input(2) : repeat_heads(w, n.input(2), *vs, heads);
  const float scale = find(n, "scale") ? attr_f(n, "scale", 0.f) : 1.f / std::sqrt(static_cast<float>((*qs)[3]));
  onnx::NodeProto& kt = w.add("Transpose", {k});
  set_ints(kt, "perm", {0, 1, 3, 2});
  const std::string k_t = kt.output(0);
  std::string scores = w.value("Mul", {w.value("MatMul", {n.input(0), k_t}), w.scalar(scale)});
  const float inf = std::numeric_limits<float>::infinity();
  if (has_input(n, 3)) {
    const int dtype = f.dtype(n.input(3));
    std::string bias = n.input(3);
    if (dtype == onnx::TensorProto::BOOL) bias = w.value("Where", {n.input(3), w.scalar(0.f), w.scalar(-inf)});
    else if (dtype != onnx::TensorProto::FLOAT)
      refuse(f, "its mask must be bool or float32", "export the attention mask as bool or float32");
    scores = w.value("Add", {scores, bias});
  }
  if (attr_i(n, "is_causal", 0) != 0) {
    const int64_t sq = (*qs)[2], skv = (*ks)[2];
    std::vector<float> causal(static_cast<size_t>(sq * skv), 0.f);
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = i + 1; j < skv; ++j) causal[static_cast<size_t>(i * skv + j)] = -inf;
    scores = w.value("Add", {scores, w.floats({sq, skv}, causal)});
  }
  onnx::NodeProto& softmax = w.add("Softmax", {scores});
  set_int(softmax, "axis", -1);
  const std::string p = softmax.output(0);
  w.add("MatMul", {p, v}, n.output(0));
}

}  // namespace

bool decompose_fused(const onnx::NodeProto& n, const FusedFacts& facts, onnx::GraphProto* g,
                     std::vector<onnx::NodeProto>* out) {
  if (!n.domain().empty() && n.domain() != "ai.onnx") return false;
  // The onnx library here predates these ops, so its checker cannot count their inputs: done here.
  const int inputs = n.op_type() == "RMSNormalization" ? 2 : n.op_type() == "Attention" ? 3 : -1;
  if (inputs < 0) return false;
  for (int i = 0; i < inputs; ++i)
    if (!has_input(n, i) || n.output_size() < 1 || n.output(0).empty())
      refuse(facts, "has " + std::to_string(n.input_size()) + " inputs and " + std::to_string(n.output_size()) +
                        " outputs, but " + n.op_type() + " takes at least " + std::to_string(inputs) +
                        " inputs and gives an output",
             "export the model again");
  Writer w(n, g, out);
  if (n.op_type() == "RMSNormalization") {
    rms_normalization(n, facts, w);
    return true;
  }
  if (n.op_type() == "Attention") {
    attention(n, facts, w);
    return true;
  }
  return false;
}

}  // namespace pt
