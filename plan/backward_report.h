// plan/backward_report.h: the chunks' backward as `pipetrain partition --backward` shows it. In:
// a partition plan, each chunk's F, B and W graphs under the chosen recompute policy
// (autodiff/chunk_backward.h), and the same under each of kComparedPolicies. Out: per chunk the
// FLOPs of F, B (recompute included) and W (plan/chunk_costs.h chunk_work), the bytes F keeps
// for B and W and B passes W, what recompute adds; then kept bytes and extra FLOPs under each
// compared policy. A table for people, one JSON object for scripts; all per micro-batch.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autodiff/backward.h"
#include "autodiff/loss.h"
#include "core/ir.h"
#include "partition/partitioner.h"

namespace pt {

// The policies every report compares: none, selective, every:1, full.
extern const std::vector<std::string> kComparedPolicies;

// The step's FLOPs that recompute adds to: F + B + W of the chunk's graphs (chunk_work) less
// what B recomputes.
int64_t train_flops(const BackwardGraphs& b);

// The chunks' backward under each of kComparedPolicies (in that order) with this loss and these
// frozen parameters: [policy][chunk].
std::vector<std::vector<BackwardGraphs>> compared_runs(const Graph& g, const PartitionPlan& plan, const LossSpec& loss,
                                                       const std::vector<std::string>& frozen);

// `chosen`: the chunks under `recompute`; `runs`: compared_runs.
void print_backward(std::ostream& os, const PartitionPlan& plan, const std::vector<BackwardGraphs>& chosen,
                    const std::vector<std::vector<BackwardGraphs>>& runs, const std::string& recompute);
// The same figures as JSON: bytes as numbers, extra FLOPs as percents of train_flops.
nlohmann::json backward_json(const PartitionPlan& plan, const std::vector<BackwardGraphs>& chosen,
                             const std::vector<std::vector<BackwardGraphs>>& runs, const std::string& recompute);

}  // namespace pt
