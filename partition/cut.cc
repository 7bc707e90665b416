#include "partition/cut.h"

#include <set>

#include "core/error.h"

namespace pt {

Graph cut_chunk(const Graph& g, const ChunkPlan& chunk) {
  std::set<ValueId> visible(chunk.inputs.begin(), chunk.inputs.end());
  std::vector<Node> nodes;
  for (int i = chunk.begin; i < chunk.end; ++i) {
    const Node& n = g.nodes[static_cast<size_t>(i)];
    for (ValueId v : n.inputs)
      PT_CHECK(v == kNoValue || visible.count(v) || g.value(v).is_initializer(),
               "chunk " + std::to_string(chunk.index) + " reads '" + g.value(v).name +
                   "' which does not cross into it");
    for (ValueId v : n.outputs)
      if (v != kNoValue) visible.insert(v);
    nodes.push_back(n);
  }
  for (ValueId v : chunk.outputs)
    PT_CHECK(visible.count(v), "chunk output '" + g.value(v).name + "' is neither made nor received");
  return extract_subgraph(g, g.name + "_chunk" + std::to_string(chunk.index), nodes, chunk.inputs,
                          chunk.outputs);
}

}  // namespace pt
