#include "plan/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>

#include "autodiff/recompute.h"
#include "core/bytes.h"
#include "core/error.h"
#include "partition/partitioner.h"
#include "plan/chunk_costs.h"
#include "schedule/auto.h"
#include "schedule/generators.h"
#include "schedule/simulate.h"

namespace pt {
namespace {

// Most kept first: a device over the cap moves one step along this list. selective keeps the
// products' outputs; every:2 only every other checkpoint (the residual stream between blocks);
// full only the chunk's inputs.
const char* const kPolicies[] = {"none", "selective", "every:2", "full"};
constexpr int kPolicyCount = 4;
// Parameter bytes x this is what a device holds for its parameters: weights, gradients, two
// AdamW moments (the partitioner's memory model counts the same).
const int64_t kStateFactor = MemoryModel{}.state_factor;

// One chunking of the model: its cuts and, per policy, every chunk's costs under it (a chunk's
// recompute depends on its own forward alone, so chunks under different policies combine).
struct Chunking {
  int v = 1;
  PartitionPlan plan;
  std::vector<std::string> cut_after;  // empty: the balanced cuts
  std::vector<Costs> by_policy;  // empty Costs where the policy could not be built
};

// Per device, the state its parameters take (kStateFactor x their bytes) when chunk k sits on
// device_of(k).
std::vector<int64_t> state_per_device(const Chunking& ch, int devices, const std::function<int(int)>& device_of) {
  std::vector<int64_t> per(static_cast<size_t>(devices), 0);
  for (size_t k = 0; k < ch.plan.chunks.size(); ++k)
    per[static_cast<size_t>(device_of(static_cast<int>(k)))] += kStateFactor * ch.plan.chunks[k].param_bytes;
  return per;
}

// The chunking of `plan`; with `fitted`, cuts named for train's partition: manual.
Chunking chunking(const Graph& g, const PartitionPlan& plan, const PlanRequest& r, bool fitted) {
  Chunking ch;
  ch.v = plan.chunks_per_stage;
  ch.plan = plan;
  if (fitted)
    for (size_t c = 0; c + 1 < plan.chunks.size(); ++c)
      ch.cut_after.push_back(g.nodes[static_cast<size_t>(plan.chunks[c].end - 1)].name);
  for (const char* policy : kPolicies) {
    ChunkBackwardOptions o = r.backward;
    o.recompute = {RecomputePolicy::parse(policy, "recompute")};
    try {
      ch.by_policy.push_back(chunk_costs(build_chunk_backward(g, ch.plan, o), ch.plan));
    } catch (const UserError&) {
      ch.by_policy.emplace_back();
    }
  }
  return ch;
}

// For v chunks per device: the balanced cuts, and with a cap the partitioner's cuts under it
// (1F1B's in-flight count per stage) where they differ: memory moved off the first devices.
std::vector<Chunking> chunkings_for(const Graph& g, const std::vector<NodeCost>& costs, const PlanRequest& r, int v) {
  PartitionOptions po;
  po.stages = r.devices;
  po.chunks_per_stage = v;
  po.link = r.link;
  const PartitionPlan balanced = plan_partition(g, costs, po);
  std::vector<Chunking> out{chunking(g, balanced, r, false)};
  if (r.memory == 0) return out;
  po.memory.limit = r.memory;
  po.memory.state_factor = kStateFactor;
  try {
    const PartitionPlan fitted = plan_partition(g, costs, po);
    bool same = true;
    for (size_t c = 0; c < fitted.chunks.size(); ++c) same = same && fitted.chunks[c].end == balanced.chunks[c].end;
    if (!same) out.push_back(chunking(g, fitted, r, true));
  } catch (const UserError&) {
    // no cuts fit the cap under that model: the balanced ones with recompute may still
  }
  return out;
}

// A recompute policy per chunk: a rung of kPolicies, or a budget with the chunk's costs under it.
struct Assignment {
  std::vector<int> level;                                   // by chunk
  std::map<int, std::pair<std::string, ChunkCost>> budget;  // chunk -> ("budget:B", its costs)
};

bool built(const Chunking& ch, const Assignment& a) {
  return std::all_of(a.level.begin(), a.level.end(), [&](int p) { return !ch.by_policy[p].chunks.empty(); });
}

PlanCandidate evaluate(const Chunking& ch, const Schedule& s, const Assignment& a, const PlanRequest& r) {
  PlanCandidate c;
  c.chunks = ch.v;
  c.cut_after = ch.cut_after;
  c.kind = s.kind;
  c.schedule = s;
  Costs costs;
  costs.bytes = true;
  const int chunk_count = static_cast<int>(ch.plan.chunks.size());
  for (int k = 0; k < chunk_count; ++k) {
    auto b = a.budget.find(k);
    costs.chunks.push_back(b != a.budget.end() ? b->second.second : ch.by_policy[a.level[k]].chunks[k]);
    c.recompute.push_back(b != a.budget.end() ? b->second.first : kPolicies[a.level[k]]);
  }
  c.rungs = a.level;
  const Simulation sim = simulate(s, costs, "plan");
  c.step_s = sim.makespan * 1e9 / r.link.rate;
  c.bubble = sim.bubble;
  c.state_bytes = state_per_device(ch, r.devices, [&](int k) { return s.device_of(k); });
  c.kept_bytes.assign(r.devices, 0);
  for (int d = 0; d < r.devices; ++d) {
    c.kept_bytes[d] = std::llround(sim.devices[d].peak_bytes);
    if (r.memory > 0 && c.memory(d) > r.memory && c.fits) {
      c.fits = false;
      c.note = "device " + std::to_string(d) + " needs " + format_bytes(c.memory(d)) + ", over the cap by " +
               format_bytes(c.memory(d) - r.memory);
    }
  }
  return c;
}

// On every device over the cap, the chunk keeping most per micro-batch moves one rung on;
// false when none can.
bool raise_over_cap(const Chunking& ch, const PlanCandidate& c, const PlanRequest& r, Assignment* a) {
  bool raised = false;
  for (int d = 0; d < r.devices; ++d) {
    if (c.memory(d) <= r.memory) continue;
    int pick = -1;
    for (int k = 0; k < static_cast<int>(a->level.size()); ++k) {
      if (c.schedule.device_of(k) != d || a->level[k] + 1 >= kPolicyCount) continue;
      const double kept = ch.by_policy[a->level[k]].chunks[k].activation;
      if (pick < 0 || kept > ch.by_policy[a->level[pick]].chunks[pick].activation) pick = k;
    }
    if (pick >= 0) {
      ++a->level[pick];
      raised = true;
    }
  }
  return raised;
}

void search_chunking(const Chunking& ch, const PlanRequest& r, std::vector<PlanCandidate>* out) {
  const int chunk_count = static_cast<int>(ch.plan.chunks.size());
  for (const KindInfo& kind : schedule_kinds()) {
    if (ch.v < kind.min_chunks || ch.v > kind.max_chunks) continue;
    Schedule s;
    try {
      s = generate(kind.name, r.devices, r.micro_batches, ch.v);
    } catch (const UserError&) {
      continue;  // e.g. interleaved with micro-batches that are no multiple of the devices
    }
    for (int p = 0; p < kPolicyCount; ++p) {
      const Assignment uniform{std::vector<int>(chunk_count, p), {}};
      if (!built(ch, uniform)) continue;
      out->push_back(evaluate(ch, s, uniform, r));
      out->back().grid = ch.cut_after.empty();  // the hand-made grid takes the balanced cuts
    }
    if (r.memory == 0) continue;
    // Per chunk: from none, the chunks of the devices over the cap raised one rung at a time.
    Assignment a{std::vector<int>(chunk_count, 0), {}};
    PlanCandidate c = evaluate(ch, s, a, r);
    while (!c.fits && raise_over_cap(ch, c, r, &a) && built(ch, a)) c = evaluate(ch, s, a, r);
    const bool uniform = std::adjacent_find(a.level.begin(), a.level.end(), std::not_equal_to<int>()) == a.level.end();
    if (c.fits && !uniform) out->push_back(std::move(c));
  }
  // auto: the list scheduler's best under the cap less the largest state any placement gives.
  for (int p = 0; p < kPolicyCount; ++p) {
    if (ch.by_policy[p].chunks.empty()) continue;
    AutoOptions o;
    o.chunkings = {ch.by_policy[p]};
    if (r.memory > 0) {
      int64_t state = 0;
      for (Placement pl : {Placement::kLoop, Placement::kV}) {
        const std::vector<int64_t> per =
            state_per_device(ch, r.devices, [&](int k) { return device_of(pl, r.devices, k); });
        state = std::max(state, *std::max_element(per.begin(), per.end()));
      }
      if (state >= r.memory) continue;
      o.memory_limit = static_cast<double>(r.memory - state);
    }
    try {
      const AutoResult a = auto_schedule(r.devices, r.micro_batches, o);
      PlanCandidate c = evaluate(ch, a.schedule, Assignment{std::vector<int>(ch.plan.chunks.size(), p), {}}, r);
      if (c.fits) c.note = a.how;
      out->push_back(std::move(c));
    } catch (const UserError&) {
      // no order fits the limit with this policy
    }
  }
}

// The best plan with its largest raised chunk softened: a budget between the bytes its rung
// keeps and those of the rung below (which did not fit), the largest that still fits, found in
// five bisection steps, each building that chunk's backward under the budget. Empty when no
// chunk was raised or no budget fits and is faster.
std::optional<PlanCandidate> soften(const Graph& g, const Chunking& ch, const PlanCandidate& best,
                                    const PlanRequest& r) {
  Assignment a{best.rungs, {}};
  if (std::any_of(best.recompute.begin(), best.recompute.end(),
                  [](const std::string& p) { return p.rfind("budget:", 0) == 0; }))
    return std::nullopt;
  int pick = -1;
  for (int k = 0; k < static_cast<int>(a.level.size()); ++k)
    if (a.level[k] > 0 && (pick < 0 || ch.by_policy[a.level[k]].chunks[k].activation >
                                           ch.by_policy[a.level[pick]].chunks[pick].activation))
      pick = k;
  if (pick < 0 || ch.by_policy[a.level[pick] - 1].chunks.empty()) return std::nullopt;
  double lo = ch.by_policy[a.level[pick]].chunks[pick].activation;
  double hi = ch.by_policy[a.level[pick] - 1].chunks[pick].activation;
  std::optional<PlanCandidate> found;
  for (int step = 0; step < 5 && hi - lo > 1024; ++step) {
    const int64_t budget = std::llround((lo + hi) / 2);
    ChunkBackwardOptions o = r.backward;
    for (int k = 0; k < static_cast<int>(a.level.size()); ++k)
      o.recompute.push_back(RecomputePolicy::parse(
          k == pick ? "budget:" + std::to_string(budget) : std::string(kPolicies[a.level[k]]), "recompute"));
    try {
      a.budget[pick] = {"budget:" + std::to_string(budget), chunk_costs(build_chunk_backward(g, ch.plan, o), ch.plan).chunks[pick]};
    } catch (const UserError&) {
      return found;
    }
    PlanCandidate c = evaluate(ch, best.schedule, a, r);
    c.note = best.note;
    if (c.fits) {
      lo = static_cast<double>(budget);
      if (c.step_s < best.step_s && (!found || c.step_s <= found->step_s)) found = std::move(c);
    } else {
      hi = static_cast<double>(budget);
    }
  }
  return found;
}

}  // namespace

int64_t PlanCandidate::largest_memory() const {
  int64_t m = 0;
  for (size_t d = 0; d < state_bytes.size(); ++d) m = std::max(m, memory(static_cast<int>(d)));
  return m;
}

std::string PlanCandidate::recompute_text() const {
  if (std::adjacent_find(recompute.begin(), recompute.end(), std::not_equal_to<std::string>()) == recompute.end())
    return recompute.empty() ? "none" : recompute.front();
  std::vector<std::string> per_device(state_bytes.size());
  bool agree = true;
  for (size_t k = 0; k < recompute.size(); ++k) {
    std::string& d = per_device[static_cast<size_t>(schedule.device_of(static_cast<int>(k)))];
    agree = agree && (d.empty() || d == recompute[k]);
    d = recompute[k];
  }
  std::string s;
  for (const std::string& p : agree ? per_device : recompute) s += (s.empty() ? "" : ",") + p;
  return s;
}

std::string PlanCandidate::name() const {
  return kind + ", " + std::to_string(chunks) + (chunks == 1 ? " chunk" : " chunks") +
         (cut_after.empty() ? "" : ", cuts fitted to the cap") + ", recompute " + recompute_text();
}

const PlanCandidate* PlanSearch::best_grid() const {
  for (const PlanCandidate& c : candidates)
    if (c.fits && c.grid) return &c;
  return nullptr;
}

PlanSearch search_plans(const Graph& g, const std::vector<NodeCost>& costs, const PlanRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  PlanSearch out;
  std::vector<Chunking> chunkings;
  const int most = most_chunks(costs);  // balanced cuts: a node with FLOPs in every chunk
  for (int v : r.chunk_counts) {
    if (v * r.devices > most) continue;
    for (Chunking& ch : chunkings_for(g, costs, r, v)) {
      search_chunking(ch, r, &out.candidates);
      chunkings.push_back(std::move(ch));
    }
  }
  const auto order = [](const PlanCandidate& a, const PlanCandidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (!a.fits) return a.largest_memory() < b.largest_memory();
    if (a.step_s != b.step_s) return a.step_s < b.step_s;
    return a.largest_memory() < b.largest_memory();
  };
  std::stable_sort(out.candidates.begin(), out.candidates.end(), order);
  if (r.memory > 0 && !out.candidates.empty() && out.candidates.front().fits)
    for (const Chunking& ch : chunkings)
      if (ch.v == out.candidates.front().chunks && ch.cut_after == out.candidates.front().cut_after) {
        if (std::optional<PlanCandidate> soft = soften(g, ch, out.candidates.front(), r)) {
          out.candidates.push_back(std::move(*soft));
          std::stable_sort(out.candidates.begin(), out.candidates.end(), order);
        }
        break;
      }
  out.fitting = static_cast<int>(std::count_if(out.candidates.begin(), out.candidates.end(),
                                               [](const PlanCandidate& c) { return c.fits; }));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (chunkings.empty())
    throw UserError("plan", "the model has " + std::to_string(most) + " nodes with FLOPs (of " +
                                std::to_string(g.nodes.size()) + "), too few for " + std::to_string(r.devices) +
                                " devices holding one each",
                    "use at most " + std::to_string(most) + " devices");
  if (out.candidates.empty())
    throw UserError("plan", "no schedule takes " + std::to_string(r.micro_batches) + " micro-batches on " +
                                std::to_string(r.devices) + " devices",
                    "choose another --global-batch");
  if (out.fitting == 0) {
    const PlanCandidate& least = out.candidates.front();
    throw UserError("plan", "no plan fits " + format_bytes(r.memory) + " per device; the least any needs is " +
                                format_bytes(least.largest_memory()) + " (" + least.name() + ")",
                    "raise the cap (plan --memory, train's pipeline.memory_limit), add devices, or take "
                    "smaller micro-batches");
  }
  return out;
}

}  // namespace pt
