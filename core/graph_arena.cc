#include "core/graph_arena.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace pt {

GraphArena graph_arena(const Graph& g, const ArenaHints& hints) {
  const int n = static_cast<int>(g.nodes.size());
  GraphArena a;
  a.buffer.assign(g.values.size(), -1);
  a.input.assign(g.values.size(), -1);
  a.aliased.assign(static_cast<size_t>(n), 0);
  for (size_t k = 0; k < g.inputs.size(); ++k) a.input[static_cast<size_t>(g.inputs[k])] = static_cast<int>(k);
  const auto is_output = [&](ValueId v) { return std::count(g.outputs.begin(), g.outputs.end(), v) != 0; };
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[static_cast<size_t>(i)];
    ValueId shared = hints.fused_tensor.empty() ? kNoValue : hints.fused_tensor[static_cast<size_t>(i)];
    if (g.moves_no_bytes(node) && !node.inputs.empty()) shared = node.inputs[0];
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const ValueId v = node.outputs[k];
      if (v == kNoValue || g.value(v).init) continue;
      const Value& val = g.value(v);
      int last = i;
      if (!hints.read_until.empty()) last = std::max(last, hints.read_until[static_cast<size_t>(v)]);
      if (!val.consumers.empty()) last = std::max(last, val.consumers.back());
      if (is_output(v)) last = n;
      const bool same_bytes = k == 0 && shared != kNoValue && g.value(shared).type.bytes() == val.type.bytes();
      const int buffer = same_bytes ? a.buffer[static_cast<size_t>(shared)] : -1;
      const int input = same_bytes ? a.input[static_cast<size_t>(shared)] : -1;
      if (buffer >= 0) {
        a.buffer[static_cast<size_t>(v)] = buffer;
        BufferLife& life = a.lives[static_cast<size_t>(buffer)];
        life.last = std::max(life.last, last);
        a.aliased[static_cast<size_t>(i)] = 1;
        continue;
      }
      // Outputs stay the program's own memory, valid until the next run, whatever the caller
      // does with its inputs.
      if (input >= 0 && last < n) {
        a.input[static_cast<size_t>(v)] = input;
        a.aliased[static_cast<size_t>(i)] = 1;
        continue;
      }
      a.buffer[static_cast<size_t>(v)] = static_cast<int>(a.lives.size());
      a.lives.push_back({val.name, val.type.bytes(), i, last});
    }
  }
  std::map<int, int> outputs_in;  // buffer -> graph outputs it holds
  for (ValueId v : g.outputs)
    if (const int b = a.buffer[static_cast<size_t>(v)]; b >= 0) ++outputs_in[b];
  for (ValueId v : g.outputs) {
    const int b = a.buffer[static_cast<size_t>(v)];
    a.output_buffer.push_back(b);
    a.placeable.push_back(b >= 0 && outputs_in[b] == 1);
  }
  return a;
}

MemoryPlan GraphArena::plan(const std::vector<char>& placed) const {
  PT_CHECK(placed.empty() || placed.size() == placeable.size(), "one flag per graph output");
  std::vector<BufferLife> tensors = lives;
  for (size_t k = 0; k < placed.size(); ++k)
    if (placed[k]) {
      PT_CHECK(placeable[k], "graph output " + std::to_string(k) + " cannot be placed");
      tensors[static_cast<size_t>(output_buffer[k])].bytes = 0;
    }
  return plan_memory(std::move(tensors));
}

}  // namespace pt
