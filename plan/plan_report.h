// plan/plan_report.h: a planner search's text and JSON forms (what `pipetrain plan` prints). In:
// the PlanRequest and the PlanSearch it gave (plan/planner.h). Out: the best plan with its
// memory per device, the runner-ups and why each lost, and the best hand-made plan; or the same
// as one JSON object.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/planner.h"

namespace pt {

// The best candidate of every (kind, chunks) but the best plan's, in the search's order (the
// first of each group, which search_plans puts fastest first among those that fit).
std::vector<const PlanCandidate*> runner_ups(const PlanSearch& s);

// One candidate: kind, chunks, recompute, cut_after, grid, step_s, bubble, state_bytes,
// kept_bytes (per device), fits, note, and memory: plan/memory.h memory_json of its devices.
nlohmann::json candidate_json(const PlanCandidate& c);

// The search: devices, micro_batches, memory, searched, fitting, seconds, best, best_grid (null
// where none fits) and runner_ups.
nlohmann::json plan_search_json(const PlanRequest& r, const PlanSearch& s);

// The search as a table for `model_path` at micro-batches of `micro_batch` rows.
void print_plan_search(std::ostream& os, const std::string& model_path, int64_t micro_batch, const PlanRequest& r,
                       const PlanSearch& s);

// Seconds as milliseconds for people: 0.00013 -> "0.130 ms".
std::string format_ms(double seconds);

}  // namespace pt
