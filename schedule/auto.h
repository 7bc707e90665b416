// schedule/auto.h: the auto-scheduler. In: per-chunk costs (F, B, W times, activation bytes
// and what W keeps, transfer times) for one or more chunkings of the model, and a memory limit
// per device. Out: the valid schedule with the smallest simulated makespan whose peak fits.
//
// How: every hand-made kind whose chunking is offered is generated and simulated, and kept if
// it fits; then the list scheduler (list_scheduler.h) runs with the real costs over a grid of
// policies (placement, B/W split or fused, memory caps, how far W may trail B, which forward
// first), and the best policy is refined device by device (coordinate descent over each
// device's cap and W lag). The zero-bubble authors' heuristic is one point of this grid (split,
// cap at the limit, W in idle time); hand-made kinds are others, so auto never loses to a
// hand-made schedule that fits the same limit.
#pragma once

#include <string>
#include <vector>

#include "schedule/costs.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"

namespace pt {

struct AutoOptions {
  std::vector<Costs> chunkings;  // each with stages * V chunks; V = 1 and 2 are typical
  double memory_limit = 0;       // per device, in the costs' activation amount; 0: none
  int refine_evaluations = 400;  // simulations the refinement may spend
};

struct AutoResult {
  Schedule schedule;             // compute-only, kind "auto"
  Simulation simulation;
  std::string how;               // what won: a hand-made kind or the list policy
  int tried = 0;                 // schedules simulated
  std::string best_hand_made;    // the best fitting hand-made kind ("" if none fits)
  double best_hand_made_makespan = 0;
};

// UserError when the limit is below what one micro-batch needs on a device (naming it).
AutoResult auto_schedule(int stages, int micro_batches, const AutoOptions& options);

}  // namespace pt
