// plan/backward_report.h: what `partition --backward` compares. Recompute moves FLOPs into B
// without changing the step's own FLOPs (train_flops), and keeps fewer bytes.
#include "plan/backward_report.h"

#include <gtest/gtest.h>

#include "plan/chunk_costs.h"
#include "tests/autodiff/sample_chunks.h"

namespace pt {
namespace {

TEST(BackwardReport, RecomputeAddsToBNotToTheStepsFlops) {
  const Graph g = testing::load_sample("gpt", 2);
  PartitionOptions po;
  po.stages = 2;
  const PartitionPlan plan = plan_partition(g, estimate_costs(g), po);
  const std::vector<std::vector<BackwardGraphs>> runs = compared_runs(g, plan, LossSpec{}, {});
  ASSERT_EQ(runs.size(), kComparedPolicies.size());
  ASSERT_EQ(kComparedPolicies.front(), "none");
  ASSERT_EQ(kComparedPolicies.back(), "full");
  const std::vector<BackwardGraphs>& none = runs.front();
  const std::vector<BackwardGraphs>& full = runs.back();
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    const ChunkWork w = chunk_work(none[c]);
    EXPECT_EQ(none[c].recompute_flops, 0) << c;
    EXPECT_EQ(train_flops(none[c]), w.f.flops_fwd + w.b.flops_fwd + w.w.flops_fwd) << c;
    EXPECT_GT(full[c].recompute_flops, 0) << c;
    EXPECT_EQ(train_flops(full[c]), train_flops(none[c])) << c;
    EXPECT_LT(full[c].kept_bytes, none[c].kept_bytes) << c;
  }
}

}  // namespace
}  // namespace pt
