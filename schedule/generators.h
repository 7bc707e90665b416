// schedule/generators.h: the hand-made schedules, compute-only (lower.h adds the sends and
// receives). In: stages P, micro-batches M, chunks per device V. Out: a Schedule whose order is
// fixed by the kind alone; the simulator (simulate.h) then times it under any costs.
//
//   gpipe        all F, then all fused BW                                  V = 1
//   1f1b         P-1-d warm-up F on device d, then one F one BW            V = 1
//   interleaved  Megatron's interleaved 1F1B, chunk c on device c mod P               V >= 2
//   zb-h1        B/W split, 1F1B's memory (P-d micro-batches on device d)          V = 1
//   zb-h2        B/W split, 2(P-d)-1 on device d: no idle time inside a device's span  V = 1
//   zb-v         B/W split, V placement, P micro-batches on every device               V = 2
//   v-zb         as zb-v, pending W's counted as keeping up to half their activation  V = 2
//   v-half       V placement, (P+2)/2 micro-batches: about half of 1F1B's              V = 2
//   v-min        V placement, (P+4)/3 micro-batches: about a third of 1F1B's           V = 2
// The split kinds come from the list scheduler (list_scheduler.h) run with unit costs under
// the memory each paper gives its schedule, W filling idle time (the zero-bubble authors'
// rule). The papers build V-Half and V-Min from repeated building blocks; here the same memory
// budgets are met by list scheduling instead, and the tests pin what that gives. v-zb is zb-v
// with the W's left pending bounded in memory: each counts as still keeping a share of its
// chunk's activation (1/2, else the largest smaller share that keeps zb-v's bubble; see
// generators.cc), so its peak stays at P when W keeps up to that share (--w-keep), and with
// unit costs it has zb-v's zero bubble once steps overlap (M >= 2P).
#pragma once

#include <string>
#include <vector>

#include "schedule/schedule.h"

namespace pt {

struct KindInfo {
  std::string name;
  int min_chunks = 1, max_chunks = 1;  // chunks per device the kind allows
  int default_chunks = 1;
  Placement placement = Placement::kLoop;
  bool split = false;                  // B and W apart (else fused BW)
  std::string summary;
};

const std::vector<KindInfo>& schedule_kinds();
// UserError naming the known kinds (and `auto`) when `name` is not one.
const KindInfo& find_kind(const std::string& name);

// chunks = 0 takes the kind's default. UserError when the kind does not allow `chunks`.
Schedule generate(const std::string& kind, int stages, int micro_batches, int chunks = 0);

}  // namespace pt
