// schedule/validate.h: checks that a schedule (compute-only or lowered) can run and trains
// every micro-batch once. In: a Schedule. Out: nothing, or a ScheduleError.
//
// Rules: every action names a chunk and micro-batch in range, on the device that holds the
// chunk; every (micro-batch, chunk) has exactly one F and either one B and one W or one fused
// BW; on a device, B after its F, W after its B, F of chunk c before F of chunk c+1 and B of
// c+1 before B of c; in a lowered schedule every transfer between devices has one SEND after
// the action that makes the tensor and one RECV before the action that uses it; a STEP, if
// any device has one, ends every device's list; and the devices, run against each other
// (walk.h), all reach their ends (no device waits for something that never comes).
#pragma once

#include <string>

#include "core/error.h"
#include "schedule/schedule.h"

namespace pt {

// A UserError (one line: where, the rule broken, device and step) that also carries the
// device x step grid around the failing step, marked, for the CLI to print above the line.
class ScheduleError : public UserError {
 public:
  ScheduleError(const std::string& where, const std::string& what, std::string grid)
      : UserError(where, what, "the device x step grid marks where"),
        grid_(std::move(grid)) {}
  const std::string& grid() const { return grid_; }

 private:
  std::string grid_;
};

// `where` names the schedule in the error (a file name, or the kind).
void validate(const Schedule& s, const std::string& where);

}  // namespace pt
