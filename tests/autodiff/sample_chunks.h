// tests/autodiff/sample_chunks.h: a sample model (samples/<name>/<name>.onnx, read from the
// source root, ctest's working directory) imported with its batch dimension bound, and its F/B/W
// chunk graphs with the cross-entropy loss, as the autodiff and exec tests build them.
// Header-only.
#pragma once

#include <string>
#include <vector>

#include "autodiff/chunk_backward.h"
#include "autodiff/loss.h"
#include "onnx_import/import.h"
#include "partition/cost_model.h"

namespace pt::testing {

inline Graph load_sample(const std::string& name, int64_t batch) {
  ImportOptions o;
  o.batch = batch;
  return import_model("samples/" + name + "/" + name + ".onnx", o);
}

// g cut by the partitioner into `stages` stages of `chunks_per_stage` chunks, each chunk's F, B
// and W graphs under the recompute `policy` (RecomputePolicy::parse), the loss on the last.
inline std::vector<BackwardGraphs> sample_chunks(const Graph& g, int stages,
                                                 const std::string& policy = "none",
                                                 int chunks_per_stage = 1) {
  PartitionOptions po;
  po.stages = stages;
  po.chunks_per_stage = chunks_per_stage;
  const PartitionPlan plan = plan_partition(g, estimate_costs(g), po);
  ChunkBackwardOptions o;
  o.loss = LossSpec{};
  o.recompute = {RecomputePolicy::parse(policy, "test")};
  return build_chunk_backward(g, plan, o);
}

}  // namespace pt::testing
