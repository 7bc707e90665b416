// train/timeline.h: a run's timeline in the simulator's terms, and in Chrome's. In: the chunks'
// planned costs (plan/chunk_costs.h), the lowered schedule and the executor's per-action times.
// Out: Costs for the simulator (bytes as planned, times from measurement), the measured step as a
// Simulation (so the same renderers and bubble figures apply), and a Chrome trace file.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "train/executor.h"
#include "schedule/costs.h"
#include "schedule/simulate.h"

namespace pt {

// The planned costs (plan/chunk_costs.h chunk_costs) with F, B and W replaced by their median
// measured seconds over the given steps' actions (a fused BW split between B and W in the
// planned ratio), and comm by the median measured transfer between its devices (a receive's end
// less its send's start, where the receive was waiting for it); where no message was timed,
// comm stays as `planned` gives it. Medians, so that an action the OS descheduled on a loaded
// machine does not set its chunk's cost.
//
// ActionClock::kThreadCpu reads F, B and W by what each action's thread spent
// (ActionTime::cpu; an action the step did not read it for counts by its wall time): what the
// cost model prices, with no time the thread waited descheduled.
enum class ActionClock { kWall, kThreadCpu };
Costs measured_costs(const Costs& planned, const Schedule& s,
                     const std::vector<std::vector<std::vector<ActionTime>>>& steps,
                     ActionClock clock = ActionClock::kWall);

// One measured step as a Simulation: every action's start and end, busy time per device
// (compute actions only), makespan = the last end, bubble = 1 - busy / (P x makespan).
Simulation measured_step(const Schedule& s, const std::vector<std::vector<ActionTime>>& times);

// A span of work outside the schedule's actions, on a track of its own (e.g. a rank's
// collectives across data-parallel replicas): seconds since the step began, as ActionTime.
// Another rank's spans count from its own step start: the ranks start a step together, within
// the skew of the collective that ended the step before.
struct TraceSpan {
  std::string track;  // the track's name; tracks are made in order of first appearance
  std::string name;
  double start = 0, end = 0;
};

// Chrome trace events ("X" complete events, one track per device, named "device D" (or as
// device_names says, e.g. "device 1 (rank 1)") by "M" thread_name events; SEND and RECV in
// category "comm", the rest "compute"), for Perfetto.
class ChromeTrace {
 public:
  // The step's actions, offset by `at` seconds since the run began, device d on track
  // first_track + d (several pipelines: one call each, their tracks after each other); then
  // `spans` (category "comm") on tracks below the devices'.
  void add_step(int64_t step, double at, const Schedule& s, const std::vector<std::vector<ActionTime>>& times,
                const std::vector<std::string>& device_names = {}, const std::vector<TraceSpan>& spans = {},
                size_t first_track = 0);
  // Writes {"traceEvents": [...]} atomically; UserError naming the path when it cannot.
  void write(const std::string& path, const std::string& key) const;
  size_t events() const { return events_.size(); }  // the "X" events

 private:
  std::vector<std::string> metadata_;  // track names, one JSON object each
  std::vector<std::string> events_;    // one JSON object each
  std::set<size_t> named_;             // device tracks named so far
  std::vector<std::string> tracks_;    // span tracks, after the devices'
  void name_track(size_t tid, const std::string& name);
};

}  // namespace pt
