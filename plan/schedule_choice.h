// plan/schedule_choice.h: the schedule a pipeline config asks for, in one place for `train`,
// `schedule` and `plan --write`'s config. In: the schedule as the user names it (a kind in any
// case, `auto`, or a CSV file), stages, micro-batches, chunks per device, the memory limit for
// `auto`, and the chunk costs at a given chunk count (only `auto` prices schedules). Out: the
// compute schedule, the lowered one the executor runs (sends and receives added, or a lowered
// CSV's own, checked), and for `auto` the costs it chose with and what won.
//
//   - a kind: generate(kind, stages, micro-batches, chunks); chunks 0 is the kind's default;
//   - a CSV: the file's schedule; its stages, micro-batches and chunks
//     must be the ones asked for where they are given (nonzero); a CSV with sends and receives
//     (`schedule --lowered --csv`) runs as written, its compute actions the schedule;
//   - auto: the list scheduler over the costs at `chunks`, or at 1 and 2 chunks per device when
//     chunks is 0 (2 only where the model can be cut so: costs_for's UserError at 2 is taken as
//     "not possible", at 1 it is raised), under memory_limit.
// Errors are UserErrors naming the file or the kind; callers add the config key or the flag.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "schedule/costs.h"
#include "schedule/schedule.h"

namespace pt {

struct ScheduleSpec {
  std::string kind;      // a kind or "auto", in any case; or
  std::string csv;       // a CSV schedule's path
  int stages = 0;        // for a CSV, 0 takes the file's (and micro_batches, chunks alike)
  int micro_batches = 0;
  int chunks = 0;             // per device; 0: the kind's default, the file's, or auto tries 1 and 2
  double memory_limit = 0;    // auto: per device, in the costs' activation unit; 0: none
};

struct ScheduleChoice {
  Schedule schedule;            // compute actions only
  Schedule lowered;             // with sends and receives: what the executor runs
  bool lowered_csv = false;     // the CSV held sends and receives: `lowered` is the file's
  std::optional<Costs> costs;   // auto: the chunking it chose
  std::string note;             // auto: what won, and the best hand-made schedule that fits
};

// A config's pipeline.schedule names a CSV file when it ends in .csv (any case), else a kind.
bool is_csv_schedule(const std::string& schedule);
// A kind as the generators name it: kinds are written in any case.
std::string schedule_kind(std::string name);

ScheduleChoice choose_schedule(const ScheduleSpec& spec, const std::function<Costs(int chunks)>& costs_for);

}  // namespace pt
