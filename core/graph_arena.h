// core/graph_arena.h: which tensors of a graph, run node by node in order, take room in its arena
// and for how long. In: a graph and what its kernels share (ArenaHints: a fused node's output is
// the tensor its fusing kernel writes; a prologue's operand is read when that kernel runs). Out:
// per value where it lives (an arena buffer or a graph input), per arena buffer its bytes and
// life, per graph output whether a caller can have it written into its own memory, and the
// arena's plan (core/memory_plan.h) when the caller always does so for some outputs.
//
// One function for the program that runs the graph (exec/stage_program.h, with its backend's
// hints and, placed after the tensors, its kernels' scratch) and for the plan that counts its
// arena before anything is compiled or loaded (plan/memory.h, without hints): on a backend that
// fuses nothing the two plan the tensors the same, byte for byte.
//
//   a view (Graph::moves_no_bytes) of an arena tensor   that buffer, live until the view's last reader
//   a view of a graph input                             that input, unless it is a graph output
//   a graph output                                      live to the end (n, past the last node)
//   an output always placed by the caller               its buffer takes no room (0 bytes)
#pragma once

#include <vector>

#include "core/ir.h"
#include "core/memory_plan.h"

namespace pt {

struct ArenaHints {
  std::vector<ValueId> fused_tensor;  // per node, or empty: the tensor its output 0 shares (fused)
  std::vector<int> read_until;        // per value, or empty: the last node reading it past its consumers
};

struct GraphArena {
  std::vector<int> buffer;          // per value: its arena buffer (an index into lives), or -1
  std::vector<int> input;           // per value: the graph input whose memory it is, or -1
  std::vector<char> aliased;        // per node: its output shares its input's memory; runs nothing
  std::vector<BufferLife> lives;    // per buffer
  std::vector<int> output_buffer;   // per graph output: its buffer, or -1
  std::vector<char> placeable;      // per graph output: an arena buffer no other graph output shares

  // The arena with the graph outputs `placed` (per output; only placeable ones) written into
  // the caller's memory on every run: their buffers take no room.
  MemoryPlan plan(const std::vector<char>& placed) const;
};

GraphArena graph_arena(const Graph& g, const ArenaHints& hints = {});

}  // namespace pt
