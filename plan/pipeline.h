// plan/pipeline.h: the one function from a pipeline config to chunks, cuts and a schedule. In:
// the graph in training form (training_form below), a PipelineConfig (`train`'s pipeline: keys,
// cli/config.h), the loss and the frozen parameters. Out: a PipelinePlan: the compute schedule
// and the lowered one the executor runs, the partition placed by the schedule, each chunk's F, B
// and W graphs, and their costs.
//
//   pipeline.plan: auto  the planner's best plan under memory_limit (plan/planner.h): its
//                        schedule run as is, its cuts and its recompute policies;
//   otherwise            the schedule the config names (plan/schedule_choice.h: a kind, auto or a
//                        CSV file), then the cuts it asks for at that schedule's chunks.
//
// The schedule is made here once; from then on it owns the micro-batch count (train/trainer.h).
// Errors are UserErrors naming the config key through PipelineRequest::where.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autodiff/chunk_backward.h"
#include "autodiff/loss.h"
#include "core/ir.h"
#include "partition/link.h"
#include "partition/partitioner.h"
#include "schedule/costs.h"
#include "schedule/schedule.h"

namespace pt {

struct PipelineConfig {
  int stages = 1;
  int chunks = 0;              // chunks per device; 0: the schedule kind's default (2 for V kinds)
  int micro_batches = 1;
  std::string schedule = "1f1b";
  std::string partition = "balanced";  // balanced | params | uniform | manual
  std::vector<std::string> cut_after;  // manual: the nodes each cut follows
  std::string recompute = "none";
  std::string memory_limit;    // per device; empty: none
  LinkArgs link{"", "", "", 0};  // preset "": PipelineRequest::default_link
  std::string plan;            // "auto": plan/planner.h picks schedule, chunks and recompute
};

struct PipelineRequest {
  PipelineConfig config;
  LossSpec loss;
  std::vector<std::string> frozen;  // names or globs
  // The preset that prices transfers where config.link names none: cpu, or nvlink with CUDA.
  std::string default_link = "cpu";
  // False when the schedule was given on the command line and the chunks were not: the chunks
  // are the file's, for the file's schedule; a kind that does not take them runs its default
  // and says so.
  bool chunks_for_schedule = true;
  // Where a key ("pipeline.stages", "model") sits, for errors.
  std::function<std::string(const std::string& key)> where;
};

struct PipelinePlan {
  Schedule schedule;                   // compute actions only
  Schedule lowered;                    // with sends and receives: what the executor runs
  std::vector<BackwardGraphs> chunks;  // in chunk order, placed by the schedule
  Costs planned;                       // the chunks counted (plan/chunk_costs.h)
  PipelineConfig chosen;               // the config with plan: auto's choices filled in
  std::vector<std::string> notes;      // a line for each choice the config did not spell out
};

PipelinePlan plan_pipeline(const Graph& train, const PipelineRequest& r);

// The graph `train` trains: training mode (autodiff/training_mode.h; dropout on or off) and
// parameter sites split (autodiff/parameter_sites.h) with `frozen` (names or globs) left out.
Graph training_form(Graph g, const std::vector<std::string>& frozen, bool dropout);

// `recompute`: one policy, one per device, or one per chunk (forward order), separated by
// commas. UserError naming "--recompute" for another count.
ChunkBackwardOptions backward_options(const LossSpec& loss, const std::string& recompute,
                                      const std::vector<std::string>& frozen, int devices, int chunks);

}  // namespace pt
