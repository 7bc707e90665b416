// cli/driver.h: the one place that spells the chain out (import -> cost -> partition -> ...).
// Each subcommand runs the chain up to its link and prints what that link made. Returns the
// process exit code; UserErrors propagate to main, which prints them as one line.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "autodiff/chunk_backward.h"
#include "cli/args.h"
#include "cli/report.h"
#include "core/ir.h"
#include "onnx_import/declared_inputs.h"
#include "partition/partitioner.h"
#include "schedule/costs.h"

namespace pt {

int run_ops();
int run_inspect(const InspectArgs& a);
int run_partition(const PartitionArgs& a);
int run_forward(const RunArgs& a);
int run_grad(const GradArgs& a);
int run_train(const TrainArgs& a);
int run_plan(const PlanArgs& a);  // plan_cmd.cc

// "--" + key: where a command-line value came from.
std::string flag_name(const std::string& key);

// `partition --backward`: builds F, B and W per chunk, exports them with --export, prints the
// per-stage kept and passed bytes and recompute FLOPs to os, or with `json` puts them under its
// "backward" key instead.
void report_backward(std::ostream& os, nlohmann::json* json, const Graph& g, const PartitionPlan& plan,
                     const PartitionArgs& a);
// `recompute`: one policy, one per device, or one per chunk (forward order).
ChunkBackwardOptions chunk_backward_options(const BackwardArgs& a, int devices, int chunks);

// parse_dims(dims) (--dim NAME=VALUE), each NAME checked against the symbolic dims the model's
// inputs declare: UserError naming the --dim and listing the model's symbolic dims otherwise.
std::map<std::string, int64_t> model_dims(const std::string& path, const std::vector<std::string>& dims);
void check_dims_named(const std::map<std::string, int64_t>& dims, const std::vector<onnx::ValueInfoProto>& declared);

}  // namespace pt
