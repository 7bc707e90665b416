#include "plan/chunk_costs.h"

#include "core/error.h"

namespace pt {

ChunkWork chunk_work(const BackwardGraphs& chunk) {
  return {total_cost(estimate_costs(chunk.forward)), total_cost(estimate_costs(chunk.backward_input)),
          total_cost(estimate_costs(chunk.backward_weight))};
}

double work_units(const NodeCost& total) {
  return static_cast<double>(total.flops_fwd + kFlopsPerByte * (total.bytes_read + total.bytes_written) +
                             total.launch) *
         1e-9;
}

double action_units(const NodeCost& total) {
  return total.launch > 0 ? work_units(total) + static_cast<double>(kFlopsPerAction) * 1e-9 : 0;
}

Costs chunk_costs(const std::vector<BackwardGraphs>& chunks) {
  Costs costs;
  costs.bytes = true;
  for (const BackwardGraphs& b : chunks) {
    const ChunkWork work = chunk_work(b);
    ChunkCost c;
    c.f = action_units(work.f);
    c.b = action_units(work.b);
    c.w = action_units(work.w);
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
  Costs costs = chunk_costs(chunks);
  for (size_t c = 0; c < chunks.size(); ++c)
    costs.chunks[c].comm = static_cast<double>(plan.chunks[c].link_out) * 1e-9;  // FLOP-equivalents
  return costs;
}

}  // namespace pt
