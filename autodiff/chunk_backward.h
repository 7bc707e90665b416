// autodiff/chunk_backward.h: the backward of every chunk of a partition plan. In: the imported
// model, its PartitionPlan, the loss and recompute policy. Out: one BackwardGraphs per chunk, in
// forward order; the last chunk carries the loss.
//
// A graph output that carries no gradient and that no node reads (the batch statistics of
// autodiff/training_mode.h) is an output of the F graph of the chunk that makes it, and of no
// other chunk: it does not travel down the pipeline as the plan's graph outputs do.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "autodiff/backward.h"
#include "autodiff/loss.h"
#include "autodiff/recompute.h"
#include "core/ir.h"
#include "partition/partitioner.h"

namespace pt {

struct ChunkBackwardOptions {
  std::optional<LossSpec> loss;              // none: the last chunk gets "grad.<output>" inputs
  std::vector<RecomputePolicy> recompute;    // one for all, one per chunk (forward order), or
                                             // one per device
  std::vector<std::string> frozen;           // parameter names or globs ("*.running_*")
};

std::vector<BackwardGraphs> build_chunk_backward(const Graph& g, const PartitionPlan& plan,
                                                 const ChunkBackwardOptions& options);

// Parameters of g matching a frozen name or glob.
std::vector<std::string> frozen_parameters(const Graph& g, const std::vector<std::string>& patterns);

}  // namespace pt
