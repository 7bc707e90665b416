// schedule/schedule.h: a pipeline schedule as plain data: per device, the ordered list of actions
// it runs in one training step; its CSV form, which users read, write by hand and run as is.
//
// In: generators (generators.h), auto_schedule (auto.h) or a CSV file. Out: the validator,
// the simulator, the renderers, and the executor, which runs each device's list in order.
//
// Chunks are numbered in forward order 0..P*V-1 (P devices, V chunks per device). Placement:
//   kLoop  chunk c on device c mod P (one chunk per device; interleaved 1F1B for V > 1);
//   kV     chunk c of round r = c / P on device c mod P when r is even, P-1 - (c mod P) when odd
//          (V = 2: chunk i and 2P-1-i on device i), so the last chunk sits beside the first.
//
// CSV form: '#' lines carry the header as `# key: value` (kind, stages, chunks, micro_batches,
// placement = loop | v); any other '#' line and blank lines are comments. Then one row per
// device in device order, one action per cell in the text form of action.h:
//   # kind: 1f1b
//   # stages: 2
//   # chunks: 1
//   # micro_batches: 2
//   # placement: loop
//   0F0,0F1,0BW0,0BW1
//   1F0,1BW0,1F1,1BW1
// Missing header fields are inferred: stages from the rows, micro_batches and chunks from the
// largest numbers used, placement loop, kind "custom".
#pragma once

#include <string>
#include <vector>

#include "schedule/action.h"

namespace pt {

enum class Placement { kLoop, kV };

const char* placement_name(Placement p);
int device_of(Placement placement, int stages, int chunk);

struct Schedule {
  std::string kind = "custom";
  int stages = 1;         // P: devices
  int chunks = 1;         // V: chunks per device
  int micro_batches = 1;  // M
  Placement placement = Placement::kLoop;
  std::vector<std::vector<Action>> devices;  // P lists, each run in order

  int total_chunks() const { return stages * chunks; }
  int device_of(int chunk) const { return pt::device_of(placement, stages, chunk); }
  bool lowered() const;     // holds any send or receive
  size_t action_count() const;
};

std::string format_csv(const Schedule& s);
// `where` names the source in errors (a file name). UserError on a malformed line, naming
// `where:line` and the cell; the schedule is parsed, not validated (see validate.h).
Schedule parse_csv(const std::string& text, const std::string& where);

}  // namespace pt
