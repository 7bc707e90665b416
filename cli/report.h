// cli/report.h: what the subcommands print. Tables for people, JSON for scripts.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ir.h"
#include "partition/partitioner.h"
#include "plan/chunk_costs.h"
#include "schedule/costs.h"
#include "schedule/schedule.h"

namespace pt {

nlohmann::json partition_json(const Graph& g, const PartitionPlan& plan);
void print_partition_table(std::ostream& os, const Graph& g, const PartitionPlan& plan,
                           const std::string& model_path, int64_t micro_batch);

// Every floating-point initializer and whether training updates it: trained when a gradient
// reaches it from an output, otherwise a buffer (`why` says which kind).
struct InitializerRole {
  std::string name;
  bool trained = true;
  std::string why;
};
std::vector<InitializerRole> initializer_roles(const Graph& g);

void print_inspect(std::ostream& os, const Graph& g, const std::vector<NodeCost>& costs, const ModelWork& work,
                   const std::string& model_path, int64_t micro_batch, bool list_nodes);
nlohmann::json inspect_json(const Graph& g, const std::vector<NodeCost>& costs, const ModelWork& work);

void print_op_table(std::ostream& os);

// `train`'s summary: per chunk, F, B and W measured (ms, mean per action) beside what the cost
// model plans (plan/chunk_costs.h work units), the units turned into ms at one rate for the whole
// run (all measured F+B+W time over all planned F+B+W units), so each chunk's ratio says how far
// the model's share for it is from the measured share. Where `s` fuses B and W (BW actions) only
// B+W was measured and is shown as one column.
void print_chunk_times(std::ostream& os, const Schedule& s, const Costs& planned, const Costs& measured);

// 1234567 -> "1.23M"; FLOPs and counts for tables.
std::string format_count(double x);

}  // namespace pt
