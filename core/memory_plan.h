// core/memory_plan.h: one arena per program (exec/stage_program.h), and the plan's count of it
// (plan/memory.h). In: every buffer's size and the steps it is live
// (first write to last read). Out: an offset per buffer such that buffers live at the same time
// never overlap, and the arena size, which is the program's planned peak.
//
// Greedy by size: buffers are placed largest first, each at the lowest aligned offset that does
// not overlap a placed buffer whose lifetime intersects its own. add_buffers places more buffers
// the same way around those of a plan, which keep their offsets (a program's kernel scratch,
// placed after its tensors: the tensors' layout is then the one a plan made from the graph alone
// predicts, core/graph_arena.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pt {

constexpr int64_t kArenaAlignment = 64;

struct BufferLife {
  std::string name;
  int64_t bytes = 0;
  int first = 0;  // step that writes it first (-1: before the first step)
  int last = 0;   // step that reads it last (inclusive)
};

struct MemoryPlan {
  std::vector<BufferLife> buffers;
  std::vector<int64_t> offsets;  // per buffer
  int64_t arena_bytes = 0;       // planned peak
  int64_t peak_live_bytes = 0;   // max over steps of the bytes live at once (a lower bound)

  std::string to_text() const;   // one line per buffer: name bytes [first,last] @offset
};

MemoryPlan plan_memory(std::vector<BufferLife> buffers);

// `more` placed into `plan` (largest first, each at the lowest aligned offset free during its
// life), the plan's buffers where they were; arena_bytes and peak_live_bytes grow to match.
void add_buffers(MemoryPlan& plan, std::vector<BufferLife> more);

}  // namespace pt
