#include "autodiff/chunk_backward.h"

#include <fnmatch.h>

#include "core/error.h"
#include "partition/cost_model.h"
#include "partition/cut.h"

namespace pt {

std::vector<std::string> frozen_parameters(const Graph& g,
                                           const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (ValueId v : g.initializers) {
    const Value& val = g.value(v);
    if (!val.is_parameter()) continue;
    for (const std::string& p : patterns)
      if (fnmatch(p.c_str(), val.name.c_str(), 0) == 0) {
        out.push_back(val.name);
        break;
      }
  }
  return out;
}

std::vector<BackwardGraphs> build_chunk_backward(const Graph& g, const PartitionPlan& plan,
                                                 const ChunkBackwardOptions& options) {
  Graph model = g;
  const std::vector<std::string> frozen = frozen_parameters(g, options.frozen);
  for (const std::string& name : frozen) model.value(model.find(name)).constant = true;
  const std::vector<bool> needs = needs_gradient(model);
  std::vector<BackwardGraphs> out;
  for (const ChunkPlan& chunk : plan.chunks) {
    Graph cg = cut_chunk(model, chunk);
    BackwardOptions bo;
    for (ValueId v : chunk.inputs)
      if (needs[static_cast<size_t>(v)]) bo.grad_inputs.push_back(model.value(v).name);
    const bool last = chunk.index + 1 == static_cast<int>(plan.chunks.size());
    if (last && options.loss) {
      add_loss(cg, *options.loss);
      bo.loss_output = kLossOutput;
    }
    if (!options.recompute.empty())
      bo.recompute = options.recompute.size() == 1
                         ? options.recompute[0]
                         : options.recompute.at(static_cast<size_t>(chunk.device));
    out.push_back(build_backward(cg, bo));
  }
  return out;
}

}  // namespace pt
