// schedule/list_scheduler.h: builds a compute-only schedule by simulating the pipeline and, each
// time a device falls free, starting the best action it can. Generators call it with unit costs
// (the order is then fixed, whatever the real costs); the auto-scheduler calls it with real ones.
//
// Rules at a free device, in order:
//   1. a W, when more than w_lag[d] W's are pending on the device (a count; the auto-scheduler
//      searches it, no generated kind uses it);
//   2. a ready B (oldest micro-batch first), or with forward_first a ready F;
//   3. a ready F that fits: held + its activation <= cap[d]; a micro-batch's first F on the
//      device must also leave room for one activation of the device's other chunks, so a
//      micro-batch on its way back up the V can always take its next step (no deadlock), and
//      the peak never passes cap[d]. `held` counts a pending W's w_keep until the W runs: B
//      releases activation - w_keep, W the rest.
//   4. any pending W, oldest first: W fills what would be a bubble (the zero-bubble authors'
//      rule), and this is also where W's are forced by memory: an F refused by rule 3 for
//      what the pending W's keep gets its room back from them. With w_keep = 0 they keep
//      nothing and W's run in idle time only. (Running a W ahead of a ready B whenever that
//      would admit a refused F was tried for v-zb: it costs bubble, e.g. 1% at P=4, M=16.)
//   5. otherwise wait for the next dependency to arrive.
#pragma once

#include <string>
#include <vector>

#include "schedule/costs.h"
#include "schedule/schedule.h"

namespace pt {

enum class ForwardOrder {
  kOldest,      // the oldest micro-batch first (finish what is in flight)
  kEntryFirst,  // the lowest chunk first (admit new micro-batches early)
};

struct ListPolicy {
  int chunks = 1;                        // V per device
  Placement placement = Placement::kLoop;
  bool split = true;                     // false: fused BW actions
  std::vector<double> cap;               // per device, activation amount; empty: unlimited
  std::vector<int> w_lag;                // per device; empty or negative: W only in idle time
  bool forward_first = false;            // F before B when both are ready (GPipe's order)
  ForwardOrder forward_order = ForwardOrder::kOldest;
};

struct ListResult {
  Schedule schedule;
  double makespan = 0;
  double span = 0;  // the longest device span (first start to last end): a step once steps overlap
};

// Throws UserError when a cap is below one micro-batch's footprint on its device.
ListResult list_schedule(const std::string& kind, int stages, int micro_batches,
                         const Costs& costs, const ListPolicy& policy);

// A micro-batch's activation on each device (the sum over the device's chunks).
std::vector<double> footprints(const Costs& costs, int stages, Placement placement);

// The smallest cap (the same on every device) the list scheduler can work with: on each
// device, a first chunk's activation plus the largest of its other chunks'.
double least_memory(const Costs& costs, int stages, Placement placement);

}  // namespace pt
