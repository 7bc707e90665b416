#include "onnx_import/attention_fusion.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "core/pipetrain_ops.h"

namespace pt {
namespace {

using Dims = std::vector<int64_t>;

// A Where's constant at or below this removes the key: exp(c + s - max) is 0 in float for any
// score s under 1e8 (masked_fill(-1e9), the samples' form, as well as -inf and float's lowest).
constexpr float kRemoved = -1e9f;

bool is_graph_output(const Graph& g, ValueId v) {
  return std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end();
}

const Node* producer(const Graph& g, ValueId v) {
  const int p = v == kNoValue ? -1 : g.value(v).producer;
  return p < 0 ? nullptr : &g.nodes[static_cast<size_t>(p)];
}

bool is_op(const Node* n, const char* op) { return n && n->domain.empty() && n->op_type == op; }

// v's one reader (v no graph output), or -1.
int lone_reader(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  return val.consumers.size() == 1 && !is_graph_output(g, v) ? val.consumers[0] : -1;
}

// The value of a float32 scalar constant (one element), or nullopt.
std::optional<float> scalar_constant(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  if (!val.init || val.type.dtype != DType::kFloat32 || val.type.numel() != 1) return std::nullopt;
  return val.init->as<float>()[0];
}

bool removes(float x) { return x <= kRemoved; }

// An Identity, or a Dropout as inference runs it (its input alone: autodiff/training_mode.h's
// dropout off and dropout_as_identity leave it so).
bool is_identity(const Node& n) {
  return n.domain.empty() && n.outputs.size() >= 1 && !n.inputs.empty() &&
         (n.op_type == "Identity" || (n.op_type == "Dropout" && n.inputs.size() == 1 &&
                                      (n.outputs.size() == 1 || n.outputs[1] == kNoValue)));
}

// Whether n scales each row of the probabilities p by one value: Where(C, 0, p) with C bool, or
// Mul(p, r) | Mul(r, p) with r float, C and r of last dimension 1 (they commute with the product
// by V: the same node after the fused one gives the same Y and gradients).
bool per_row(const Graph& g, const Node& n, ValueId p) {
  if (!n.domain.empty() || n.outputs.size() != 1 || !(g.value(n.outputs[0]).type == g.value(p).type)) return false;
  ValueId factor = kNoValue;
  if (n.op_type == "Where" && n.inputs.size() == 3 && n.inputs[2] == p && n.inputs[1] != p) {
    const auto zero = scalar_constant(g, n.inputs[1]);
    if (!zero || *zero != 0.f || g.value(n.inputs[0]).type.dtype != DType::kBool) return false;
    factor = n.inputs[0];
  } else if (n.op_type == "Mul" && n.inputs.size() == 2 && (n.inputs[0] == p) != (n.inputs[1] == p)) {
    factor = n.inputs[0] == p ? n.inputs[1] : n.inputs[0];
    if (g.value(factor).type.dtype != DType::kFloat32) return false;
  } else {
    return false;
  }
  const Dims& f = g.value(factor).type.shape;
  return !f.empty() && f.back() == 1 && f.size() <= 4;
}

// match_at's answer for a Softmax that is no attention's (describe_attention leaves it out).
constexpr const char* kNotScores = "not [B, H, S, T] float32 scores";

// One element-wise node between the scores' MatMul and the Softmax.
struct Link {
  enum class Kind { kScale, kAdd, kKeep, kDrop } kind = Kind::kScale;
  int node = -1;
  float factor = 1.f;        // kScale
  ValueId other = kNoValue;  // kAdd: the float mask; kKeep, kDrop: the bool condition
};

struct Match {
  int qk = -1, softmax = -1, nan_check = -1, nan_where = -1, pv = -1;
  std::vector<int> identities;  // Identity, or Dropout as inference runs it, between P and the MatMul
  int row_op = -1;  // Where(C, 0, P) or Mul(P, r), C and r one value per row: moved after the fused node
  ValueId row_in = kNoValue;  // the probabilities row_op reads
  ValueId q = kNoValue, kt = kNoValue, v = kNoValue;
  std::vector<Link> links;  // in the order they apply
};

// The parameter a value is computed from, or empty.
std::string parameter_upstream(const Graph& g, ValueId v) {
  std::vector<ValueId> stack = {v};
  std::set<ValueId> seen;
  while (!stack.empty()) {
    const ValueId x = stack.back();
    stack.pop_back();
    if (x == kNoValue || !seen.insert(x).second) continue;
    if (g.value(x).is_parameter()) return g.value(x).name;
    if (const Node* p = producer(g, x)) stack.insert(stack.end(), p->inputs.begin(), p->inputs.end());
  }
  return "";
}

// Whether x, read by node `reader` alone, is made by a MatMul through links (Mul, Div, Add, Where
// each read by the next alone): the scores' side of an Add whose other side is a mask.
bool leads_to_product(const Graph& g, ValueId x, int reader, int depth = 0) {
  if (depth > 8 || x == kNoValue || lone_reader(g, x) != reader) return false;
  const int at = g.value(x).producer;
  const Node* p = producer(g, x);
  if (is_op(p, "MatMul")) return true;
  if (!is_op(p, "Mul") && !is_op(p, "Div") && !is_op(p, "Add") && !is_op(p, "Where")) return false;
  for (ValueId in : p->inputs)
    if (leads_to_product(g, in, at, depth + 1)) return true;
  return false;
}

// The link that node n makes of `chain` (read by n alone), or a reason it is none.
std::optional<Link> link_of(const Graph& g, int index, ValueId* chain, std::string* why) {
  const Node& n = g.nodes[static_cast<size_t>(index)];
  Link l;
  l.node = index;
  if (!n.domain.empty() || n.inputs.size() < 2 || n.outputs.size() != 1) return std::nullopt;
  if (n.op_type == "Mul" || n.op_type == "Div") {
    for (size_t k = 0; k < 2; ++k) {
      const auto c = scalar_constant(g, n.inputs[1 - k]);
      if (!c || !(*c > 0.f) || (n.op_type == "Div" && k == 1)) continue;
      l.kind = Link::Kind::kScale;
      l.factor = n.op_type == "Mul" ? *c : 1.f / *c;
      *chain = n.inputs[k];
      return l;
    }
    *why = "its scores are scaled by " + n.label() + ", which is no positive scalar constant";
    return std::nullopt;
  }
  if (n.op_type == "Add") {
    for (size_t k = 0; k < 2; ++k) {  // the chain: the side the scores' MatMul makes
      if (!leads_to_product(g, n.inputs[k], index)) continue;
      l.kind = Link::Kind::kAdd;
      l.other = n.inputs[1 - k];
      *chain = n.inputs[k];
      if (g.value(l.other).type.dtype != DType::kFloat32) break;
      const std::string param = parameter_upstream(g, l.other);
      if (!param.empty()) {
        *why = "its mask is computed from parameter '" + param + "' (the fused op gives a mask no gradient)";
        return std::nullopt;
      }
      return l;
    }
    *why = "its scores go through " + n.label() + ", which adds no float mask";
    return std::nullopt;
  }
  if (n.op_type == "Where" && n.inputs.size() == 3 && g.value(n.inputs[0]).type.dtype == DType::kBool) {
    for (size_t k : {1, 2}) {
      const auto c = scalar_constant(g, n.inputs[3 - k]);
      if (!c || !removes(*c)) continue;
      l.kind = k == 1 ? Link::Kind::kKeep : Link::Kind::kDrop;
      l.other = n.inputs[0];
      *chain = n.inputs[k];
      return l;
    }
  }
  *why = "its scores go through " + n.label();
  return std::nullopt;
}

// The Softmax at `index` as the middle of an attention, or the reason it is not one we fuse.
std::string match_at(const Graph& g, int index, Match& m) {
  const Node& sm = g.nodes[static_cast<size_t>(index)];
  m.softmax = index;
  const TensorType& st = g.value(sm.inputs[0]).type;
  if (st.dtype != DType::kFloat32 || st.shape.size() != 4) return kNotScores;
  if (sm.attr_int("axis", -1) != -1 && sm.attr_int("axis", -1) != 3) return "its axis is not the last";
  // Probabilities -> P' -> MatMul(P', V)
  const ValueId p = sm.outputs[0];
  if (is_graph_output(g, p)) return "its probabilities are a graph output";
  const std::vector<int>& readers = g.value(p).consumers;
  ValueId probs = p;
  for (int r : readers) {
    const Node& n = g.nodes[static_cast<size_t>(r)];
    if ((is_op(&n, "Dropout") && !is_identity(n)) || n.op_type == "SeededDropout")
      return "its probabilities go through " + n.label() + " (attention dropout): the fused kernel has no dropout";
  }
  if (readers.size() == 2) {  // Where(IsNaN(P), 0, P)
    for (int r : readers) {
      const Node& n = g.nodes[static_cast<size_t>(r)];
      if (is_op(&n, "IsNaN")) m.nan_check = r;
      if (is_op(&n, "Where")) m.nan_where = r;
    }
    if (m.nan_check < 0 || m.nan_where < 0) return "its probabilities are read by another node";
    const Node& w = g.nodes[static_cast<size_t>(m.nan_where)];
    const auto zero = w.inputs.size() == 3 ? scalar_constant(g, w.inputs[1]) : std::nullopt;
    if (lone_reader(g, g.nodes[static_cast<size_t>(m.nan_check)].outputs[0]) != m.nan_where ||
        w.inputs[0] != g.nodes[static_cast<size_t>(m.nan_check)].outputs[0] || !zero || *zero != 0.f ||
        w.inputs[2] != p)
      return "its probabilities are read by another node";
    probs = w.outputs[0];
  } else if (readers.size() != 1) {
    return "its probabilities are read by another node";
  }
  for (int r = lone_reader(g, probs); r >= 0 && is_identity(g.nodes[static_cast<size_t>(r)]); r = lone_reader(g, probs)) {
    m.identities.push_back(r);  // dropout off: the identity
    probs = g.nodes[static_cast<size_t>(r)].outputs[0];
  }
  if (const int r = lone_reader(g, probs); r >= 0 && per_row(g, g.nodes[static_cast<size_t>(r)], probs)) {
    m.row_op = r;  // ONNX Attention's zeroed rows (onnx_import/fused_ops.cc)
    m.row_in = probs;
    probs = g.nodes[static_cast<size_t>(r)].outputs[0];
  }
  m.pv = lone_reader(g, probs);
  const Node* pv = m.pv < 0 ? nullptr : &g.nodes[static_cast<size_t>(m.pv)];
  if (pv && ((is_op(pv, "Dropout") && !is_identity(*pv)) || pv->op_type == "SeededDropout"))
    return "its probabilities go through " + pv->label() + " (attention dropout): the fused kernel has no dropout";
  if (!is_op(pv, "MatMul") || pv->inputs[0] != probs) return "its probabilities are read by another node";
  m.v = pv->inputs[1];
  // Softmax's input <- links <- MatMul(Q, Kt)
  ValueId x = sm.inputs[0];
  int reader = index;
  std::string why;
  for (;;) {
    if (lone_reader(g, x) != reader) return "its scores are read by another node";
    const int at = g.value(x).producer;
    if (at < 0) return "its scores are no node's output";
    if (is_op(&g.nodes[static_cast<size_t>(at)], "MatMul")) {
      m.qk = at;
      break;
    }
    ValueId chain = kNoValue;
    const auto l = link_of(g, at, &chain, &why);
    if (!l) return why.empty() ? "its scores come from " + g.nodes[static_cast<size_t>(at)].label() : why;
    m.links.insert(m.links.begin(), *l);
    x = chain;
    reader = at;
  }
  const Node& qk = g.nodes[static_cast<size_t>(m.qk)];
  m.q = qk.inputs[0];
  m.kt = qk.inputs[1];
  const Dims &qs = g.value(m.q).type.shape, &ks = g.value(m.kt).type.shape, &vs = g.value(m.v).type.shape;
  if (qs.size() != 4 || ks.size() != 4 || vs.size() != 4 || g.value(m.v).type.dtype != DType::kFloat32)
    return "Q, K or V is not a [B, H, ., .] float32 tensor";
  const Dims& s = st.shape;
  if (qs[0] != s[0] || qs[1] != s[1] || ks[0] != s[0] || ks[1] != s[1] || ks[2] != qs[3] || ks[3] != s[3] ||
      vs[0] != s[0] || vs[1] != s[1] || vs[2] != s[3])
    return "Q, K and V broadcast over batch or heads";
  bool float_mask = false;
  for (const Link& l : m.links) {
    if (l.kind == Link::Kind::kScale && float_mask) return "a float mask is scaled after it is added";
    if (l.kind == Link::Kind::kAdd) float_mask = true;
    if (l.kind != Link::Kind::kScale) {
      const auto b = broadcast_shapes({g.value(l.other).type.shape, s});
      if (!b || *b != s || g.value(l.other).type.shape.size() > 4) return "its mask does not broadcast to the scores";
    }
  }
  return "";
}

// A mask's value where import knows it: an initializer that training leaves unchanged (a constant,
// a buffer, one not floating point, or one read here only through Equal, a Cast to bool or Not,
// through which no gradient reaches it), or Slice, Equal, Cast, Not or Trilu of such values (the
// samples' causal mask, sliced from a float initializer and compared with 0). Values as doubles,
// row-major.
struct Known {
  Dims shape;
  std::vector<double> v;
};

constexpr int64_t kMaxKnown = int64_t{1} << 22;  // elements evaluated at most

std::optional<Known> known_value(const Graph& g, ValueId id, int depth = 0, bool no_gradient = false) {
  if (id == kNoValue || depth > 8) return std::nullopt;
  const Value& val = g.value(id);
  if (val.type.numel() > kMaxKnown) return std::nullopt;
  if (val.init) {
    if (is_floating(val.type.dtype) && !val.constant && !g.buffers.count(val.name) && !no_gradient)
      return std::nullopt;
    Known k{val.type.shape, std::vector<double>(static_cast<size_t>(val.type.numel()))};
    for (size_t i = 0; i < k.v.size(); ++i) {
      switch (val.type.dtype) {
        case DType::kFloat32: k.v[i] = val.init->as<float>()[i]; break;
        case DType::kBool: k.v[i] = val.init->as<bool>()[i]; break;
        case DType::kInt64: k.v[i] = static_cast<double>(val.init->as<int64_t>()[i]); break;
        default: return std::nullopt;
      }
    }
    return k;
  }
  const Node* n = producer(g, id);
  if (!n || !n->domain.empty() || n->inputs.empty()) return std::nullopt;
  const bool blocks = n->op_type == "Equal" || n->op_type == "Not" ||
                      (n->op_type == "Cast" && n->attr_int("to", 0) == static_cast<int64_t>(DType::kBool));
  auto x = known_value(g, n->inputs[0], depth + 1, no_gradient || blocks);
  if (!x) return std::nullopt;
  if (n->op_type == "Cast" || n->op_type == "Not") {
    const bool to_bool = n->op_type == "Not" || n->attr_int("to", 0) == static_cast<int64_t>(DType::kBool);
    for (double& e : x->v) e = n->op_type == "Not" ? (e == 0) : to_bool ? (e != 0) : e;
    return x;
  }
  if (n->op_type == "Equal" && n->inputs.size() == 2) {
    const auto y = known_value(g, n->inputs[1], depth + 1, true);
    if (!y || y->v.size() != 1) return std::nullopt;
    for (double& e : x->v) e = e == y->v[0];
    return x;
  }
  if (n->op_type == "Trilu") {  // over the last two axes; k (input 1) 0 unless given
    const auto kk = n->inputs.size() > 1 ? known_value(g, n->inputs[1], depth + 1) : std::optional<Known>();
    const int64_t k = kk && kk->v.size() == 1 ? static_cast<int64_t>(kk->v[0]) : 0;
    if (x->shape.size() < 2 || (n->inputs.size() > 1 && n->inputs[1] != kNoValue && !kk)) return std::nullopt;
    const int64_t rows = x->shape.end()[-2], cols = x->shape.end()[-1];
    const bool upper = n->attr_int("upper", 1) != 0;
    for (size_t at = 0; at < x->v.size(); ++at) {
      const int64_t i = static_cast<int64_t>(at) / cols % rows, j = static_cast<int64_t>(at) % cols;
      if (upper ? j - i < k : j - i > k) x->v[at] = 0;
    }
    return x;
  }
  if (n->op_type == "Slice" && n->inputs.size() >= 3) {
    const auto starts = known_value(g, n->inputs[1], depth + 1), ends = known_value(g, n->inputs[2], depth + 1);
    const auto axes = n->inputs.size() > 3 ? known_value(g, n->inputs[3], depth + 1) : std::optional<Known>();
    const auto steps = n->inputs.size() > 4 ? known_value(g, n->inputs[4], depth + 1) : std::optional<Known>();
    if (!starts || !ends || starts->v.size() != ends->v.size()) return std::nullopt;
    const int64_t rank = static_cast<int64_t>(x->shape.size());
    Dims lo(x->shape.size(), 0), out = x->shape;
    for (size_t a = 0; a < starts->v.size(); ++a) {
      int64_t axis = axes ? static_cast<int64_t>(axes->v.at(a)) : static_cast<int64_t>(a);
      if (axis < 0) axis += rank;
      if (axis < 0 || axis >= rank || (steps && steps->v.at(a) != 1)) return std::nullopt;
      const int64_t dim = x->shape[static_cast<size_t>(axis)];
      const auto clamp = [&](double e) {
        const int64_t i = e < -9e18 ? 0 : e > 9e18 ? dim : static_cast<int64_t>(e);
        return std::clamp<int64_t>(i < 0 ? i + dim : i, 0, dim);
      };
      lo[static_cast<size_t>(axis)] = clamp(starts->v[a]);
      out[static_cast<size_t>(axis)] = std::max<int64_t>(0, clamp(ends->v[a]) - lo[static_cast<size_t>(axis)]);
    }
    if (out != g.value(id).type.shape) return std::nullopt;
    Known y{out, std::vector<double>(static_cast<size_t>(g.value(id).type.numel()))};
    for (size_t at = 0; at < y.v.size(); ++at) {  // out index -> x index, axis by axis
      int64_t rest = static_cast<int64_t>(at), from = 0, stride = 1;
      for (int64_t d = rank - 1; d >= 0; --d) {
        const int64_t i = rest % out[static_cast<size_t>(d)];
        rest /= out[static_cast<size_t>(d)];
        from += (i + lo[static_cast<size_t>(d)]) * stride;
        stride *= x->shape[static_cast<size_t>(d)];
      }
      y.v[at] = x->v[static_cast<size_t>(from)];
    }
    return y;
  }
  return std::nullopt;
}

// Grouped-query heads as exporters repeat them (transformers' repeat_kv, torch's SDPA decomposition
// with enable_gqa): X [B, Hkv, T, D] made [B, Hkv, 1, T, D] (Unsqueeze or Reshape), Expanded to
// [B, Hkv, G, T, D], then read through Reshapes that merge or split the leading dims and keep the
// last two, Transposes of the last two, Identities and scalar Muls or Divs (the sqrt-scale of K), to the
// [B, H, ., .] operand of an attention product (H = Hkv G: head h reads kv head h / G, the fused
// op's rule). Each node read by the next alone, every shape static.
struct Repeat {
  ValueId source = kNoValue;  // X [B, Hkv, T, D]
  bool swapped = false;       // the operand is X's last two dims transposed
  float factor = 1.f;         // the scalar Muls' and Divs' product
  std::vector<int> nodes;     // the chain, from the operand's producer back to the Unsqueeze
};

// The product of all but the last two dims.
int64_t leading(const Dims& d) {
  return std::accumulate(d.begin(), d.end() - 2, int64_t{1}, std::multiplies<int64_t>());
}

std::optional<Repeat> repeated_heads(const Graph& g, ValueId operand, int reader) {
  Repeat r;
  ValueId v = operand;
  for (int steps = 0; steps < 16; ++steps) {
    if (lone_reader(g, v) != reader) return std::nullopt;
    const int at = g.value(v).producer;
    if (at < 0) return std::nullopt;
    const Node& n = g.nodes[static_cast<size_t>(at)];
    const Dims& out = g.value(v).type.shape;
    r.nodes.push_back(at);
    reader = at;
    if ((is_op(&n, "Mul") || is_op(&n, "Div")) && n.inputs.size() == 2) {
      const bool first = n.op_type == "Mul" && scalar_constant(g, n.inputs[0]).has_value();
      const auto c = scalar_constant(g, n.inputs[first ? 0 : 1]);
      if (!c || *c <= 0.f) return std::nullopt;
      r.factor *= n.op_type == "Div" ? 1.f / *c : *c;
      v = n.inputs[first ? 1 : 0];
      if (!(g.value(v).type.shape == out)) return std::nullopt;
      continue;
    }
    if (is_op(&n, "Identity")) {
      v = n.inputs[0];
      continue;
    }
    if (is_op(&n, "Transpose")) {
      if (out.size() < 2) return std::nullopt;
      Dims swap(out.size());  // the last two dims exchanged
      std::iota(swap.begin(), swap.end(), int64_t{0});
      std::swap(swap.end()[-2], swap.back());
      if (n.attr_ints("perm") != swap) return std::nullopt;
      r.swapped = !r.swapped;
      v = n.inputs[0];
      continue;
    }
    if (is_op(&n, "Reshape")) {
      const Dims& in = g.value(n.inputs[0]).type.shape;
      if (in.size() < 3 || out.size() < 3 || in.end()[-1] != out.end()[-1] || in.end()[-2] != out.end()[-2] ||
          leading(in) != leading(out))
        return std::nullopt;
      v = n.inputs[0];
      continue;
    }
    if (!is_op(&n, "Expand") || out.size() != 5) return std::nullopt;
    // The repeat: [B, Hkv, 1, T, D] expanded along its third dim.
    const ValueId u = n.inputs[0];
    const Dims& one = g.value(u).type.shape;
    if (one.size() != 5 || one[2] != 1 || one[0] != out[0] || one[1] != out[1] || one[3] != out[3] ||
        one[4] != out[4] || lone_reader(g, u) != at)
      return std::nullopt;
    const int up = g.value(u).producer;
    if (up < 0 || !(is_op(&g.nodes[static_cast<size_t>(up)], "Unsqueeze") ||
                    is_op(&g.nodes[static_cast<size_t>(up)], "Reshape")))
      return std::nullopt;
    r.source = g.nodes[static_cast<size_t>(up)].inputs[0];
    const Dims& x = g.value(r.source).type.shape;
    if (x != Dims{one[0], one[1], one[3], one[4]}) return std::nullopt;
    r.nodes.push_back(up);
    // The operand: [B, H, ., .] with H = Hkv G.
    const Dims& o = g.value(operand).type.shape;
    if (o.size() != 4 || o[0] != x[0] || o[1] != x[1] * out[2]) return std::nullopt;
    return r;
  }
  return std::nullopt;
}

// Builds the fused graph's new nodes for one match: each replaces a node of the match at its
// place (the masks' combinations at their links', K's transpose at the first MatMul's), so the
// order stays topological.
class Rewriter {
 public:
  Rewriter(Graph& g, std::vector<bool>& gone) : g_(g), gone_(gone) {}

  // Returns whether the fused node reads a mask.
  bool rewrite(const Match& m) {
    const std::string base = g_.nodes[static_cast<size_t>(m.pv)].name;
    float scale = 1.f;
    for (const Link& l : m.links) {
      if (l.kind == Link::Kind::kScale) {
        scale *= l.factor;
        gone_[static_cast<size_t>(l.node)] = true;
      } else {
        combine(l, base);
      }
    }
    for (int i : {m.softmax, m.nan_check, m.nan_where})
      if (i >= 0) gone_[static_cast<size_t>(i)] = true;
    for (int i : m.identities) gone_[static_cast<size_t>(i)] = true;
    bool causal = false;
    if (mask_ != kNoValue) causal = constant_causal(m, &mask_);
    // Grouped-query K and V read as they are, not repeated per head (the fused op takes Hkv heads):
    // both or neither, so that they keep one head count.
    const std::optional<Repeat> rk = repeated_heads(g_, m.kt, m.qk), rv = repeated_heads(g_, m.v, m.pv);
    const bool grouped = rk && rv && rk->swapped && !rv->swapped && rv->factor == 1.f &&
                         g_.value(rk->source).type.shape[1] == g_.value(rv->source).type.shape[1];
    ValueId k = kNoValue, v = m.v;
    if (grouped) {
      for (const Repeat* r : {&*rk, &*rv})
        for (int i : r->nodes) gone_[static_cast<size_t>(i)] = true;
      gone_[static_cast<size_t>(m.qk)] = true;
      k = rk->source, v = rv->source;
      scale *= rk->factor;
    } else {
      k = transposed_keys(m, base);
    }
    const Node& pv = g_.nodes[static_cast<size_t>(m.pv)];
    Node fused{pv.name, "FusedAttention", kPipetrainDomain, {m.q, k, v}, {pv.outputs[0]},
               {{"scale", scale}, {"causal", int64_t{causal ? 1 : 0}}}};
    if (mask_ != kNoValue) fused.inputs.push_back(mask_);
    if (m.row_op >= 0) {  // Y = row_op(FusedAttention(...)), the row op moved after the product
      Node row = g_.nodes[static_cast<size_t>(m.row_op)];
      const ValueId y = g_.add_value(fresh(base + "/rows"), g_.value(fused.outputs[0]).type);
      for (ValueId& in : row.inputs)
        if (in == m.row_in) in = y;
      row.outputs = fused.outputs;
      fused.outputs = {y};
      gone_[static_cast<size_t>(m.row_op)] = true;
      after_[m.pv].push_back(std::move(row));
    }
    g_.nodes[static_cast<size_t>(m.pv)] = std::move(fused);
    return mask_ != kNoValue;
  }

  // Nodes to insert after a node index (the row ops), for fuse_attention's final order.
  std::map<int, std::vector<Node>>& after() { return after_; }
  // The masks the causal flag replaced (constant_causal).
  const std::vector<ValueId>& dropped() const { return dropped_; }

 private:
  std::string fresh(const std::string& stem) {
    std::string name = stem;
    for (int k = 1; g_.find(name) != kNoValue; ++k) name = stem + "." + std::to_string(k);
    return name;
  }

  ValueId scalar(float v, DType dt) {
    Tensor t{TensorType{dt, {}}, std::vector<std::byte>(dtype_size(dt))};
    if (dt == DType::kFloat32) std::memcpy(t.data.data(), &v, sizeof v);
    return g_.add_initializer(fresh("attention_fusion/constant"), std::move(t), true);
  }

  // The link's node made the node that folds its mask into mask_ (or dropped, for the first).
  void combine(const Link& l, const std::string& base) {
    Node& slot = g_.nodes[static_cast<size_t>(l.node)];
    const bool keep = l.kind == Link::Kind::kKeep, add = l.kind == Link::Kind::kAdd;
    if (mask_ == kNoValue && (add || keep)) {
      mask_ = l.other;
      gone_[static_cast<size_t>(l.node)] = true;
      return;
    }
    const ValueId minus_inf = scalar(-std::numeric_limits<float>::infinity(), DType::kFloat32);
    const bool had_bool = mask_ != kNoValue && g_.value(mask_).type.dtype == DType::kBool;
    Node n{slot.name, "", "", {}, {}, {}};
    if (mask_ == kNoValue) {  // kDrop first: Not(C)
      n.op_type = "Not", n.inputs = {l.other};
    } else if (add) {
      n.op_type = had_bool ? "Where" : "Add";
      n.inputs = had_bool ? std::vector<ValueId>{mask_, l.other, minus_inf} : std::vector<ValueId>{mask_, l.other};
    } else if (keep) {
      n.op_type = had_bool ? "And" : "Where";
      n.inputs = had_bool ? std::vector<ValueId>{mask_, l.other} : std::vector<ValueId>{l.other, mask_, minus_inf};
    } else {  // kDrop: removed where C
      n.op_type = "Where";
      n.inputs = {l.other, had_bool ? scalar(0.f, DType::kBool) : minus_inf, mask_};
    }
    const bool is_bool = (mask_ == kNoValue || had_bool) && !add;
    Dims shape = g_.value(l.other).type.shape;
    if (mask_ != kNoValue) shape = *broadcast_shapes({shape, g_.value(mask_).type.shape});
    mask_ = g_.add_value(fresh(base + "/mask"), TensorType{is_bool ? DType::kBool : DType::kFloat32, shape});
    n.outputs = {mask_};
    g_.value(mask_).producer = l.node;  // for known_value, before rebuild_uses
    slot = std::move(n);
  }

  // Whether the mask, its value known (known_value), removes every key after its query (then
  // causal); where it removes nothing else, *mask becomes kNoValue and the mask is listed in
  // dropped() (fuse_attention removes the nodes that computed it for this node alone).
  bool constant_causal(const Match& m, ValueId* mask) {
    const Value& v = g_.value(*mask);
    const Dims& s = g_.value(g_.nodes[static_cast<size_t>(m.softmax)].inputs[0]).type.shape;
    if (v.type.shape.size() < 2 || v.type.shape.end()[-2] != s[2] || v.type.shape.end()[-1] != s[3]) return false;
    const auto known = known_value(g_, *mask);
    if (!known) return false;
    const bool is_bool = v.type.dtype == DType::kBool;
    const int64_t rows = s[2], cols = s[3], planes = v.type.numel() / (rows * cols);
    bool after_removed = true, rest_zero = true;
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t at = (p * rows + i) * cols + j;
          const double e = known->v[static_cast<size_t>(at)];
          const bool gone = is_bool ? e == 0 : removes(static_cast<float>(e));
          const bool zero = is_bool ? !gone : e == 0;
          if (j > i) after_removed = after_removed && gone;
          else rest_zero = rest_zero && zero;
        }
    if (!after_removed) return false;
    if (rest_zero) {
      dropped_.push_back(*mask);
      *mask = kNoValue;
    }
    return true;
  }

  // K [B, H, T, D] from Kt [B, H, D, T]: one Transpose at the first MatMul's place, composed with
  // Kt's own Transpose where the MatMul alone reads it (none where they cancel).
  ValueId transposed_keys(const Match& m, const std::string& base) {
    const Node& qk = g_.nodes[static_cast<size_t>(m.qk)];
    ValueId src = m.kt;
    Dims perm = {0, 1, 3, 2};
    const int t = g_.value(m.kt).producer;
    if (t >= 0 && is_op(&g_.nodes[static_cast<size_t>(t)], "Transpose") && lone_reader(g_, m.kt) == m.qk) {
      const Node& tn = g_.nodes[static_cast<size_t>(t)];
      const Dims p = tn.attr_ints("perm");
      if (p.size() == 4) {
        src = tn.inputs[0];
        perm = {p[0], p[1], p[3], p[2]};
        gone_[static_cast<size_t>(t)] = true;
      }
    }
    if (perm == Dims{0, 1, 2, 3}) {
      gone_[static_cast<size_t>(m.qk)] = true;
      return src;
    }
    const Dims& ss = g_.value(src).type.shape;
    Dims shape;
    for (int64_t d : perm) shape.push_back(ss[static_cast<size_t>(d)]);
    const ValueId k = g_.add_value(fresh(base + "/K"), TensorType{DType::kFloat32, shape});
    g_.nodes[static_cast<size_t>(m.qk)] = Node{qk.name, "Transpose", "", {src}, {k}, {{"perm", perm}}};
    return k;
  }

  Graph& g_;
  std::vector<bool>& gone_;
  ValueId mask_ = kNoValue;
  std::vector<ValueId> dropped_;
  std::map<int, std::vector<Node>> after_;
};

// The keys of a match: the last dim of K transposed, [B, H, D, T].
int64_t keys_of(const Graph& g, const Match& m) { return g.value(m.kt).type.shape.back(); }

// Removes the nodes that computed only masks the fusion dropped: walking up from each, a producer
// goes when nothing but removed nodes reads its outputs and none is a graph output (uses rebuilt).
void prune_dropped_masks(Graph& g, const std::vector<ValueId>& dropped) {
  std::vector<bool> gone(g.nodes.size(), false);
  std::vector<ValueId> todo = dropped;
  bool any = false;
  while (!todo.empty()) {
    const int p = g.value(todo.back()).producer;
    todo.pop_back();
    if (p < 0 || gone[static_cast<size_t>(p)]) continue;
    const Node& n = g.nodes[static_cast<size_t>(p)];
    bool unread = true;
    for (ValueId o : n.outputs) {
      if (o == kNoValue) continue;
      if (is_graph_output(g, o)) unread = false;
      for (int c : g.value(o).consumers) unread = unread && gone[static_cast<size_t>(c)];
    }
    if (!unread) continue;
    gone[static_cast<size_t>(p)] = any = true;
    for (ValueId in : n.inputs)
      if (in != kNoValue) todo.push_back(in);
  }
  if (!any) return;
  std::vector<Node> nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!gone[i]) nodes.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(nodes);
  g.rebuild_uses();
}

// fuse_attention's work: every match but those whose second MatMul's index is in `leave`; where
// `masked` is given, it receives the indices of the matches whose fused node reads a mask.
int fuse(Graph& g, int64_t min_keys, const std::set<int>& leave, std::set<int>* masked) {
  std::vector<bool> gone(g.nodes.size(), false);
  std::vector<Match> matches;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Match m;
    if (is_op(&g.nodes[i], "Softmax") && match_at(g, static_cast<int>(i), m).empty() && keys_of(g, m) >= min_keys &&
        !leave.count(m.pv))
      matches.push_back(m);
  }
  std::map<int, std::vector<Node>> after;
  std::vector<ValueId> dropped;
  for (const Match& m : matches) {
    Rewriter r(g, gone);
    if (r.rewrite(m) && masked) masked->insert(m.pv);
    for (auto& [i, nodes] : r.after()) after[i] = std::move(nodes);
    dropped.insert(dropped.end(), r.dropped().begin(), r.dropped().end());
  }
  if (matches.empty()) return 0;
  g.opsets[kPipetrainDomain] = std::max<int64_t>(g.opsets[kPipetrainDomain], 1);
  std::vector<Node> nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!gone[i]) nodes.push_back(std::move(g.nodes[i]));
    if (auto it = after.find(static_cast<int>(i)); it != after.end())
      for (Node& n : it->second) nodes.push_back(std::move(n));
  }
  g.nodes = std::move(nodes);
  g.rebuild_uses();
  prune_dropped_masks(g, dropped);
  std::vector<ValueId> initializers;  // the scalars and masks only the removed nodes read leave
  for (ValueId v : g.initializers) {
    if (!g.value(v).consumers.empty() || is_graph_output(g, v)) initializers.push_back(v);
    else g.buffers.erase(g.value(v).name);
  }
  g.initializers = std::move(initializers);
  return static_cast<int>(matches.size());
}

}  // namespace

int fuse_attention(Graph& g, int64_t min_keys, bool masked) {
  // Without masks: the matches that read one after a trial fusion of a copy (initializers shared;
  // node indices are the same until a fusion rewrites them) are left.
  std::set<int> leave;
  if (!masked) {
    Graph trial = g;
    fuse(trial, min_keys, {}, &leave);
  }
  return fuse(g, min_keys, leave, nullptr);
}

std::vector<std::string> describe_attention(const Graph& g, int64_t min_keys) {
  std::vector<std::string> out;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.domain == kPipetrainDomain && n.op_type == "FusedAttention") {
      std::string line = "fused: " + n.label() + " (scale " + std::to_string(n.attr_float("scale", 1.f));
      if (n.attr_int("causal", 0)) line += ", causal";
      const int64_t heads = g.value(n.inputs[0]).type.shape[1], kv = g.value(n.inputs[1]).type.shape[1];
      if (kv != heads)
        line += ", " + std::to_string(heads) + " heads on " + std::to_string(kv) + " K/V head" + (kv > 1 ? "s" : "");
      if (n.inputs.size() > 3 && n.inputs[3] != kNoValue) line += ", mask " + g.value(n.inputs[3]).type.str();
      out.push_back(line + ")");
    } else if (is_op(&n, "Softmax")) {
      Match m;
      const std::string why = match_at(g, static_cast<int>(i), m);
      if (!why.empty() && why != kNotScores) out.push_back("unfused: " + n.label() + ": " + why);
      else if (why.empty() && keys_of(g, m) < min_keys)
        out.push_back("unfused: " + n.label() + ": " + std::to_string(keys_of(g, m)) + " keys, fewer than " +
                      std::to_string(min_keys) + ", where the unfused products run faster (--fuse-attention-from sets the bound)");
    }
  }
  return out;
}

}  // namespace pt
