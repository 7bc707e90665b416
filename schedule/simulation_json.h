// schedule/simulation_json.h: a simulated schedule as JSON (`pipetrain schedule --json`), beside
// its ASCII and SVG forms (schedule/render.h). In: a Schedule and its Simulation. Out: one object:
// kind, stages, micro_batches, chunks, makespan, bubble, bubble_steps_overlapped (span_bubble)
// and per device its busy time, bubble, peak activations and peak_bytes (null unless the costs
// were in bytes), in the costs' time unit.
#pragma once

#include <nlohmann/json.hpp>

#include "schedule/schedule.h"
#include "schedule/simulate.h"

namespace pt {

nlohmann::json simulation_json(const Schedule& s, const Simulation& sim);

}  // namespace pt
