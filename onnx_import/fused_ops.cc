#include "onnx_import/fused_ops.h"

#include <algorithm>
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

// The 3-D form (B, S, heads * D) as (B, heads, S, D), and back.
std::string to_heads(Writer& w, const std::string& t, const std::vector<int64_t>& s, int64_t heads) {
  onnx::NodeProto& tr = w.add("Transpose", {w.value("Reshape", {t, w.ints({0, s[1], heads, s[2] / heads})})});
  set_ints(tr, "perm", {0, 2, 1, 3});
  return tr.output(0);
}
void from_heads(Writer& w, const std::string& t, const std::string& out) {
  onnx::NodeProto& tr = w.add("Transpose", {t});
  set_ints(tr, "perm", {0, 2, 1, 3});
  w.add("Reshape", {tr.output(0), w.ints({0, 0, -1})}, out);
}

// What the attributes and the cache say about which keys a query may see: query i (of sq)
// attends key j (of skv) iff, with p = i + past (the query's absolute position),
//   j <= p (is_causal),  p - j <= left (left_window_size >= 0),  j - p <= right (right_window_size >= 0).
// The additive bias (0 or -inf) over (sq, skv), empty when every key is allowed.
std::vector<float> static_bias(int64_t sq, int64_t skv, int64_t past, bool causal, int64_t left, int64_t right) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> bias(static_cast<size_t>(sq * skv), 0.f);
  bool any = false;
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < skv; ++j) {
      const int64_t p = i + past;
      const bool allowed = (!causal || j <= p) && (left < 0 || p - j <= left) && (right < 0 || j - p <= right);
      if (!allowed) bias[static_cast<size_t>(i * skv + j)] = -inf, any = true;
    }
  if (!any) bias.clear();
  return bias;
}

// The attention mask as an additive float32 bias over the skv keys: a bool mask 0 where true and
// -inf where false; a mask narrower than the keys (a cache's) padded with -inf.
std::string mask_bias(const std::string& m, int64_t skv, const FusedFacts& f, Writer& w) {
  const auto shape = f.shape(m);
  if (!shape || shape->empty() || shape->back() < 1 || shape->back() > skv)
    refuse(f, "its mask's last dimension must be static and at most the " + std::to_string(skv) + " keys",
           "export with shape information");
  const int dtype = f.dtype(m);
  const float inf = std::numeric_limits<float>::infinity();
  std::string bias = m;
  if (dtype == onnx::TensorProto::BOOL) bias = w.value("Where", {m, w.scalar(0.f), w.scalar(-inf)});
  else if (dtype != onnx::TensorProto::FLOAT)
    refuse(f, "its mask must be bool or float32", "export the attention mask as bool or float32");
  if (shape->back() < skv) {
    std::vector<int64_t> pads(2 * shape->size(), 0);
    pads.back() = skv - shape->back();
    bias = w.value("Pad", {bias, w.ints(pads), w.scalar(-inf)});
  }
  return bias;
}

// Attention-23 to 25 over (batch, heads, seq, head size), the 3-D form (batch, seq, heads * head
// size) reshaped to it, as ONNX's reference computes it:
//   K, V = Concat(past, K), Concat(past, V)            (the present outputs; no cache: K, V)
//   S = softcap(Q @ K^T * scale)                       softcap(x) = c * tanh(x / c), c > 0
//   bias = mask (bool: 0 where true, -inf where false; narrower than the keys: -inf padded)
//          + the causal and window bias of static_bias
//   P = Softmax(S + bias), a row whose bias is -inf throughout (no key to attend) all zeros
//   Y = P @ V,  K and V heads repeated to Q's (grouped-query attention)
// A fully masked row's softmax is taken of S alone (bias 0 there) so that neither it nor its
// gradient is NaN, then zeroed.
void attention(const onnx::NodeProto& n, const FusedFacts& f, Writer& w) {
  if (has_input(n, 6))
    refuse(f, "input 6 (nonpad_kv_seqlen, the lengths of an external KV cache) is not supported",
           "export without a static KV cache");
  if (has_input(n, 4) != has_input(n, 5))
    refuse(f, "past_key and past_value must be given together", "export the model again");
  const float softcap = attr_f(n, "softcap", 0.f);
  const int64_t mode = attr_i(n, "qk_matmul_output_mode", 0);
  const bool qk_out = n.output_size() > 3 && !n.output(3).empty();
  if (qk_out && (mode < 0 || mode > 3))
    refuse(f, "qk_matmul_output_mode " + std::to_string(mode) + " is not one of 0-3", "export the model again");
  if (qk_out && mode == 0 && softcap > 0)
    refuse(f, "qk_matmul_output_mode 0 (the raw product) with softcap is not supported",
           "ask for mode 1 (after softcap) or drop the fourth output");
  auto qs = f.shape(n.input(0)), ks = f.shape(n.input(1)), vs = f.shape(n.input(2));
  if (!qs || !ks || !vs || qs->size() != ks->size() || qs->size() != vs->size() || (qs->size() != 3 && qs->size() != 4))
    refuse(f, "query, key and value must be all 3-D or all 4-D with stated shapes",
           "export with shape information");
  for (const auto* s : {&*qs, &*ks, &*vs})
    for (size_t d = 1; d < s->size(); ++d)
      if ((*s)[d] < 1) refuse(f, "its heads, sequence and head sizes must be static", "export with a static sequence length");
  std::string q = n.input(0), k = n.input(1), v = n.input(2);
  const bool three_d = qs->size() == 3;
  if (three_d) {
    const int64_t hq = attr_i(n, "q_num_heads", 0), hkv = attr_i(n, "kv_num_heads", 0);
    if (hq < 1 || hkv < 1 || (*qs)[2] % hq != 0 || (*ks)[2] % hkv != 0 || (*vs)[2] % hkv != 0)
      refuse(f, "the 3-D form needs q_num_heads and kv_num_heads dividing the hidden sizes", "export the model again");
    q = to_heads(w, q, *qs, hq), k = to_heads(w, k, *ks, hkv), v = to_heads(w, v, *vs, hkv);
    qs = std::vector<int64_t>{(*qs)[0], hq, (*qs)[1], (*qs)[2] / hq};
    ks = std::vector<int64_t>{(*ks)[0], hkv, (*ks)[1], (*ks)[2] / hkv};
    vs = std::vector<int64_t>{(*vs)[0], hkv, (*vs)[1], (*vs)[2] / hkv};
  }
  int64_t past = 0;
  if (has_input(n, 4)) {
    const auto pk = f.shape(n.input(4)), pv = f.shape(n.input(5));
    if (!pk || !pv || pk->size() != 4 || pv->size() != 4 || (*pk)[2] < 0 || (*pk)[2] != (*pv)[2])
      refuse(f, "past_key and past_value must be 4-D with one static length", "export with shape information");
    past = (*pk)[2];
    for (auto [cache, t] : {std::pair{4, &k}, std::pair{5, &v}}) {
      onnx::NodeProto& cat = w.add("Concat", {n.input(cache), *t});
      set_int(cat, "axis", 2);
      *t = cat.output(0);
    }
    (*ks)[2] += past, (*vs)[2] += past;
  }
  for (int o = 1; o <= 2; ++o)
    if (n.output_size() > o && !n.output(o).empty()) w.add("Identity", {o == 1 ? k : v}, n.output(o));
  const int64_t heads = (*qs)[1], sq = (*qs)[2], skv = (*ks)[2];
  if (heads % (*ks)[1] != 0 || (*ks)[1] != (*vs)[1])
    refuse(f, "key and value heads do not divide the query's " + std::to_string(heads), "export the model again");
  if ((*ks)[1] != heads) k = repeat_heads(w, k, *ks, heads), v = repeat_heads(w, v, *vs, heads);
  const float scale = find(n, "scale") ? attr_f(n, "scale", 0.f) : 1.f / std::sqrt(static_cast<float>((*qs)[3]));
  onnx::NodeProto& kt = w.add("Transpose", {k});
  set_ints(kt, "perm", {0, 1, 3, 2});
  const std::string k_t = kt.output(0);
  std::string scores = w.value("Mul", {w.value("MatMul", {q, k_t}), w.scalar(scale)});
  const std::string raw_scores = scores;
  if (softcap > 0)
    scores = w.value("Mul", {w.value("Tanh", {w.value("Mul", {scores, w.scalar(1.f / softcap)})}), w.scalar(softcap)});
  const std::string capped = scores;

  const float inf = std::numeric_limits<float>::infinity();
  std::string bias;  // the additive bias, or empty
  if (has_input(n, 3)) bias = mask_bias(n.input(3), skv, f, w);
  const std::vector<float> fixed = static_bias(sq, skv, past, attr_i(n, "is_causal", 0) != 0,
                                               attr_i(n, "left_window_size", -1), attr_i(n, "right_window_size", -1));
  if (!fixed.empty()) {
    const std::string c = w.floats({sq, skv}, fixed);
    bias = bias.empty() ? c : w.value("Add", {bias, c});
  }
  // The rows with no key to attend: fully_masked (with a mask, bool [..., sq, 1], true there;
  // without, a constant float [sq, 1], 0 there) and the bias with those rows 0, so that their
  // softmax (then zeroed) stays finite.
  std::string fully_masked, safe_bias = bias;
  if (!bias.empty()) {
    if (has_input(n, 3)) {
      onnx::NodeProto& cast = w.add("Cast", {w.value("Equal", {bias, w.scalar(-inf)})});
      set_int(cast, "to", onnx::TensorProto::FLOAT);
      const std::string masked = cast.output(0);
      onnx::NodeProto& count = w.add("ReduceSum", {masked, w.ints({-1})});
      set_int(count, "keepdims", 1);
      const std::string masked_keys = count.output(0);
      fully_masked = w.value("Equal", {masked_keys, w.scalar(static_cast<float>(skv))});
      safe_bias = w.value("Where", {fully_masked, w.scalar(0.f), bias});
    } else {
      std::vector<float> keep(static_cast<size_t>(sq), 1.f), safe = fixed;
      bool any = false;
      for (int64_t i = 0; i < sq; ++i) {
        const auto row = safe.begin() + i * skv;
        if (std::all_of(row, row + skv, [](float b) { return std::isinf(b); })) {
          keep[static_cast<size_t>(i)] = 0.f, any = true;
          std::fill(row, row + skv, 0.f);
        }
      }
      if (any) fully_masked = w.floats({sq, 1}, keep), safe_bias = w.floats({sq, skv}, safe);
    }
  }
  if (!safe_bias.empty()) scores = w.value("Add", {scores, safe_bias});
  onnx::NodeProto& softmax = w.add("Softmax", {scores});
  set_int(softmax, "axis", -1);
  std::string p = softmax.output(0);
  if (!fully_masked.empty())
    p = has_input(n, 3) ? w.value("Where", {fully_masked, w.scalar(0.f), p}) : w.value("Mul", {p, fully_masked});
  if (qk_out) {
    const std::string out = mode == 0 ? raw_scores : mode == 1 ? capped : mode == 3 ? p
                            : bias.empty() ? capped : w.value("Add", {capped, bias});
    w.add("Identity", {out}, n.output(3));
  }
  if (three_d) from_heads(w, w.value("MatMul", {p, v}), n.output(0));
  else w.add("MatMul", {p, v}, n.output(0));
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
