// schedule/simulate.h: times a schedule under given costs. In: a Schedule (compute-only or
// lowered) and Costs. Out: when each action starts and ends on its device, the makespan, the
// bubble (idle time over makespan) overall and per device, and the peak kept activations.
//
// Memory: on a device, F of chunk c adds its activation; B frees all but w_keep, W frees the
// rest, a fused BW frees all. The peak depends on each device's order alone, not on times.
// It is reported in units of what one micro-batch leaves on a whole stage (1/P of the model)
// and, when the costs carry bytes, in bytes.
#pragma once

#include <vector>

#include "schedule/costs.h"
#include "schedule/schedule.h"

namespace pt {

struct TimedAction {
  Action action;
  double start = 0, end = 0;
};

struct DeviceReport {
  int index = 0;
  double busy = 0;              // time spent computing
  double bubble = 0;            // idle / makespan
  double span_bubble = 0;       // idle between the device's first start and last end / that span
  double peak_activations = 0;  // in stage units (see above)
  double peak_bytes = 0;        // 0 unless the costs are in bytes
};

struct Simulation {
  std::vector<std::vector<TimedAction>> timeline;  // [device], in list order
  double makespan = 0;
  double bubble = 0;  // 1 - sum(busy) / (P * makespan)
  // When consecutive training steps overlap (each device starts its next step as soon as it
  // ends this one, which the zero-bubble authors' optimizer-step bypass allows), a step costs
  // the longest device span, not the makespan: 1 - sum(busy) / (P * longest span).
  double span_bubble = 0;
  bool bytes = false;
  std::vector<DeviceReport> devices;
};

// Validates first (ScheduleError); `where` names the schedule in errors.
Simulation simulate(const Schedule& s, const Costs& costs, const std::string& where = "schedule");

// Peak activation amount per device (bytes or units as the costs are), from the order alone.
std::vector<double> peak_memory(const Schedule& s, const Costs& costs);

}  // namespace pt
