#include "onnx_import/random_rewrite.h"

#include <algorithm>
#include <optional>
#include <set>
#include <vector>

#include "core/error.h"
#include "onnx_import/load.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

float attr_float(const onnx::NodeProto& n, const std::string& name, float fallback) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.f();
  return fallback;
}

std::optional<int64_t> attr_int(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return std::nullopt;
}

// The value of a float scalar (any rank, one element) that folding made or that the file holds
// as an initializer (import keeps float initializers out of `constants`: most are parameters),
// if `name` is one.
std::optional<double> constant_scalar(const onnx::GraphProto& g,
                                      const std::map<std::string, Tensor>& constants,
                                      const std::string& name, const std::string& path) {
  std::optional<Tensor> held;
  if (auto it = constants.find(name); it != constants.end()) held = it->second;
  for (int i = 0; !held && i < g.initializer_size(); ++i)
    if (g.initializer(i).name() == name) held = tensor_from_proto(g.initializer(i), path);
  if (!held || held->type.numel() != 1) return std::nullopt;
  if (held->type.dtype == DType::kFloat32) return held->as<float>()[0];
  if (held->type.dtype == DType::kFloat64) return held->as<double>()[0];
  return std::nullopt;
}

// The nodes reading each value.
std::map<std::string, std::vector<int>> readers_of(const onnx::GraphProto& g) {
  std::map<std::string, std::vector<int>> out;
  for (int i = 0; i < g.node_size(); ++i)
    for (const auto& in : g.node(i).input())
      if (!in.empty()) out[in].push_back(i);
  return out;
}

bool is_plain(const onnx::NodeProto& n, const char* op) {
  return (n.domain().empty() || n.domain() == "ai.onnx") && n.op_type() == op;
}

// One matched chain: node indices and what the Bernoulli replacing them needs.
struct Chain {
  int draw = -1, compare = -1, cast = -1;
  double chance = 0;  // that the comparison holds
  DType out = DType::kUndefined;
  std::vector<int64_t> shape;
};

// The chance that compare(R, p) holds (R on the left when `r_left`) for R ~ U[low, high).
std::optional<double> chance_of(const std::string& op, bool r_left, double p, double low,
                                double high) {
  if (!(high > low)) return std::nullopt;
  const double below = std::clamp((p - low) / (high - low), 0.0, 1.0);  // P(R < p)
  const bool r_less = op == "Less" || op == "LessOrEqual";
  const bool r_greater = op == "Greater" || op == "GreaterOrEqual";
  if (!r_less && !r_greater) return std::nullopt;
  return r_less == r_left ? below : 1.0 - below;
}

std::optional<Chain> match(const onnx::GraphProto& g, int draw,
                           const std::map<std::string, std::vector<int>>& readers,
                           const std::map<std::string, TensorType>& types,
                           const std::map<std::string, Tensor>& constants,
                           const std::string& path) {
  const onnx::NodeProto& r = g.node(draw);
  const auto shaped = types.find(r.input(0));
  if (r.output_size() != 1 || shaped == types.end()) return std::nullopt;
  const auto only_reader = [&](const std::string& v) -> int {
    auto it = readers.find(v);
    bool is_output = false;
    for (const auto& o : g.output()) is_output = is_output || o.name() == v;
    return it == readers.end() || it->second.size() != 1 || is_output ? -1 : it->second[0];
  };
  Chain c;
  c.draw = draw;
  c.shape = shaped->second.shape;
  c.compare = only_reader(r.output(0));
  if (c.compare < 0) return std::nullopt;
  const onnx::NodeProto& cmp = g.node(c.compare);
  if (cmp.input_size() != 2 || !(cmp.domain().empty() || cmp.domain() == "ai.onnx"))
    return std::nullopt;
  const bool r_left = cmp.input(0) == r.output(0);
  const std::optional<double> p = constant_scalar(g, constants, cmp.input(r_left ? 1 : 0), path);
  if (!p) return std::nullopt;
  const std::optional<double> q = chance_of(cmp.op_type(), r_left, *p, attr_float(r, "low", 0.0f),
                                            attr_float(r, "high", 1.0f));
  if (!q) return std::nullopt;
  c.chance = *q;
  c.cast = only_reader(cmp.output(0));
  if (c.cast < 0) return std::nullopt;
  const onnx::NodeProto& cast = g.node(c.cast);
  if (is_plain(cast, "Cast") && cast.input_size() == 1) {
    c.out = static_cast<DType>(attr_int(cast, "to").value_or(0));
  } else if (is_plain(cast, "CastLike") && cast.input_size() == 2 && cast.input(0) == cmp.output(0)) {
    auto ref = types.find(cast.input(1));
    if (ref == types.end()) return std::nullopt;
    c.out = ref->second.dtype;
  } else {
    return std::nullopt;
  }
  if (!is_floating(c.out)) return std::nullopt;
  return c;
}

// M = Bernoulli(P) {dtype}, P an initializer of the draw's shape filled with the chance.
onnx::NodeProto bernoulli(const onnx::GraphProto& g, const Chain& c, onnx::GraphProto* out_g,
                          std::map<std::string, TensorType>* types,
                          std::map<std::string, Tensor>* constants) {
  const onnx::NodeProto& r = g.node(c.draw);
  Tensor p;
  p.type = TensorType{DType::kFloat32, c.shape};
  p.data.resize(static_cast<size_t>(p.type.bytes()));
  std::fill_n(p.as<float>(), p.type.numel(), static_cast<float>(c.chance));
  const std::string name = r.name() + "/probability";
  tensor_to_proto(p, name, out_g->add_initializer());
  (*types)[name] = p.type;
  (*constants)[name] = std::move(p);
  onnx::NodeProto b;
  b.set_name(r.name());
  b.set_op_type("Bernoulli");
  b.add_input(name);
  b.add_output(g.node(c.cast).output(0));
  auto* dtype = b.add_attribute();
  dtype->set_name("dtype");
  dtype->set_type(onnx::AttributeProto::INT);
  dtype->set_i(static_cast<int64_t>(c.out));
  return b;
}

// Drops the nodes that computed only the shape tensors of the draws just removed (the
// default exporter's Expand(0.0, shape), which folding keeps as its 0.0 is a float initializer).
void drop_dead_feeders(onnx::GraphProto* g, std::vector<std::string> feeders) {
  std::set<std::string> outputs;
  for (const auto& o : g->output()) outputs.insert(o.name());
  while (!feeders.empty()) {
    const std::string v = feeders.back();
    feeders.pop_back();
    const auto readers = readers_of(*g);
    if (readers.count(v) || outputs.count(v)) continue;
    for (int i = 0; i < g->node_size(); ++i) {
      const onnx::NodeProto& n = g->node(i);
      if (n.output_size() != 1 || n.output(0) != v) continue;
      for (const auto& in : n.input())
        if (!in.empty()) feeders.push_back(in);
      g->mutable_node()->DeleteSubrange(i, 1);
      break;
    }
  }
}

}  // namespace

int rewrite_uniform_draws(onnx::GraphProto* g, std::map<std::string, TensorType>* types,
                          std::map<std::string, Tensor>* constants, const std::string& path) {
  const auto readers = readers_of(*g);
  std::vector<Chain> chains;
  for (int i = 0; i < g->node_size(); ++i)
    if (is_plain(g->node(i), "RandomUniformLike"))
      if (auto c = match(*g, i, readers, *types, *constants, path)) chains.push_back(*c);
  if (chains.empty()) return 0;
  std::set<int> dropped;
  std::map<int, onnx::NodeProto> replaced;  // at the cast's place: after everything M reads
  std::vector<std::string> feeders;
  for (const Chain& c : chains) {
    feeders.push_back(g->node(c.draw).input(0));
    dropped.insert(c.draw);
    dropped.insert(c.compare);
    replaced[c.cast] = bernoulli(*g, c, g, types, constants);
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  for (int i = 0; i < g->node_size(); ++i) {
    if (auto it = replaced.find(i); it != replaced.end())
      *kept.Add() = std::move(it->second);
    else if (!dropped.count(i))
      *kept.Add() = std::move(*g->mutable_node(i));
  }
  g->mutable_node()->Swap(&kept);
  drop_dead_feeders(g, feeders);
  return static_cast<int>(chains.size());
}

void check_uniform_draws_rewritten(const onnx::GraphProto& g, const std::string& path,
                                   int64_t opset) {
  for (const auto& n : g.node())
    if (is_plain(n, "RandomUniformLike"))
      throw UserError(node_where(path, n, opset),
                      "draws uniform values that are not a Bernoulli mask (compared with a "
                      "constant scalar, the comparison cast to a float type)",
                      "export the model in eval mode, or draw the mask in the exporting script");
}

}  // namespace pt
