// cli/args.h: the arguments of each subcommand as plain structs, filled by commands.cc from the
// command line and consumed by driver.cc.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "onnx_import/attention_fusion.h"
#include "partition/partitioner.h"

namespace CLI {
class App;
class Option;
}

namespace pt {

struct ModelArgs {
  std::string model;
  int64_t micro_batch = 1;
  bool micro_batch_given = false;  // --micro-batch was on the command line
  std::vector<std::string> dims;  // "name=value"
  std::vector<std::string> tied, untied, trained;  // initializer names or globs (onnx_import/module_params.h)
  int64_t fuse_attention_from = kFusedAttentionMinKeys;  // keys from which attention is one kernel
};

// How transfers between devices are priced (partition/link.h): a preset, then what the user
// overrides of it. `partition` and `schedule` take them as --link, --bandwidth, --latency and
// --device-rate; `train` as pipeline.link, bandwidth, latency and device_rate.
void add_link_args(CLI::App* cmd, LinkArgs* l);  // commands.cc

// --fuse-attention-from: the keys from which an attention runs as one CPU kernel
// (onnx_import/attention_fusion.h); `train` takes it as fuse_attention_from.
void add_fuse_attention_option(CLI::App* cmd, int64_t* from);  // commands.cc

// --plan FILE gives the keys these flags set: each is refused beside it (CLI11's "--plan excludes
// FLAG"), where the plan's value would silently replace the one given. commands.cc.
void plan_gives(CLI::App* cmd, CLI::Option* plan, std::initializer_list<const char*> flags);

// The pipeline keys of a plan written by `plan --write` (a train config), for `partition --plan`
// and `schedule --plan` (a flag for one of them beside --plan is refused: plan_gives).
struct PlanFile {
  std::string model;
  int64_t micro_batch = 1;
  std::vector<std::string> dims;  // the other dims, NAME=VALUE
  int stages = 1, chunks = 1, micro_batches = 1;
  std::string schedule;           // a kind or a CSV file
  std::string recompute;
  std::vector<std::string> cut_after;  // partition: manual; empty: balanced
  LinkArgs link;
  std::vector<std::string> frozen;
  bool dropout = true;
  int64_t fuse_attention_from = kFusedAttentionMinKeys;  // 0: unfused (device: cuda in fp32)
  bool fuse_attention_masks = true;  // false: attention reading a mask stays unfused (device: cuda)
};
PlanFile read_plan_file(const std::string& path);  // plan_cmd.cc

// The graph `train` trains (plan/pipeline.h training_form), with each attention over at least
// fuse_attention_from keys one kernel (0: none, as on a GPU in fp32; masked false: only those
// reading no mask, as on a GPU in bf16 or fp16): what `plan` prices, and what `partition --plan`
// and `schedule --plan` cut and cost, so that all three agree with train. (plan_cmd.cc)
Graph graph_train_runs(Graph g, const std::vector<std::string>& frozen, bool dropout, int64_t fuse_attention_from,
                       bool masked = true);

struct InspectArgs {
  ModelArgs model;
  bool nodes = false;  // list every node with its cost
  bool json = false;
};

// The backward's settings, shared by `partition --backward` and `grad`.
struct BackwardArgs {
  std::string loss = "cross_entropy";  // cross_entropy | mse | model
  std::string loss_output;             // model output the loss reads; empty: the first
  int64_t ignore_index = -100;
  std::string recompute = "none";      // a policy, or one per device or per chunk separated by commas
  std::vector<std::string> frozen;     // parameter names or globs that get no gradient
};

// stages (PartitionSpec's) is required unless --plan gives it.
struct PartitionArgs : PartitionSpec {
  ModelArgs model;
  std::string plan;          // a plan (`plan --write`): model, stages, chunks, link and the
                             // training graph's cuts from it
  std::string export_dir;
  bool json = false;
  bool backward = false;   // also build F, B, W per stage (report; export with --export)
  bool portable = false;   // exported backward graphs in standard ONNX ops only
  BackwardArgs bwd;
};

// `pipetrain plan`: the model, the devices and their memory; the planner chooses the rest.
struct PlanArgs {
  ModelArgs model;
  int devices = 1;
  std::string memory;        // per device: "80GiB"
  int64_t global_batch = 0;  // rows per step; 0: 2 x devices micro-batches
  std::string loss = "cross_entropy";
  std::string loss_output;
  std::vector<std::string> frozen;
  LinkArgs link;
  std::string write;         // the plan as a train config
  bool json = false;
};

void add_plan_options(CLI::App* cmd, PlanArgs* a);  // plan_cmd.cc

struct GradArgs {
  std::string model;
  std::vector<std::string> inputs;  // "name=file.npy", the global batch
  std::string target;               // .npy: int64 class indices, or floats for mse
  std::vector<std::string> dims;
  int stages = 1;
  int micro_batches = 1;
  int threads = 1;
  std::string output_dir;
  BackwardArgs bwd;
  int64_t fuse_attention_from = kFusedAttentionMinKeys;
};

struct RunArgs {
  std::string model;
  std::vector<std::string> inputs;  // "name=file.npy"
  std::vector<std::string> dims;    // "name=value"
  std::string output_dir;
  int threads = 1;
  int repeats = 1;  // forward passes timed; the median is printed
  int64_t fuse_attention_from = kFusedAttentionMinKeys;
};

struct TrainArgs {
  std::string config;            // the YAML file
  std::vector<std::string> set;  // "dotted.key=value" overrides
  bool resume = false;           // continue from checkpoint.dir's latest checkpoint
  bool overwrite = false;        // a fresh run clears checkpoint.dir's old checkpoints first
  bool quiet = false;            // no progress lines
  bool profile = false;          // time every kernel after the first step; print where time goes
};

// {"seq=32", "len=7"} -> {{"seq",32},{"len",7}}. Throws UserError naming --dim.
std::map<std::string, int64_t> parse_dims(const std::vector<std::string>& dims);

}  // namespace pt
