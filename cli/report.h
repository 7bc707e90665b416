// cli/report.h: what `inspect`, `ops` and `train`'s summary print. Tables for people, JSON for scripts;
// a partition plan's forms are partition/partition_report.h's.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ir.h"
#include "partition/partition_report.h"  // partition_json, print_partition_table, format_count
#include "plan/chunk_costs.h"
#include "schedule/costs.h"
#include "schedule/schedule.h"

namespace pt {

void print_inspect(std::ostream& os, const Graph& g, const std::vector<NodeCost>& costs, const ModelWork& work,
                   const std::string& model_path, int64_t micro_batch, bool list_nodes);
nlohmann::json inspect_json(const Graph& g, const std::vector<NodeCost>& costs, const ModelWork& work);

void print_op_table(std::ostream& os);

// For a model whose weights the file holds in float16/bfloat16 (Graph::file_dtypes), one line:
// they train in float32 and are written back in which dtype (float32_out: output.dtype fp32).
// "" for any other model.
std::string half_weights_line(const Graph& g, bool float32_out = false);

// `train`'s summary: per chunk, F, B and W measured (ms, the median action) beside what the cost
// model plans (plan/chunk_costs.h work units), the units turned into ms at one rate for the whole
// run (all measured F+B+W time over all planned F+B+W units), so each chunk's ratio says how far
// the model's share for it is from the measured share. Where `s` fuses B and W (BW actions) only
// B+W was measured and is shown as one column. thread_cpu: `measured` holds what the actions'
// threads spent (train/timeline.h ActionClock::kThreadCpu), else their wall time; the header
// says which.
void print_chunk_times(std::ostream& os, const Schedule& s, const Costs& planned, const Costs& measured,
                       bool thread_cpu);

}  // namespace pt
