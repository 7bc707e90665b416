// schedule/list_scheduler.h: builds a compute-only schedule by simulating the pipeline and, each
// time a device falls free, starting the best action it can. Generators call it with unit costs
// (the order is then fixed, whatever the real costs); the auto-scheduler calls it with real ones.
//
// Rules at a free device, in order:
//   1. a W, when more than w_lag[d] W's are pending on the device (bounds how far W trails B);
//   2. a ready B (oldest micro-batch first), or with forward_first a ready F;
//   3. a ready F that fits: held + its activation <= cap[d]; a micro-batch's first F on the
//      device must also leave room for one activation of the device's other chunks, so a
//      micro-batch on its way back up the V can always take its next step (no deadlock), and
//      the peak never passes cap[d]. B and W release what they free.
//   4. any pending W (W fills what would be a bubble: the zero-bubble authors' rule);
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
