// autodiff/recompute.h: which forward tensors F keeps for the backward, and which forward nodes
// B re-runs to get the rest. In: a chunk's forward graph, the forward tensors its backward reads,
// a policy. Out: the kept set and the recomputed nodes, with their bytes and FLOPs.
//
// Policies (per stage, `--recompute` / `pipeline.recompute`):
//   none        keep every tensor the backward reads
//   full        keep only the chunk's inputs; B re-runs the forward
//   every:N     keep every N-th checkpoint (a tensor that alone is live between two nodes, such as
//               the residual stream between blocks), recompute between them (Chen et al.)
//   selective   keep the outputs of matmuls and convolutions with a weight; recompute the cheap
//               and large: element-wise, softmax, normalisation, data movement, and products of
//               two activations (attention's core, as in Megatron-LM's selective recompute)
//   budget:B    the kept set within B bytes per micro-batch with the least recompute FLOPs found
//               among the policies above and greedy additions to the best of them
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

struct RecomputePolicy {
  enum class Kind { kNone, kFull, kEvery, kSelective, kBudget };
  Kind kind = Kind::kNone;
  int64_t every = 0;         // kEvery: N
  int64_t budget_bytes = 0;  // kBudget: bytes per micro-batch

  // "none", "full", "every:2", "selective", "budget:64MiB"; UserError naming `where` otherwise.
  static RecomputePolicy parse(const std::string& text, const std::string& where);
  std::string str() const;
};

struct RecomputePlan {
  std::vector<ValueId> kept;        // forward values F keeps (chunk inputs included), ascending
  std::vector<int> recomputed;      // forward node indices B re-runs, ascending
  int64_t kept_bytes = 0;           // per micro-batch
  int64_t recompute_flops = 0;      // forward FLOPs of the recomputed nodes
};

// `needed`: forward values (not initializers) the backward nodes read. `g` is the forward graph.
RecomputePlan plan_recompute(const Graph& g, const std::vector<ValueId>& needed,
                             const RecomputePolicy& policy);

// Checkpoint candidates of g: values that alone are live between two nodes, in forward order.
std::vector<ValueId> checkpoint_candidates(const Graph& g);

}  // namespace pt
