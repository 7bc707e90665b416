#include "schedule/costs.h"

#include "core/error.h"

namespace pt {

double Costs::stage_activation(int stages) const {
  double sum = 0;
  for (const ChunkCost& c : chunks) sum += c.activation;
  return sum / stages;
}

Costs split_stages(const std::vector<ChunkCost>& per_stage, int chunks_per_stage) {
  PT_CHECK(chunks_per_stage >= 1);
  Costs out;
  const double v = chunks_per_stage;
  for (const ChunkCost& s : per_stage)
    for (int k = 0; k < chunks_per_stage; ++k)
      out.chunks.push_back({s.f / v, s.b / v, s.w / v, s.activation / v, s.w_keep / v, s.comm});
  return out;
}

Costs unit_costs(int stages, int chunks_per_stage) {
  return split_stages(std::vector<ChunkCost>(static_cast<size_t>(stages), ChunkCost{}),
                      chunks_per_stage);
}

}  // namespace pt
