#include "plan/chunk_costs.h"

#include "core/error.h"
#include "plan/pipeline.h"

namespace pt {

ChunkWork chunk_work(const BackwardGraphs& chunk) {
  return {total_cost(estimate_costs(chunk.forward)), total_cost(estimate_costs(chunk.backward_input)),
          total_cost(estimate_costs(chunk.backward_weight))};
}

double work_units(const NodeCost& total) {
  return static_cast<double>(total.flops_fwd + total.byte_flops() + total.launch) * 1e-9;
}

double action_units(const NodeCost& total) {
  return total.launch > 0 ? work_units(total) + static_cast<double>(kFlopsPerAction) * 1e-9 : 0;
}

Costs chunk_costs(const std::vector<BackwardGraphs>& chunks, const std::vector<int>& devices) {
  PT_CHECK(devices.empty() || devices.size() == chunks.size(), "one device per chunk");
  // Whether chunks i and j both exist and run on different devices.
  const auto apart = [&](size_t i, size_t j) {
    return !devices.empty() && i < chunks.size() && j < chunks.size() && devices[i] != devices[j];
  };
  const double received = static_cast<double>(kFlopsPerReceivedAction) * 1e-9;
  Costs costs;
  costs.bytes = true;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const BackwardGraphs& b = chunks[i];
    const ChunkWork work = chunk_work(b);
    ChunkCost c;
    c.f = action_units(work.f);
    c.b = action_units(work.b);
    c.w = action_units(work.w);
    if (i > 0 && apart(i - 1, i) && c.f > 0) c.f += received;
    if (apart(i, i + 1) && c.b > 0) c.b += received;
    c.activation = static_cast<double>(b.kept_bytes);
    c.w_keep = static_cast<double>(b.passed_bytes);
    for (const std::string& k : b.kept_for_weight)
      c.w_keep += static_cast<double>(b.forward.value(b.forward.find(k)).type.bytes());
    c.comm = 0;
    costs.chunks.push_back(c);
  }
  return costs;
}

Costs chunk_costs(const std::vector<BackwardGraphs>& chunks, const PartitionPlan& plan) {
  PT_CHECK(chunks.size() == plan.chunks.size(), "one BackwardGraphs per planned chunk");
  std::vector<int> devices;
  for (const ChunkPlan& c : plan.chunks) devices.push_back(c.device);
  Costs costs = chunk_costs(chunks, devices);
  for (size_t c = 0; c < chunks.size(); ++c)
    costs.chunks[c].comm = static_cast<double>(plan.chunks[c].link_out) * 1e-9;  // FLOP-equivalents
  return costs;
}

namespace {

// The first node with an output that carries a gradient (the embedding, the first layer): cut
// after it, the rest of the model is a chunk whose input carries a gradient, as every chunk but
// the first of a pipeline is. -1 when there is none or it is the last node.
int first_gradient_node(const Graph& g) {
  const std::vector<bool> needs = needs_gradient(g);
  for (size_t i = 0; i + 1 < g.nodes.size(); ++i)
    for (ValueId o : g.nodes[i].outputs)
      if (o != kNoValue && needs[static_cast<size_t>(o)]) return static_cast<int>(i);
  return -1;
}

}  // namespace

ModelWork model_work(const Graph& imported) {
  try {
    const Graph g = training_form(imported, {}, false);
    PartitionSpec a;
    a.stages = 1;
    a.link.preset = "none";
    const int cut = first_gradient_node(g);
    if (cut >= 0) {
      a.stages = 2;
      a.strategy = "manual";
      a.cut_after = {g.nodes[static_cast<size_t>(cut)].name};
    }
    const PartitionOptions po = partition_options(a, [](const std::string& key) { return key; });
    const PartitionPlan plan = plan_partition(g, estimate_costs(g), po);
    ModelWork out;
    for (const BackwardGraphs& chunk : build_chunk_backward(g, plan, ChunkBackwardOptions{})) {
      const ChunkWork w = chunk_work(chunk);
      out.work.f = total_cost({out.work.f, w.f});
      out.work.b = total_cost({out.work.b, w.b});
      out.work.w = total_cost({out.work.w, w.w});
    }
    if (cut >= 0) out.cut_after = po.cut_after[0];
    return out;
  } catch (const UserError& e) {
    const NodeCost total = total_cost(estimate_costs(imported));
    ModelWork w;
    w.work.f.flops_fwd = total.flops_fwd;
    w.work.b.flops_fwd = total.flops_bwd_input;
    w.work.w.flops_fwd = total.flops_bwd_weight;
    w.why_estimated = e.what();
    return w;
  }
}

}  // namespace pt
