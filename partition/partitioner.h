// partition/partitioner.h: Graph + per-node costs -> PartitionPlan (chunks of consecutive nodes,
// each with the tensors crossing into and out of it).
//
// Nodes are taken in the graph's topological order; a chunk is a contiguous range of it. With
// chunks_per_stage = v > 1 there are v*stages chunks; for v = 2 they sit in a V on the devices
// (chunk i and 2P-1-i on device i), otherwise round-robin (chunk c on device c mod P).
//
// Balanced cuts (every strategy but manual): each chunk holds at least one node with forward
// FLOPs, so that no stage is left with data movement alone (a Transpose, a Reshape) while the
// others compute. A graph with M such nodes takes at most M chunks, M / v stages at v chunks per
// stage; more is a UserError naming that count. Manual cuts are the user's: any non-empty chunk.
#pragma once

#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/error.h"
#include "core/ir.h"
#include "partition/cost_model.h"
#include "partition/linear_partition.h"
#include "partition/link.h"

namespace pt {

enum class Strategy {
  kBalanced,  // minimise the largest chunk cost (compute and bytes moved), exactly
  kParams,    // equal parameter bytes per chunk (DeepSpeed's default)
  kUniform,   // equal node counts
  kManual,    // cut after the named nodes
};

Strategy parse_strategy(const std::string& name);  // UserError on an unknown name
const char* strategy_name(Strategy s);

struct PartitionOptions {
  int stages = 1;
  int chunks_per_stage = 1;
  Strategy strategy = Strategy::kBalanced;
  std::vector<std::string> cut_after;  // kManual: stages*chunks_per_stage - 1 node names
  MemoryModel memory;                  // limit per device (0: none)
  // Balanced and manual: a chunk's time is its cost plus the transfers it waits for, the
  // activations crossing its first cut and their gradients crossing its last (link.h).
  LinkModel link;
  // Splits within (1 + slack) of the best bottleneck count as balanced; among them the one
  // moving the fewest bytes across cuts wins (cuts between blocks rather than inside them).
  double slack = 0.02;
};

// A partition as users ask for it (`partition`'s flags, `train`'s pipeline config), in text.
struct PartitionSpec {
  int stages = 0;
  int chunks_per_stage = 1;
  std::string strategy = "balanced";  // balanced | params | uniform | manual
  std::vector<std::string> cut_after;
  std::string memory_limit;           // "8GiB", "512MB", bytes; empty: none
  double slack = 0.02;
  LinkArgs link;
};

// The one place PartitionOptions are filled. place(key) names where a value came from in errors,
// for the keys "strategy", "memory-limit", "link", "bandwidth" and "latency" ("--link", or a
// config's line). UserError for an unknown strategy, a bad size or link, manual without cuts.
template <typename Place>
PartitionOptions partition_options(const PartitionSpec& s, Place place) {
  PartitionOptions o;
  o.stages = s.stages;
  o.chunks_per_stage = s.chunks_per_stage;
  o.strategy = parse_strategy(s.strategy);
  o.cut_after = s.cut_after;
  o.slack = s.slack;
  o.link = link_model(s.link, place);
  if (!s.memory_limit.empty()) o.memory.limit = parse_bytes(s.memory_limit, place("memory-limit"));
  if (o.strategy == Strategy::kManual && s.cut_after.empty())
    throw UserError(place("strategy") + " manual", "needs the nodes to cut after", "pass --cut-after NODE,NODE,...");
  return o;
}

struct ChunkPlan {
  int index = 0;   // position in the pipeline (forward order)
  int device = 0;
  int begin = 0;   // first node
  int end = 0;     // one past the last node
  std::vector<ValueId> inputs;    // tensors crossing in (graph inputs, activations, carried ones)
  std::vector<ValueId> outputs;   // tensors crossing out (the last chunk: the graph's outputs)
  std::vector<ValueId> params;    // trainable parameters the chunk reads (a shared one: each)
  int64_t param_count = 0;
  int64_t param_bytes = 0;
  int64_t flops_fwd = 0;
  int64_t flops_bwd = 0;          // B + W
  int64_t activation_bytes = 0;   // kept per micro-batch: saved outputs plus received inputs
  int64_t cost = 0;               // NodeCost::cost() summed
  int64_t link_in = 0;            // what receiving its inputs costs, in cost units (link.h)
  int64_t link_out = 0;           // what sending its outputs (and receiving their gradients) costs
  int64_t memory = 0;             // under the MemoryModel, for its device
};

struct PartitionPlan {
  Strategy strategy = Strategy::kBalanced;
  int devices = 1;
  int chunks_per_stage = 1;
  std::vector<ChunkPlan> chunks;  // forward order
  int64_t total_cost = 0;
  double imbalance = 1.0;         // largest device time / mean device time
  LinkModel link;                 // what the transfers were priced at

  int64_t device_cost(int device) const;
  int64_t device_time(int device) const;  // its chunks' costs plus their links
};

PartitionPlan plan_partition(const Graph& g, const std::vector<NodeCost>& costs,
                             const PartitionOptions& opts);

// The most chunks balanced cuts allow: the nodes with forward FLOPs (every node when none has).
int most_chunks(const std::vector<NodeCost>& costs);

// The flat problem the solver sees (exposed for tests and benchmarks); cut_cost priced by `link`.
LinearProblem linear_problem(const Graph& g, const std::vector<NodeCost>& costs,
                             const LinkModel& link = {});

}  // namespace pt
