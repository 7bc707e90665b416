#include "autodiff/chunk_backward.h"

#include <fnmatch.h>

#include <algorithm>

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

namespace {

// Graph outputs that carry no gradient and that no node reads (BatchNormTraining's batch
// statistics, autodiff/training_mode.h): results on the side of the pipeline.
std::vector<ValueId> side_outputs(const Graph& g) {
  std::vector<ValueId> out;
  for (ValueId v : g.outputs) {
    const Value& val = g.value(v);
    if (val.producer < 0 || !val.consumers.empty()) continue;
    const Node& n = g.nodes[static_cast<size_t>(val.producer)];
    const auto k = std::find(n.outputs.begin(), n.outputs.end(), v) - n.outputs.begin();
    if (!output_differentiable(n, static_cast<size_t>(k))) out.push_back(v);
  }
  return out;
}

// The plan's chunk with side outputs kept home: each is an output of the chunk that makes it,
// and neither crosses into nor out of any other chunk (the plan carries graph outputs to the
// last chunk).
ChunkPlan keep_side_outputs_home(const Graph& g, ChunkPlan c, const std::vector<ValueId>& side) {
  const auto made_here = [&](ValueId v) {
    return g.value(v).producer >= c.begin && g.value(v).producer < c.end;
  };
  const auto is_side = [&](ValueId v) { return std::count(side.begin(), side.end(), v) != 0; };
  std::erase_if(c.inputs, is_side);
  std::erase_if(c.outputs, [&](ValueId v) { return is_side(v) && !made_here(v); });
  for (ValueId v : side)
    if (made_here(v) && !std::count(c.outputs.begin(), c.outputs.end(), v)) c.outputs.push_back(v);
  return c;
}

}  // namespace

std::vector<BackwardGraphs> build_chunk_backward(const Graph& g, const PartitionPlan& plan,
                                                 const ChunkBackwardOptions& options) {
  Graph model = g;
  model.rebuild_uses();
  const std::vector<ValueId> side = side_outputs(model);
  const std::vector<std::string> frozen = frozen_parameters(g, options.frozen);
  for (const std::string& name : frozen) model.value(model.find(name)).constant = true;
  const std::vector<bool> needs = needs_gradient(model);
  std::vector<BackwardGraphs> out;
  for (const ChunkPlan& planned : plan.chunks) {
    const ChunkPlan chunk = keep_side_outputs_home(model, planned, side);
    Graph cg = cut_chunk(model, chunk);
    BackwardOptions bo;
    for (ValueId v : chunk.inputs)
      if (needs[static_cast<size_t>(v)]) bo.grad_inputs.push_back(model.value(v).name);
    const bool last = chunk.index + 1 == static_cast<int>(plan.chunks.size());
    if (last && options.loss) {
      add_loss(cg, *options.loss);
      bo.loss_output = kLossOutput;
    }
    if (!options.recompute.empty()) {
      const size_t n = options.recompute.size();
      bo.recompute = n == 1                  ? options.recompute[0]
                     : n == plan.chunks.size() ? options.recompute[static_cast<size_t>(chunk.index)]
                                             : options.recompute.at(static_cast<size_t>(chunk.device));
    }
    out.push_back(build_backward(cg, bo));
  }
  return out;
}

}  // namespace pt
