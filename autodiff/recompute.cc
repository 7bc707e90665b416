#include "autodiff/recompute.h"

#include <algorithm>
#include <functional>
#include <set>

#include "core/bytes.h"
#include "core/pipetrain_ops.h"
#include "core/error.h"
#include "partition/cost_model.h"

namespace pt {

RecomputePolicy RecomputePolicy::parse(const std::string& text, const std::string& where) {
  RecomputePolicy p;
  const auto arg = [&](const std::string& prefix) { return text.substr(prefix.size()); };
  if (text == "none") return p;
  if (text == "full") {
    p.kind = Kind::kFull;
  } else if (text == "selective") {
    p.kind = Kind::kSelective;
  } else if (text.rfind("every:", 0) == 0) {
    p.kind = Kind::kEvery;
    try {
      size_t pos = 0;
      p.every = std::stoll(arg("every:"), &pos);
      if (pos != arg("every:").size()) p.every = 0;
    } catch (const std::exception&) {
      p.every = 0;
    }
    if (p.every < 1)
      throw UserError(where, "cannot read '" + text + "': N must be a whole number >= 1",
                      "write every:2 to keep every second checkpoint");
  } else if (text.rfind("budget:", 0) == 0) {
    p.kind = Kind::kBudget;
    p.budget_bytes = parse_bytes(arg("budget:"), where);
  } else {
    throw UserError(where, "unknown recompute policy '" + text + "'",
                    "use none, full, every:N, selective or budget:BYTES");
  }
  return p;
}

std::string RecomputePolicy::str() const {
  switch (kind) {
    case Kind::kNone: return "none";
    case Kind::kFull: return "full";
    case Kind::kEvery: return "every:" + std::to_string(every);
    case Kind::kSelective: return "selective";
    case Kind::kBudget: return "budget:" + std::to_string(budget_bytes);
  }
  return "?";
}

namespace {

// Outputs worth keeping under `selective`: matrix products and convolutions with a weight. A
// product of two activations (attention's Q K^T and P V) is recomputed with the softmax between
// them: its output is large (sequence^2 per head) for few FLOPs per byte, which is Megatron-LM's
// reason to recompute the attention core. A FusedAttention's outputs (Y and each row's
// log-sum-exp, O(sequence) per head) are kept: recomputing them would re-run the whole core.
bool expensive(const Graph& g, const Node& n) {
  if (n.domain == kPipetrainDomain && n.op_type == "FusedAttention") return true;
  if (n.op_type != "MatMul" && n.op_type != "Gemm" && n.op_type != "Conv") return false;
  for (ValueId v : n.inputs)
    if (v != kNoValue && g.value(v).is_initializer()) return true;
  return false;
}

bool activation(const Graph& g, ValueId v) { return !g.value(v).is_initializer(); }

// Given the values F offers to keep (`offer`), walks back from each needed value: an offered
// value or a chunk input is kept; anything else is recomputed from its producer's inputs.
RecomputePlan resolve(const Graph& g, const std::vector<NodeCost>& costs,
                      const std::vector<ValueId>& needed, const std::vector<bool>& offer) {
  std::vector<char> kept(g.values.size(), 0), seen(g.values.size(), 0);
  std::vector<char> rerun(g.nodes.size(), 0);
  std::vector<ValueId> stack(needed.begin(), needed.end());
  while (!stack.empty()) {
    const ValueId v = stack.back();
    stack.pop_back();
    if (seen[static_cast<size_t>(v)] || !activation(g, v)) continue;
    seen[static_cast<size_t>(v)] = 1;
    const int p = g.value(v).producer;
    if (offer[static_cast<size_t>(v)] || p < 0) {
      kept[static_cast<size_t>(v)] = 1;
      continue;
    }
    if (rerun[static_cast<size_t>(p)]) continue;
    rerun[static_cast<size_t>(p)] = 1;
    for (ValueId u : g.nodes[static_cast<size_t>(p)].inputs)
      if (u != kNoValue) stack.push_back(u);
  }
  RecomputePlan plan;
  for (size_t v = 0; v < kept.size(); ++v)
    if (kept[v]) {
      plan.kept.push_back(static_cast<ValueId>(v));
      plan.kept_bytes += g.values[v].type.bytes();
    }
  for (size_t n = 0; n < rerun.size(); ++n)
    if (rerun[n]) {
      plan.recomputed.push_back(static_cast<int>(n));
      plan.recompute_flops += costs[n].flops_fwd;
    }
  return plan;
}

std::vector<bool> offer_of(const Graph& g, const std::vector<ValueId>& values) {
  std::vector<bool> offer(g.values.size(), false);
  for (ValueId v : values) offer[static_cast<size_t>(v)] = true;
  return offer;
}

std::vector<bool> offer_expensive(const Graph& g) {
  std::vector<bool> offer(g.values.size(), false);
  for (const Node& n : g.nodes)
    if (expensive(g, n))
      for (ValueId o : n.outputs)
        if (o != kNoValue) offer[static_cast<size_t>(o)] = true;
  return offer;
}

std::vector<bool> offer_every(const Graph& g, int64_t every) {
  const std::vector<ValueId> cands = checkpoint_candidates(g);
  std::vector<ValueId> chosen;
  for (size_t i = static_cast<size_t>(every) - 1; i < cands.size(); i += static_cast<size_t>(every))
    chosen.push_back(cands[i]);
  return offer_of(g, chosen);
}

bool better(const RecomputePlan& a, const RecomputePlan& b) {
  return a.recompute_flops != b.recompute_flops ? a.recompute_flops < b.recompute_flops
                                                : a.kept_bytes < b.kept_bytes;
}

// The fewest recompute FLOPs within `budget`: the best of the fixed policies, then greedy:
// offer one more recomputed value at a time, taking the one that saves the most FLOPs per
// added byte while the plan still fits.
RecomputePlan plan_budget(const Graph& g, const std::vector<NodeCost>& costs,
                          const std::vector<ValueId>& needed, int64_t budget) {
  std::vector<std::vector<bool>> offers = {offer_of(g, needed), offer_expensive(g),
                                           std::vector<bool>(g.values.size(), false)};
  const size_t ncand = checkpoint_candidates(g).size();
  for (size_t n = 1; n <= ncand; ++n) offers.push_back(offer_every(g, static_cast<int64_t>(n)));
  std::vector<bool> best_offer;
  RecomputePlan best;
  bool found = false;
  int64_t smallest = -1;
  for (const auto& offer : offers) {
    RecomputePlan p = resolve(g, costs, needed, offer);
    if (smallest < 0 || p.kept_bytes < smallest) smallest = p.kept_bytes;
    if (p.kept_bytes <= budget && (!found || better(p, best))) {
      best = p;
      best_offer = offer;
      found = true;
    }
  }
  if (!found)
    throw UserError("recompute budget", "no plan keeps at most " + std::to_string(budget) +
                                            " bytes per micro-batch; the least is " +
                                            std::to_string(smallest),
                    "raise the budget, or use more stages so each keeps less");
  for (int round = 0; round < 256 && best.recompute_flops > 0; ++round) {
    RecomputePlan next;
    std::vector<bool> next_offer;
    double best_gain = 0;
    for (int n : best.recomputed) {
      for (ValueId o : g.nodes[static_cast<size_t>(n)].outputs) {
        if (o == kNoValue || best_offer[static_cast<size_t>(o)]) continue;
        std::vector<bool> offer = best_offer;
        offer[static_cast<size_t>(o)] = true;
        RecomputePlan p = resolve(g, costs, needed, offer);
        if (p.kept_bytes > budget || p.recompute_flops >= best.recompute_flops) continue;
        const double gain = static_cast<double>(best.recompute_flops - p.recompute_flops) /
                            static_cast<double>(std::max<int64_t>(1, p.kept_bytes - best.kept_bytes));
        if (gain > best_gain) {
          best_gain = gain;
          next = p;
          next_offer = offer;
        }
      }
    }
    if (next_offer.empty()) break;
    best = next;
    best_offer = next_offer;
  }
  return best;
}

}  // namespace

std::vector<ValueId> checkpoint_candidates(const Graph& g) {
  std::vector<int> last_use(g.values.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ValueId v : g.nodes[i].inputs)
      if (v != kNoValue && activation(g, v)) last_use[static_cast<size_t>(v)] = static_cast<int>(i);
  std::set<ValueId> live;
  for (ValueId v : g.inputs)
    if (last_use[static_cast<size_t>(v)] >= 0) live.insert(v);
  std::vector<ValueId> out;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (ValueId v : g.nodes[i].inputs)
      if (v != kNoValue && last_use[static_cast<size_t>(v)] == static_cast<int>(i)) live.erase(v);
    for (ValueId o : g.nodes[i].outputs)
      if (o != kNoValue && last_use[static_cast<size_t>(o)] > static_cast<int>(i)) live.insert(o);
    if (live.size() == 1 && g.value(*live.begin()).producer == static_cast<int>(i))
      out.push_back(*live.begin());
  }
  return out;
}

RecomputePlan plan_recompute(const Graph& g, const std::vector<ValueId>& needed,
                             const RecomputePolicy& policy) {
  const std::vector<NodeCost> costs = estimate_costs(g);
  using K = RecomputePolicy::Kind;
  switch (policy.kind) {
    case K::kNone: return resolve(g, costs, needed, offer_of(g, needed));
    case K::kFull: return resolve(g, costs, needed, std::vector<bool>(g.values.size(), false));
    case K::kEvery: return resolve(g, costs, needed, offer_every(g, policy.every));
    case K::kSelective: return resolve(g, costs, needed, offer_expensive(g));
    case K::kBudget: return plan_budget(g, costs, needed, policy.budget_bytes);
  }
  return {};
}

}  // namespace pt
