#include "autodiff/backward.h"

#include <algorithm>
#include <functional>
#include <cstring>
#include <map>
#include <set>

#include "autodiff/grad_context.h"
#include "core/error.h"
#include "partition/cost_model.h"

namespace pt {

std::string grad_name(const std::string& value) { return "grad." + value; }
std::string grad_acc_name(const std::string& param) { return "grad_acc." + param; }

bool adds_into_accumulator(const Graph& w, ValueId out, const std::string& param) {
  const ValueId acc = w.find(grad_acc_name(param));
  const int last = w.value(out).producer;
  if (acc == kNoValue || last < 0) return false;
  const Node& add = w.nodes[static_cast<size_t>(last)];
  return add.op_type == "Add" && add.domain.empty() && add.inputs.size() == 2 && add.inputs[0] == acc &&
         add.inputs[1] != acc && w.value(acc).consumers.size() == 1;
}
std::string next_grad_name(const std::string& value) { return grad_name(value) + "@next"; }

namespace {

// The work graph: the chunk's forward nodes, plus backward nodes kept in their own list. Both
// share one value table, so backward nodes read forward tensors directly.
struct Work {
  Graph g;
  std::vector<Node> bwd;
  std::set<ValueId> bwd_values;  // values made by backward nodes or fed to B as gradients
  std::map<ValueId, std::vector<ValueId>> contributions;  // forward value -> its gradient parts
  int counter = 0;

  ValueId append(const std::string& op, std::vector<ValueId> inputs, const TensorType& type,
                 const std::string& out_name = "") {
    Node n;
    n.name = "bwd/" + op + "." + std::to_string(counter++);
    n.op_type = op;
    n.inputs = std::move(inputs);
    const ValueId v = g.add_value(out_name.empty() ? n.name + ".out" : out_name, type);
    n.outputs = {v};
    bwd.push_back(std::move(n));
    bwd_values.insert(v);
    return v;
  }

  // The gradient of forward value v: its parts summed in the order they arrived (kNoValue if
  // none arrived).
  ValueId total(ValueId v) {
    auto it = contributions.find(v);
    if (it == contributions.end() || it->second.empty()) return kNoValue;
    std::vector<ValueId>& parts = it->second;
    ValueId sum = parts[0];
    for (size_t k = 1; k < parts.size(); ++k) sum = append("Add", {sum, parts[k]}, g.value(v).type);
    parts = {sum};
    return sum;
  }

  ValueId constant(Tensor t) {
    const ValueId v = g.add_initializer("bwd/const." + std::to_string(counter++), std::move(t), true);
    bwd_values.insert(v);
    return v;
  }

  // Zeros of type t: a scalar 0 expanded (the gradient of an input no output depends on).
  ValueId zeros(TensorType t) {
    Tensor zero;
    zero.type = TensorType{t.dtype, {}};
    zero.data.resize(dtype_size(t.dtype));
    Tensor shape;
    shape.type = TensorType{DType::kInt64, {static_cast<int64_t>(t.shape.size())}};
    shape.data.resize(t.shape.size() * sizeof(int64_t));
    if (!t.shape.empty()) std::memcpy(shape.data.data(), t.shape.data(), shape.data.size());
    return append("Expand", {constant(std::move(zero)), constant(std::move(shape))}, t);
  }

  bool is_forward_activation(ValueId v) const {
    return v != kNoValue && !bwd_values.count(v) && !g.value(v).is_initializer();
  }
};

// Runs every rule, last forward node first, so that each node sees its outputs' whole gradient.
void differentiate(Work& w, const std::vector<bool>& needs) {
  for (int i = static_cast<int>(w.g.nodes.size()) - 1; i >= 0; --i) {
    const Node node = w.g.nodes[static_cast<size_t>(i)];
    std::vector<ValueId> dys;
    bool any_dy = false;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const ValueId o = node.outputs[k];
      dys.push_back(o != kNoValue && output_differentiable(node, k) ? w.total(o) : kNoValue);
      any_dy = any_dy || dys.back() != kNoValue;
    }
    std::vector<bool> wants;
    bool any_want = false;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const ValueId v = node.inputs[k];
      wants.push_back(v != kNoValue && static_cast<size_t>(v) < needs.size() &&
                      needs[static_cast<size_t>(v)] && input_differentiable(node, k));
      any_want = any_want || wants.back();
    }
    if (!any_dy || !any_want) continue;
    const GradRule rule = find_grad_rule(node.domain, node.op_type);
    if (!rule)
      throw UserError(node.label(), "has no gradient rule",
                      "freeze the parameters that feed it, or ask for the op to be supported");
    const size_t before = w.bwd.size();
    GradContext ctx(w.g, i, w.bwd, dys, wants, &w.counter);
    rule(ctx);
    for (size_t k = before; k < w.bwd.size(); ++k)
      for (ValueId o : w.bwd[k].outputs)
        if (o != kNoValue) w.bwd_values.insert(o);
    for (size_t k = 0; k < node.inputs.size(); ++k)
      if (ctx.given()[k] != kNoValue) w.contributions[node.inputs[k]].push_back(ctx.given()[k]);
  }
}

// Gives the value the name `name`: renames a fresh backward value, else copies it with Identity.
ValueId name_result(Work& w, ValueId v, const std::string& name, std::set<ValueId>* named) {
  const bool fresh = w.bwd_values.count(v) && !named->count(v) &&
                     w.g.value(v).name.rfind("grad.", 0) != 0 && !w.g.value(v).is_initializer();
  if (!fresh) v = w.append("Identity", {v}, w.g.value(v).type, name);
  else w.g.value(v).name = name;
  named->insert(v);
  return v;
}

// Marks the backward nodes that some value in `targets` depends on (skipping `exclude`).
std::vector<char> ancestors(const Work& w, const std::vector<ValueId>& targets,
                            const std::vector<char>& exclude) {
  std::set<ValueId> wanted(targets.begin(), targets.end());
  std::vector<char> in(w.bwd.size(), 0);
  for (int k = static_cast<int>(w.bwd.size()) - 1; k >= 0; --k) {
    const Node& n = w.bwd[static_cast<size_t>(k)];
    if (exclude[static_cast<size_t>(k)]) continue;
    bool hit = false;
    for (ValueId o : n.outputs) hit = hit || (o != kNoValue && wanted.count(o));
    if (!hit) continue;
    in[static_cast<size_t>(k)] = 1;
    for (ValueId v : n.inputs)
      if (v != kNoValue) wanted.insert(v);
  }
  return in;
}

std::vector<std::string> names_of(const Graph& g, const std::vector<ValueId>& ids) {
  std::vector<std::string> out;
  for (ValueId v : ids) out.push_back(g.value(v).name);
  return out;
}

// W's accumulating Adds (grad.<p> = grad_acc.<p> + g, outputs in `targets`) each moved to just
// after the node that makes its g, where the differentiation appended them all at the end: a
// parameter's gradient is then added as soon as it is computed, and the program's arena holds
// one g at a time instead of every parameter's (the same Adds of the same tensors: the same bits).
std::vector<Node> add_as_soon_as_made(std::vector<Node> nodes, const std::vector<ValueId>& targets) {
  const std::set<ValueId> sums(targets.begin(), targets.end());
  std::vector<Node> adds, rest;
  for (Node& n : nodes)
    (n.outputs.size() == 1 && sums.count(n.outputs[0]) ? adds : rest).push_back(std::move(n));
  std::map<ValueId, size_t> made_by;  // value -> its node in `rest`
  for (size_t k = 0; k < rest.size(); ++k)
    for (ValueId o : rest[k].outputs) made_by[o] = k;
  std::vector<std::vector<Node>> after(rest.size() + 1);  // [0]: before every node; [k + 1]: after rest[k]
  for (Node& add : adds) {
    size_t at = 0;
    for (ValueId v : add.inputs)
      if (auto it = made_by.find(v); it != made_by.end()) at = std::max(at, it->second + 1);
    after[at].push_back(std::move(add));
  }
  std::vector<Node> out;
  out.reserve(nodes.size());
  for (size_t k = 0; k <= rest.size(); ++k) {
    if (k > 0) out.push_back(std::move(rest[k - 1]));
    for (Node& n : after[k]) out.push_back(std::move(n));
  }
  return out;
}

// Sorts the backward nodes into B and W, plans recompute, orders B (each recomputed forward node
// just before the first backward node that reads it) and cuts the three graphs.
void split_and_emit(Work& w, const RecomputePolicy& policy, const std::vector<ValueId>& grad_in,
                    const std::vector<ValueId>& b_targets, const std::vector<ValueId>& w_targets,
                    const std::vector<ValueId>& acc_inputs, BackwardGraphs* out) {
  const std::vector<char> none(w.bwd.size(), 0);
  const std::vector<char> in_b = ancestors(w, b_targets, none);
  const std::vector<char> in_w = ancestors(w, w_targets, in_b);

  // Forward tensors the backward reads.
  std::vector<ValueId> needed;
  std::set<ValueId> needed_set;
  for (size_t k = 0; k < w.bwd.size(); ++k) {
    if (!in_b[k] && !in_w[k]) continue;
    for (ValueId v : w.bwd[k].inputs)
      if (w.is_forward_activation(v) && needed_set.insert(v).second) needed.push_back(v);
  }
  const RecomputePlan plan = plan_recompute(w.g, needed, policy);
  const std::set<ValueId> kept(plan.kept.begin(), plan.kept.end());
  std::vector<char> emitted(w.g.nodes.size(), 0);
  std::vector<Node> b_nodes, w_nodes;
  // Adds the forward nodes (already chosen by the plan) that v needs, inputs first.
  std::function<void(ValueId)> ensure = [&](ValueId v) {
    if (!w.is_forward_activation(v) || kept.count(v)) return;
    const int p = w.g.value(v).producer;
    PT_CHECK(p >= 0 && std::binary_search(plan.recomputed.begin(), plan.recomputed.end(), p),
             "recompute plan misses '" + w.g.value(v).name + "'");
    if (emitted[static_cast<size_t>(p)]) return;
    emitted[static_cast<size_t>(p)] = 1;
    for (ValueId u : w.g.nodes[static_cast<size_t>(p)].inputs) ensure(u);
    b_nodes.push_back(w.g.nodes[static_cast<size_t>(p)]);
    out->recomputed.push_back(w.g.nodes[static_cast<size_t>(p)].name);
  };
  for (size_t k = 0; k < w.bwd.size(); ++k) {
    if (!in_b[k]) continue;
    for (ValueId v : w.bwd[k].inputs) ensure(v);
    b_nodes.push_back(w.bwd[k]);
  }
  for (size_t k = 0; k < w.bwd.size(); ++k) {
    if (!in_w[k]) continue;
    for (ValueId v : w.bwd[k].inputs) ensure(v);
    w_nodes.push_back(w.bwd[k]);
  }
  w_nodes = add_as_soon_as_made(std::move(w_nodes), w_targets);
  std::set<ValueId> made_in_b;
  for (const Node& n : b_nodes)
    for (ValueId o : n.outputs) made_in_b.insert(o);

  // What crosses: F -> B, F -> W, B -> W.
  std::set<ValueId> read_by_b, read_by_w;
  for (const Node& n : b_nodes) read_by_b.insert(n.inputs.begin(), n.inputs.end());
  for (const Node& n : w_nodes) read_by_w.insert(n.inputs.begin(), n.inputs.end());
  std::vector<ValueId> kept_b, kept_w, passed;
  for (ValueId v : plan.kept) {
    if (read_by_b.count(v)) kept_b.push_back(v);
    if (read_by_w.count(v)) kept_w.push_back(v);
  }
  // B hands W what it made and the output gradients it received (B's output is then its input).
  const std::set<ValueId> received(grad_in.begin(), grad_in.end());
  for (ValueId v : read_by_w)
    if (v != kNoValue && (made_in_b.count(v) || received.count(v))) passed.push_back(v);

  const Graph& g = w.g;
  std::vector<ValueId> f_outputs = g.outputs;
  for (ValueId v : plan.kept)
    if (g.value(v).producer >= 0 && !std::count(f_outputs.begin(), f_outputs.end(), v))
      f_outputs.push_back(v);
  std::vector<ValueId> b_in = grad_in, b_out = b_targets, w_in = passed;
  b_in.insert(b_in.end(), kept_b.begin(), kept_b.end());
  b_out.insert(b_out.end(), passed.begin(), passed.end());
  w_in.insert(w_in.end(), kept_w.begin(), kept_w.end());
  w_in.insert(w_in.end(), acc_inputs.begin(), acc_inputs.end());

  out->forward = extract_subgraph(g, g.name + "_fwd", g.nodes, g.inputs, f_outputs);
  out->backward_input = extract_subgraph(g, g.name + "_bwd_input", b_nodes, b_in, b_out);
  out->backward_weight = extract_subgraph(g, g.name + "_bwd_weight", w_nodes, w_in, w_targets);
  out->kept = names_of(g, plan.kept);
  out->kept_for_weight = names_of(g, kept_w);
  out->passed = names_of(g, passed);
  out->output_grads = names_of(g, grad_in);
  out->input_grads = names_of(g, b_targets);
  out->kept_bytes = plan.kept_bytes;
  out->recompute_flops = plan.recompute_flops;
  for (ValueId v : passed) out->passed_bytes += g.value(v).type.bytes();
}

}  // namespace

BackwardGraphs build_backward(const Graph& chunk, const BackwardOptions& options) {
  Work w;
  w.g = chunk;
  w.g.rebuild_uses();
  for (const std::string& f : options.frozen) {
    const ValueId v = w.g.find(f);
    if (v != kNoValue && w.g.value(v).is_parameter()) w.g.value(v).constant = true;
  }
  std::vector<ValueId> seeds;
  for (const std::string& name : options.grad_inputs) {
    const ValueId v = w.g.find(name);
    PT_CHECK(v != kNoValue && std::count(w.g.inputs.begin(), w.g.inputs.end(), v),
             "'" + name + "' is not an input of " + chunk.name);
    seeds.push_back(v);
  }
  const std::vector<bool> needs = needs_gradient(w.g, seeds);
  const size_t forward_values = w.g.values.size();

  BackwardGraphs out;
  std::vector<ValueId> b_inputs;
  if (!options.loss_output.empty()) {
    const ValueId loss = w.g.find(options.loss_output);
    PT_CHECK(loss != kNoValue && w.g.value(loss).type.numel() == 1,
             "loss output '" + options.loss_output + "' is not a scalar of " + chunk.name);
    Tensor one;
    one.type = w.g.value(loss).type;
    one.data.resize(sizeof(float));
    const float v = 1.0f;
    std::memcpy(one.data.data(), &v, sizeof(float));
    const ValueId seed = w.g.add_initializer(grad_name(options.loss_output), std::move(one), true);
    w.bwd_values.insert(seed);
    w.contributions[loss].push_back(seed);
  } else {
    for (ValueId o : w.g.outputs) {
      if (!needs[static_cast<size_t>(o)]) continue;
      const std::string name = w.g.value(o).name;  // a copy: add_value may move the values
      const bool passes_on = std::count(w.g.inputs.begin(), w.g.inputs.end(), o) != 0;
      const ValueId d = w.g.add_value(passes_on ? next_grad_name(name) : grad_name(name), w.g.value(o).type);
      out.output_grad_of.push_back(name);
      w.bwd_values.insert(d);
      w.contributions[o].push_back(d);
      b_inputs.push_back(d);
    }
  }
  differentiate(w, needs);

  // Input gradients (B's results) and parameter gradients (W's, accumulated).
  std::set<ValueId> named;
  std::vector<ValueId> b_targets, w_targets, acc_inputs;
  for (ValueId x : seeds) {
    ValueId t = w.total(x);
    if (t == kNoValue) t = w.zeros(w.g.value(x).type);
    b_targets.push_back(name_result(w, t, grad_name(w.g.value(x).name), &named));
  }
  for (ValueId p : w.g.initializers) {
    if (static_cast<size_t>(p) >= forward_values || !w.g.value(p).is_parameter()) continue;
    const ValueId t = w.total(p);
    if (t == kNoValue) continue;
    const std::string name = w.g.value(p).name;
    const ValueId acc = w.g.add_value(grad_acc_name(name), w.g.value(p).type);
    w.bwd_values.insert(acc);
    acc_inputs.push_back(acc);
    w_targets.push_back(w.append("Add", {acc, t}, w.g.value(p).type, grad_name(name)));
    out.params.push_back(name);
  }
  split_and_emit(w, options.recompute, b_inputs, b_targets, w_targets, acc_inputs, &out);
  return out;
}


}  // namespace pt
