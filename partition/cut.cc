#include "partition/cut.h"

#include <map>

#include "core/error.h"

namespace pt {

Graph cut_chunk(const Graph& g, const ChunkPlan& chunk) {
  Graph out;
  out.name = g.name + "_chunk" + std::to_string(chunk.index);
  out.opsets = g.opsets;
  out.ir_version = g.ir_version;
  out.producer_name = g.producer_name;
  std::map<ValueId, ValueId> remap;  // id in g -> id in out
  auto map_value = [&](ValueId v) -> ValueId {
    if (v == kNoValue) return kNoValue;
    auto it = remap.find(v);
    if (it != remap.end()) return it->second;
    const Value& src = g.value(v);
    ValueId id;
    if (src.is_initializer()) {
      id = out.add_initializer(src.name, *src.init, src.constant);
    } else {
      id = out.add_value(src.name, src.type);
    }
    remap[v] = id;
    return id;
  };
  for (ValueId v : chunk.inputs) out.inputs.push_back(map_value(v));
  for (int i = chunk.begin; i < chunk.end; ++i) {
    const Node& n = g.nodes[static_cast<size_t>(i)];
    Node copy = n;
    for (ValueId& v : copy.inputs) {
      PT_CHECK(v == kNoValue || remap.count(v) || g.value(v).is_initializer() ||
                   (g.value(v).producer >= chunk.begin && g.value(v).producer < i),
               "chunk " + std::to_string(chunk.index) + " reads '" + g.value(v).name +
                   "' which does not cross into it");
      v = map_value(v);
    }
    for (ValueId& v : copy.outputs) v = map_value(v);
    out.add_node(std::move(copy));
  }
  for (ValueId v : chunk.outputs) {
    PT_CHECK(remap.count(v), "chunk output '" + g.value(v).name + "' is neither made nor received");
    out.outputs.push_back(remap.at(v));
  }
  out.rebuild_uses();
  return out;
}

}  // namespace pt
