#include "partition/initializer_roles.h"

#include "partition/cost_model.h"

namespace pt {

std::vector<InitializerRole> initializer_roles(const Graph& g) {
  const std::vector<bool> reached = gradient_reaches(g);
  std::vector<InitializerRole> out;
  for (ValueId v : g.initializers) {
    const Value& val = g.value(v);
    if (!val.is_parameter()) continue;
    InitializerRole r{val.name, reached[static_cast<size_t>(v)], ""};
    if (!r.trained) {
      for (int n : val.consumers) {
        const Node& node = g.nodes[static_cast<size_t>(n)];
        if (node.op_type == "BatchNormalization") r.why = "BatchNorm running statistic";
      }
      if (r.why.empty()) r.why = "read only where no gradient flows, e.g. a mask";
    }
    out.push_back(r);
  }
  for (const auto& [name, why] : g.buffers) out.push_back({name, false, why});
  return out;
}

}  // namespace pt
