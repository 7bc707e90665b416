// partition/partition_report.h: a PartitionPlan's text and JSON forms (what `pipetrain partition`
// prints). In: the graph the plan was made on and the plan. Out: a table for people, one JSON
// object for scripts; both list per chunk its device, nodes, parameters, FLOPs, memory, share of
// the cost, link time, and the tensors crossing into and out of it.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ir.h"
#include "partition/partitioner.h"

namespace pt {

// The plan as one JSON object: strategy, devices, chunks_per_stage, total_cost, link, imbalance,
// and per chunk ("stages") the figures of the table below with bytes and FLOPs as numbers,
// link_in_s / link_out_s in seconds at the link's device rate, share of total_cost in [0, 1].
nlohmann::json partition_json(const Graph& g, const PartitionPlan& plan);

// The plan as a table: a header line naming model_path and micro_batch, the link when it prices
// transfers, a row per chunk with its in: and out: tensors, and the imbalance.
void print_partition_table(std::ostream& os, const Graph& g, const PartitionPlan& plan,
                           const std::string& model_path, int64_t micro_batch);

// Tensors as [{name, shape, dtype}], in the order given.
nlohmann::json tensors_json(const Graph& g, const std::vector<ValueId>& ids);

// 1234567 -> "1.23M": a count or FLOPs for a table (3 significant digits, K/M/G/T/P; below 1000
// the integer).
std::string format_count(double x);

}  // namespace pt
