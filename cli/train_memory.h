// cli/train_memory.h: `train`'s memory, planned before loading and measured after the last step.
// In: the config, the TrainerPlan (its chunks, schedule and planned costs: plan/memory.h counts
// them) and the ranks. Out: per device and per rank what the plan needs; the check that stops a
// run before loading when a host (or a GPU) has less free than the ranks (devices) on it need;
// and the lines the summary prints: the plan per device, and per rank its peak RSS beside the
// planned figure.
#pragma once

#include <iosfwd>
#include <vector>

#include "cli/config.h"
#include "plan/memory.h"
#include "train/train_ranks.h"
#include "train/trainer.h"

namespace pt {

struct TrainMemory {
  MemoryNeeds needs;
  std::vector<std::vector<int>> devices_of_rank;  // [world rank]: the pipeline devices it holds
  bool on_gpu = false;                            // device: cuda
  int64_t rows = 1;                               // of a micro-batch (dims.batch)

  // Host memory rank r needs (MemoryNeeds::process_bytes of its devices).
  int64_t rank_bytes(int r) const { return needs.process_bytes(devices_of_rank[static_cast<size_t>(r)], on_gpu); }
};

TrainMemory planned_memory(const TrainConfig& cfg, const TrainerPlan& plan, const TrainRanks& ranks);

// Before loading: the ranks on this host against its available memory (train/host_memory.h),
// and with device: cuda each GPU against its free memory. A UserError naming both figures and
// what would fit; nothing with memory.check: off or where the host's memory is unknown.
void check_memory(const TrainConfig& cfg, const TrainMemory& m, const TrainRanks& ranks);

// The start line: what this host's ranks plan against what it has.
void print_memory_plan(std::ostream& os, const TrainMemory& m, const TrainRanks& ranks);

// After the last step, on every rank (the peak RSS of each comes to every rank): a line per
// device with the plan's figures, and a line with each rank's peak RSS beside its planned host
// memory.
void print_memory_summary(std::ostream& os, const TrainMemory& m, const TrainRanks& ranks);

}  // namespace pt
