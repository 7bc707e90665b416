#include "plan/schedule_choice.h"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "schedule/auto.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/validate.h"

namespace pt {
namespace {

// A lowered CSV's compute actions: the schedule it was lowered from.
Schedule compute_only(Schedule s) {
  for (std::vector<Action>& list : s.devices)
    list.erase(std::remove_if(list.begin(), list.end(), [](const Action& a) { return !is_compute(a.op); }), list.end());
  return s;
}

}  // namespace

std::string schedule_kind(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

bool is_csv_schedule(const std::string& schedule) { return schedule_kind(schedule).ends_with(".csv"); }

ScheduleChoice choose_schedule(const ScheduleSpec& spec, const std::function<Costs(int chunks)>& costs_for) {
  ScheduleChoice c;
  const std::string kind = schedule_kind(spec.kind);
  if (!spec.csv.empty()) {
    c.schedule = parse_csv(read_file(spec.csv, "check the path of the CSV schedule"), spec.csv);
    if (c.schedule.lowered()) {  // written by `schedule --lowered --csv`: its sends run as they are
      validate(c.schedule, spec.csv);
      c.lowered = c.schedule;
      c.lowered_csv = true;
      c.schedule = compute_only(c.schedule);
    }
    if ((spec.stages && c.schedule.stages != spec.stages) || (spec.micro_batches && c.schedule.micro_batches != spec.micro_batches) ||
        (spec.chunks && c.schedule.chunks != spec.chunks))
      throw UserError("the schedule in '" + spec.csv + "'",
                      "has " + std::to_string(c.schedule.stages) + " stages, " + std::to_string(c.schedule.chunks) +
                          " chunk(s) per stage and " + std::to_string(c.schedule.micro_batches) + " micro-batches",
                      "set stages, chunks and micro-batches to match it");
  } else if (kind == "auto") {
    AutoOptions o;
    for (int v : spec.chunks ? std::vector<int>{spec.chunks} : std::vector<int>{1, 2}) {
      try {
        o.chunkings.push_back(costs_for(v));
      } catch (const UserError&) {
        if (v == 1 || spec.chunks) throw;  // the model cannot be cut even once per stage: say so
      }
    }
    o.memory_limit = spec.memory_limit;
    const AutoResult r = auto_schedule(spec.stages, spec.micro_batches, o);
    c.schedule = r.schedule;
    c.costs = o.chunkings[0];
    for (const Costs& k : o.chunkings)
      if (static_cast<int>(k.chunks.size()) == r.schedule.total_chunks()) c.costs = k;
    std::ostringstream note;
    note << "auto: " << r.how << " (" << r.tried << " schedules simulated)\n";
    if (!r.best_hand_made.empty())
      note << "best hand-made schedule that fits: " << r.best_hand_made << ", makespan " << r.best_hand_made_makespan << "\n";
    c.note = note.str();
  } else {
    c.schedule = generate(kind, spec.stages, spec.micro_batches, spec.chunks);
  }
  if (c.lowered.devices.empty()) c.lowered = add_send_recv(c.schedule);
  return c;
}

}  // namespace pt
