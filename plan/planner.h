// plan/planner.h: the whole pipeline plan from the cost model, before step 1. In: the graph
// `train` trains (training mode, parameter sites split), its per-node costs, the devices, the
// micro-batches, a memory cap per device and the link. Out: every plan tried, best first.
//
// A plan is chunks per device (1 or 2), cuts for that many chunks (the balanced ones, transfers
// priced by the link, and under a cap also the partitioner's cuts fitted to it, which move
// memory off the devices 1F1B loads most), a recompute policy per chunk (none, selective, every:2, full, or a
// budget between two of them) and a schedule
// (every hand-made kind that takes those chunks, and `auto`'s list schedule under the cap).
// Each is simulated on the work of the chunks' own F, B (recompute included) and W graphs at the
// link's device rate, with the link's transfers between chunks (plan/chunk_costs.h chunk_costs);
// its memory per device is the AdamW state of the parameters it holds (4 x their bytes) plus the
// peak of what its chunks keep under that schedule: the activations F keeps (received tensors
// included) until B and what W still needs, the executor's own account, which `train` reports
// as measured against planned.
//
// The grid a user would try by hand (every kind x one policy for every device, balanced cuts) is
// part of the search; beyond it, per-chunk policies (on each device over the cap, the chunk
// keeping most moves one rung from none towards full, until the plan fits), `auto`, and last the
// best plan's largest raised chunk softened: the largest recompute budget between its rung and
// the one below that still fits (a bisection over the budget), where that is faster. The best plan that fits is the fastest; ties go to the smaller
// largest memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autodiff/chunk_backward.h"
#include "core/ir.h"
#include "partition/cost_model.h"
#include "partition/link.h"
#include "schedule/schedule.h"

namespace pt {

struct PlanRequest {
  int devices = 1;
  int micro_batches = 1;
  int64_t memory = 0;        // per device, bytes; 0: no cap
  LinkModel link;
  ChunkBackwardOptions backward;  // loss and frozen parameters; recompute is the planner's
  std::vector<int> chunk_counts = {1, 2};
};

struct PlanCandidate {
  int chunks = 1;                      // per device
  std::vector<std::string> cut_after;  // the cuts fitted to the cap; empty: the balanced ones
  std::string kind;                    // a hand-made kind or "auto"
  std::vector<std::string> recompute;  // per chunk, forward order
  std::vector<int> rungs;              // per chunk: the rung of none/selective/every:2/full it
                                       // starts from (a budget softens the rung above)
  bool grid = false;                   // one policy for every device and a hand-made kind
  Schedule schedule;                   // compute-only
  double step_s = 0;                   // simulated
  double bubble = 0;
  std::vector<int64_t> state_bytes;    // per device: 4 x parameter bytes
  std::vector<int64_t> kept_bytes;     // per device: peak kept activations
  bool fits = true;
  std::string note;                    // why it does not fit, or what auto chose

  int64_t memory(int d) const { return state_bytes[d] + kept_bytes[d]; }
  int64_t largest_memory() const;
  // "none" when all are; else one per device where a device's chunks agree ("none,full"), else
  // one per chunk: what train's pipeline.recompute takes.
  std::string recompute_text() const;
  std::string name() const;            // "zb-v, 2 chunks, recompute none"
};

struct PlanSearch {
  std::vector<PlanCandidate> candidates;  // fitting ones first, each group fastest first
  int fitting = 0;
  double seconds = 0;                     // planning time

  const PlanCandidate& best() const { return candidates.front(); }
  // The fastest grid plan that fits; nullptr when none does.
  const PlanCandidate* best_grid() const;
};

// UserError when no plan fits the cap (naming the least memory any plan needs).
PlanSearch search_plans(const Graph& g, const std::vector<NodeCost>& costs, const PlanRequest& r);

}  // namespace pt
