// cli/schedule_args.h: the arguments of `pipetrain schedule`, filled by commands.cc and run by
// schedule_cmd.cc: generate (or read from CSV), check, simulate, draw and write a schedule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.h"

namespace pt {

struct ScheduleArgs {
  std::string kind;                 // a generator, or "auto"; empty with --from-csv
  int stages = 0;
  int micro_batches = 0;
  int chunks = 0;                   // per device; 0: the kind's default (auto: try 1 and 2)
  std::vector<double> costs;        // F,B,W for every stage, or F,B,W per stage (3*stages)
  double comm = 0;                  // time of one transfer between devices (0: --model's link)
  LinkArgs link;                    // --model: prices the transfers between chunks
  double w_keep = 0;                // fraction of F's activation that B leaves for W
  std::string model;                // costs from this model's cost model and partition
  int64_t micro_batch = 1;          // --model: binds the batch dimension
  std::vector<std::string> dims;    // --model: NAME=VALUE
  int64_t fuse_attention_from = kFusedAttentionMinKeys;  // --model: attention as one kernel from these keys
  bool fuse_attention_masks = true;  // --plan of a CUDA config in bf16/fp16: masked attention unfused
  std::string memory_limit;         // micro-batches of a stage; bytes ("8GiB") with --model
  std::string csv;                  // write the schedule here
  std::string from_csv;             // read, check and simulate this schedule
  std::string plan;                 // show this plan's schedule (`plan --write`)
  std::string svg;                  // draw the timeline here
  bool lowered = false;             // --csv writes sends, receives and STEP too
  bool json = false;
};

void add_schedule_options(CLI::App* cmd, ScheduleArgs* a);
int run_schedule(const ScheduleArgs& a);

}  // namespace pt
