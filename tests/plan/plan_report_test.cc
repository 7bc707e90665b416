#include "plan/plan_report.h"

#include <gtest/gtest.h>

namespace pt {
namespace {

PlanCandidate candidate(const std::string& kind, int chunks, double step_s) {
  PlanCandidate c;
  c.kind = kind;
  c.chunks = chunks;
  c.step_s = step_s;
  return c;
}

// Runner-ups: the first (fastest) candidate of each (kind, chunks) in the search's order, the
// best plan's own group left out.
TEST(PlanReport, RunnerUpsAreTheFirstOfEachOtherKindAndChunking) {
  PlanSearch s;
  s.candidates = {candidate("zb-v", 2, 1.0), candidate("1f1b", 1, 1.5), candidate("zb-v", 2, 1.1),
                  candidate("1f1b", 1, 1.6), candidate("zb-h1", 1, 1.7), candidate("zb-v", 1, 1.8)};
  const std::vector<const PlanCandidate*> ups = runner_ups(s);
  ASSERT_EQ(ups.size(), 3u);
  EXPECT_EQ(ups[0], &s.candidates[1]);
  EXPECT_EQ(ups[1], &s.candidates[4]);
  EXPECT_EQ(ups[2], &s.candidates[5]);
  EXPECT_EQ(plan_search_json(PlanRequest{}, s)["runner_ups"].size(), 3u);
}

TEST(PlanReport, FormatMs) {
  EXPECT_EQ(format_ms(0.00013), "0.130 ms");
  EXPECT_EQ(format_ms(1.5), "1500.000 ms");
}

}  // namespace
}  // namespace pt
