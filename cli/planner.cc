#include "cli/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "autodiff/recompute.h"
#include "core/bytes.h"
#include "core/error.h"
#include "partition/partitioner.h"
#include "schedule/auto.h"
#include "schedule/generators.h"
#include "schedule/simulate.h"
#include "train/timeline.h"

namespace pt {
namespace {

// Most kept first: a device over the cap moves one step along this list. selective keeps the
// products' outputs; every:2 only every other checkpoint (the residual stream between blocks);
// full only the chunk's inputs.
const char* const kPolicies[] = {"none", "selective", "every:2", "full"};
constexpr int kPolicyCount = 4;
constexpr int64_t kStateFactor = 4;  // weights, gradients, two AdamW moments

// One chunking of the model: its cuts and, per policy, every chunk's costs under it (a chunk's
// recompute depends on its own forward alone, so chunks under different policies combine).
struct Chunking {
  int v = 1;
  PartitionPlan plan;
  std::vector<Costs> by_policy;  // empty Costs where the policy could not be built
};

Costs policy_costs(const std::vector<BackwardGraphs>& chunks, const PartitionPlan& plan) {
  Costs costs = chunk_costs(chunks);  // F, B, W in GFLOP; kept bytes as the executor counts
  for (size_t c = 0; c < chunks.size(); ++c) {
    costs.chunks[c].b += static_cast<double>(chunks[c].recompute_flops) * 1e-9;
    costs.chunks[c].comm = static_cast<double>(plan.chunks[c].link_out) * 1e-9;
  }
  return costs;
}

Chunking chunking(const Graph& g, const std::vector<NodeCost>& costs, const PlanRequest& r, int v) {
  Chunking ch;
  ch.v = v;
  PartitionOptions po;
  po.stages = r.devices;
  po.chunks_per_stage = v;
  po.link = r.link;
  ch.plan = plan_partition(g, costs, po);
  for (const char* policy : kPolicies) {
    ChunkBackwardOptions o = r.backward;
    o.recompute = {RecomputePolicy::parse(policy, "recompute")};
    try {
      ch.by_policy.push_back(policy_costs(build_chunk_backward(g, ch.plan, o), ch.plan));
    } catch (const UserError&) {
      ch.by_policy.emplace_back();
    }
  }
  return ch;
}

bool built(const Chunking& ch, const std::vector<int>& level) {
  return std::all_of(level.begin(), level.end(), [&](int p) { return !ch.by_policy[p].chunks.empty(); });
}

PlanCandidate evaluate(const Chunking& ch, const Schedule& s, const std::vector<int>& level,
                       const PlanRequest& r) {
  PlanCandidate c;
  c.chunks = ch.v;
  c.kind = s.kind;
  c.schedule = s;
  Costs costs;
  costs.bytes = true;
  const int chunk_count = static_cast<int>(ch.plan.chunks.size());
  for (int k = 0; k < chunk_count; ++k)
    costs.chunks.push_back(ch.by_policy[level[s.device_of(k)]].chunks[k]);
  const Simulation sim = simulate(s, costs, "plan");
  c.step_s = sim.makespan * 1e9 / r.link.rate;
  c.bubble = sim.bubble;
  c.state_bytes.assign(r.devices, 0);
  c.kept_bytes.assign(r.devices, 0);
  for (int k = 0; k < chunk_count; ++k)
    c.state_bytes[s.device_of(k)] += kStateFactor * ch.plan.chunks[k].param_bytes;
  for (int d = 0; d < r.devices; ++d) {
    c.kept_bytes[d] = std::llround(sim.devices[d].peak_bytes);
    c.recompute.push_back(kPolicies[level[d]]);
    if (r.memory > 0 && c.memory(d) > r.memory && c.fits) {
      c.fits = false;
      c.note = "device " + std::to_string(d) + " needs " + format_bytes(c.memory(d)) + ", over the cap by " +
               format_bytes(c.memory(d) - r.memory);
    }
  }
  return c;
}

// The device's policy raised where it is over the cap; false when none can be.
bool raise_over_cap(const PlanCandidate& c, const PlanRequest& r, std::vector<int>* level) {
  bool raised = false;
  for (int d = 0; d < r.devices; ++d)
    if (c.memory(d) > r.memory && (*level)[d] + 1 < kPolicyCount) {
      ++(*level)[d];
      raised = true;
    }
  return raised;
}

void search_chunking(const Chunking& ch, const PlanRequest& r, std::vector<PlanCandidate>* out) {
  for (const KindInfo& kind : schedule_kinds()) {
    if (ch.v < kind.min_chunks || ch.v > kind.max_chunks) continue;
    Schedule s;
    try {
      s = generate(kind.name, r.devices, r.micro_batches, ch.v);
    } catch (const UserError&) {
      continue;  // e.g. interleaved with micro-batches that are no multiple of the devices
    }
    for (int p = 0; p < kPolicyCount; ++p) {
      const std::vector<int> level(r.devices, p);
      if (!built(ch, level)) continue;
      out->push_back(evaluate(ch, s, level, r));
      out->back().grid = true;
    }
    if (r.memory == 0) continue;
    // Per device: the weakest policy that fits, raising only the devices over the cap.
    std::vector<int> level(r.devices, 0);
    PlanCandidate c = evaluate(ch, s, level, r);
    while (!c.fits && raise_over_cap(c, r, &level) && built(ch, level)) c = evaluate(ch, s, level, r);
    const bool uniform = std::adjacent_find(level.begin(), level.end(), std::not_equal_to<int>()) == level.end();
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
        std::vector<int64_t> per(r.devices, 0);
        for (size_t k = 0; k < ch.plan.chunks.size(); ++k)
          per[device_of(pl, r.devices, static_cast<int>(k))] += kStateFactor * ch.plan.chunks[k].param_bytes;
        state = std::max(state, *std::max_element(per.begin(), per.end()));
      }
      if (state >= r.memory) continue;
      o.memory_limit = static_cast<double>(r.memory - state);
    }
    try {
      const AutoResult a = auto_schedule(r.devices, r.micro_batches, o);
      PlanCandidate c = evaluate(ch, a.schedule, std::vector<int>(r.devices, p), r);
      if (c.fits) c.note = a.how;
      out->push_back(std::move(c));
    } catch (const UserError&) {
      // no order fits the limit with this policy
    }
  }
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
  std::string s;
  for (const std::string& p : recompute) s += (s.empty() ? "" : ",") + p;
  return s;
}

std::string PlanCandidate::name() const {
  return kind + ", " + std::to_string(chunks) + (chunks == 1 ? " chunk" : " chunks") + ", recompute " +
         recompute_text();
}

const PlanCandidate* PlanSearch::best_grid() const {
  for (const PlanCandidate& c : candidates)
    if (c.fits && c.grid) return &c;
  return nullptr;
}

PlanSearch search_plans(const Graph& g, const std::vector<NodeCost>& costs, const PlanRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  PlanSearch out;
  for (int v : r.chunk_counts) {
    if (v * r.devices > static_cast<int>(g.nodes.size())) continue;
    search_chunking(chunking(g, costs, r, v), r, &out.candidates);
  }
  std::stable_sort(out.candidates.begin(), out.candidates.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (!a.fits) return a.largest_memory() < b.largest_memory();
    if (a.step_s != b.step_s) return a.step_s < b.step_s;
    return a.largest_memory() < b.largest_memory();
  });
  out.fitting = static_cast<int>(std::count_if(out.candidates.begin(), out.candidates.end(),
                                               [](const PlanCandidate& c) { return c.fits; }));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
