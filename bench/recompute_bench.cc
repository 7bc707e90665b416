// Kept activation bytes per micro-batch and recompute FLOPs of every recompute policy, per sample
// model, summed over the stages of a balanced partition. Usage:
//   recompute_bench STAGES MICRO_BATCH model.onnx [model.onnx ...]
// Prints one row per (model, policy): kept bytes, the factor below `none`, recompute FLOPs as a
// share of the step's F+B+W FLOPs (cost model), and the bytes B hands W.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "autodiff/chunk_backward.h"
#include "core/error.h"
#include "onnx_import/import.h"
#include "partition/cost_model.h"
#include "partition/linear_partition.h"
#include "plan/chunk_costs.h"

namespace {

struct Sums {
  int64_t kept = 0, passed = 0, recompute = 0, train = 0;
};

Sums measure(const pt::Graph& g, const pt::PartitionPlan& plan, const std::string& policy) {
  pt::ChunkBackwardOptions o;
  o.loss = pt::LossSpec{};
  o.recompute = {pt::RecomputePolicy::parse(policy, "policy")};
  Sums s;
  for (const pt::BackwardGraphs& b : pt::build_chunk_backward(g, plan, o)) {
    s.kept += b.kept_bytes;
    s.passed += b.passed_bytes;
    s.recompute += b.recompute_flops;
    const pt::ChunkWork w = pt::chunk_work(b);  // B's graph holds the recomputed nodes
    s.train += w.f.flops_fwd + w.b.flops_fwd + w.w.flops_fwd - b.recompute_flops;
  }
  return s;
}

// Half of what `none` keeps on the stage that keeps the most.
int64_t half_budget(const pt::Graph& g, const pt::PartitionPlan& plan) {
  pt::ChunkBackwardOptions o;
  o.loss = pt::LossSpec{};
  int64_t most = 0;
  for (const pt::BackwardGraphs& b : pt::build_chunk_backward(g, plan, o))
    most = std::max(most, b.kept_bytes);
  return most / 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: recompute_bench STAGES MICRO_BATCH model.onnx...\n");
    return 2;
  }
  const int stages = std::stoi(argv[1]);
  try {
    std::printf("%-16s %-11s %12s %8s %8s %12s\n", "model", "policy", "kept/mb", "vs none",
                "extra", "B->W/mb");
    for (int k = 3; k < argc; ++k) {
      pt::ImportOptions io;
      io.batch = std::stoll(argv[2]);
      const pt::Graph g = pt::import_model(argv[k], io);
      pt::PartitionOptions po;
      po.stages = stages;
      const pt::PartitionPlan plan = pt::plan_partition(g, pt::estimate_costs(g), po);
      const Sums none = measure(g, plan, "none");
      std::string name = argv[k];
      name = name.substr(name.find_last_of('/') + 1);
      // budget:half asks for half of none's kept bytes, per stage (the budget is per micro-batch
      // on each stage, so the largest stage's half is what each stage gets).
      const std::string half = "budget:" + std::to_string(half_budget(g, plan));
      for (const std::string& policy : {std::string("none"), std::string("selective"),
                                        std::string("every:2"), std::string("every:1"),
                                        std::string("full"), half}) {
        const std::string shown = policy == half ? "budget:half" : policy;
        Sums s;
        try {
          s = policy == "none" ? none : measure(g, plan, policy);
        } catch (const pt::UserError& e) {
          std::printf("%-16s %-11s   (no plan fits)\n", name.c_str(), shown.c_str());
          continue;
        }
        std::printf("%-16s %-11s %12s %7.1fx %7.1f%% %12s\n", name.c_str(), shown.c_str(),
                    pt::format_bytes(s.kept).c_str(),
                    static_cast<double>(none.kept) / static_cast<double>(s.kept),
                    100.0 * static_cast<double>(s.recompute) / static_cast<double>(s.train),
                    pt::format_bytes(s.passed).c_str());
      }
    }
  } catch (const pt::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
