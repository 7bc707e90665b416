#include "schedule/simulate.h"

#include <algorithm>

#include "core/error.h"
#include "schedule/validate.h"
#include "schedule/walk.h"

namespace pt {

std::vector<double> peak_memory(const Schedule& s, const Costs& costs) {
  std::vector<double> peaks;
  for (const auto& list : s.devices) {
    double held = 0, peak = 0;
    for (const Action& a : list) {
      if (!is_compute(a.op)) continue;
      const ChunkCost& c = costs.chunks[static_cast<size_t>(a.chunk)];
      if (a.op == Op::kF) held += c.activation;
      if (a.op == Op::kB) held -= c.activation - c.w_keep;
      if (a.op == Op::kW) held -= c.w_keep;
      if (a.op == Op::kBW) held -= c.activation;
      peak = std::max(peak, held);
    }
    peaks.push_back(peak);
  }
  return peaks;
}

Simulation simulate(const Schedule& s, const Costs& costs, const std::string& where) {
  if (static_cast<int>(costs.chunks.size()) != s.total_chunks())
    throw UserError(where, "costs are given for " + std::to_string(costs.chunks.size()) +
                               " chunks but the schedule has " + std::to_string(s.total_chunks()),
                    "give costs for stages x chunks chunks");
  validate(s, where);
  const Walk w = walk_schedule(s, costs);
  PT_CHECK(w.complete(), "a valid schedule did not run to its end");
  Simulation sim;
  sim.bytes = costs.bytes;
  double total_busy = 0;
  for (size_t d = 0; d < s.devices.size(); ++d) {
    std::vector<TimedAction> row;
    DeviceReport r;
    r.index = static_cast<int>(d);
    for (size_t i = 0; i < s.devices[d].size(); ++i) {
      row.push_back({s.devices[d][i], w.start[d][i], w.end[d][i]});
      r.busy += w.end[d][i] - w.start[d][i];
      sim.makespan = std::max(sim.makespan, w.end[d][i]);
    }
    total_busy += r.busy;
    sim.timeline.push_back(std::move(row));
    sim.devices.push_back(r);
  }
  double longest_span = 0;
  for (size_t d = 0; d < sim.timeline.size(); ++d) {
    double first = sim.makespan, last = 0;
    for (const TimedAction& t : sim.timeline[d])
      if (is_compute(t.action.op)) first = std::min(first, t.start), last = std::max(last, t.end);
    const double span = std::max(0.0, last - first);
    longest_span = std::max(longest_span, span);
    sim.devices[d].span_bubble = span > 0 ? 1 - sim.devices[d].busy / span : 0;
  }
  sim.span_bubble = longest_span > 0 ? 1 - total_busy / (s.stages * longest_span) : 0;
  const std::vector<double> peaks = peak_memory(s, costs);
  const double unit = costs.stage_activation(s.stages);
  for (DeviceReport& r : sim.devices) {
    r.bubble = sim.makespan > 0 ? 1 - r.busy / sim.makespan : 0;
    const double peak = peaks[static_cast<size_t>(r.index)];
    r.peak_activations = unit > 0 ? peak / unit : 0;
    r.peak_bytes = costs.bytes ? peak : 0;
  }
  sim.bubble = sim.makespan > 0 ? 1 - total_busy / (s.stages * sim.makespan) : 0;
  return sim;
}

}  // namespace pt
