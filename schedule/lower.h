// schedule/lower.h: compute-only schedule -> the schedule the executor runs: a SEND after every
// action whose output another device needs, a RECV just before every action that needs one,
// and a STEP (optimizer) at the end of every device.
//
// Contract with the executor's Comm: a SEND hands the tensor over and returns (it never waits
// for the RECV); a RECV waits until the tensor is there. Under that contract the lowered
// schedule runs exactly when the compute-only one does: every new wait mirrors one the
// compute-only schedule already had, so a valid input gives a deadlock-free output.
#pragma once

#include "schedule/schedule.h"

namespace pt {

Schedule add_send_recv(const Schedule& compute_only);

}  // namespace pt
