// schedule/costs.h: what each chunk's actions cost, as plain numbers. The schedule library never
// sees graphs: the CLI fills these from the cost model and partitioner, tests write them by hand.
//
// Times are in any one unit (unit costs, FLOPs, measured ms). Activation amounts are bytes when
// `bytes` is set, otherwise units where 1 is what one micro-batch leaves on a whole stage.
#pragma once

#include <vector>

namespace pt {

struct ChunkCost {
  double f = 1, b = 1, w = 1;  // forward, input-gradient, weight-gradient time
  double activation = 1;       // kept by F until B (and part of it until W), per micro-batch
  double w_keep = 0;           // of `activation`, what B leaves for W (released by W)
  double comm = 0;             // time to move this chunk's output to chunk c+1 (and its gradient back)
};

struct Costs {
  std::vector<ChunkCost> chunks;  // forward order, stages * chunks_per_stage of them
  bool bytes = false;             // activation amounts are bytes

  // What one micro-batch leaves on one whole stage: the sum over chunks / stages.
  double stage_activation(int stages) const;
};

// Per whole stage F = B = W = 1 and activation 1; a chunk is 1/V of a stage. Comm 0.
Costs unit_costs(int stages, int chunks_per_stage);
// Per-stage costs (one entry per stage, possibly uneven) split evenly into V chunks per stage;
// stage s's chunks are the consecutive chunks s*V .. s*V+V-1 in forward order of the model.
Costs split_stages(const std::vector<ChunkCost>& per_stage, int chunks_per_stage);

}  // namespace pt
