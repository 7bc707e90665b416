// schedule/walk.h: runs a schedule's action lists against each other, as the devices would:
// an action starts when its device has finished the one before and its inputs are there.
// Shared by the validator (does every device reach its end, or where do they stick?) and the
// simulator (when does each action start and end?). Assumes the static rules of validate.cc.
//
// Inputs of an action: F(m,c) needs F(m,c-1); B(m,c) needs F(m,c) and B(m,c+1); W needs B.
// In a compute-only schedule a neighbour on another device adds its transfer time (ChunkCost::
// comm); in a lowered one that input arrives through the RECV before it instead: a RECV ends
// `comm` after its SEND, and a SEND takes no device time and never waits for its RECV.
#pragma once

#include <string>
#include <vector>

#include "schedule/costs.h"
#include "schedule/schedule.h"

namespace pt {

struct Walk {
  std::vector<std::vector<double>> start, end;  // [device][step]; -1 where never reached
  std::vector<int> stuck;                       // [device]: the step it waits at, or -1
  std::vector<std::string> waits_for;           // [device]: the action it waits for ("" if none)

  bool complete() const;
};

Walk walk_schedule(const Schedule& s, const Costs& costs);

double duration(const Action& a, const Costs& costs);

}  // namespace pt
