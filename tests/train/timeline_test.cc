// train/timeline.h: the simulator's own timeline, read back as the executor measures it, gives back
// the costs it was simulated with: F, B and W per chunk (B + W where the schedule fuses them),
// and the transfer time between devices (comm), which `pipetrain train` adds to its prediction
// of a step from measured costs.
#include <gtest/gtest.h>

#include "train/timeline.h"
#include "plan/chunk_costs.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"
#include "tests/autodiff/sample_chunks.h"

namespace pt {
namespace {

// The executor's view of a simulated step: a device thread starts each action when it is done
// with the one before, so a receive waits from then until its message is there.
std::vector<std::vector<ActionTime>> as_measured(const Simulation& sim) {
  std::vector<std::vector<ActionTime>> out;
  for (const auto& list : sim.timeline) {
    out.emplace_back();
    double free = 0;
    for (const TimedAction& a : list) {
      const bool recv = a.action.op == Op::kRecvF || a.action.op == Op::kRecvB;
      out.back().push_back({recv ? std::min(free, a.start) : a.start, a.end});
      free = a.end;
    }
  }
  return out;
}

TEST(MeasuredCosts, ReadBackTheSimulatedCostsAndTransfers) {
  const Graph g = testing::load_sample("mlp", 2);
  const std::vector<BackwardGraphs> chunks = testing::sample_chunks(g, 2, "none", 1);
  for (const char* kind : {"1f1b", "zb-h1"}) {
    SCOPED_TRACE(kind);
    const Schedule s = add_send_recv(generate(kind, 2, 4, 1));
    Costs costs = chunk_costs(chunks);
    costs.chunks[0].f = 1.0, costs.chunks[0].b = 1.5, costs.chunks[0].w = 0.5, costs.chunks[0].comm = 0.25;
    costs.chunks[1].f = 2.0, costs.chunks[1].b = 2.5, costs.chunks[1].w = 1.0, costs.chunks[1].comm = 0;
    const Simulation sim = simulate(s, costs);
    const Costs got = measured_costs(chunk_costs(chunks), s, {as_measured(sim)});
    const bool fused = std::string(kind) == "1f1b";  // BW: B and W split in the FLOP ratio
    for (size_t c = 0; c < 2; ++c) {
      EXPECT_DOUBLE_EQ(got.chunks[c].f, costs.chunks[c].f) << c;
      EXPECT_DOUBLE_EQ(got.chunks[c].b + got.chunks[c].w, costs.chunks[c].b + costs.chunks[c].w) << c;
      if (!fused) {
        EXPECT_DOUBLE_EQ(got.chunks[c].w, costs.chunks[c].w) << c;
      }
    }
    EXPECT_NEAR(got.chunks[0].comm, 0.25, 1e-12);
    // Simulated again on what was read back: the same step.
    EXPECT_NEAR(simulate(s, got).makespan, sim.makespan, 1e-9);
  }
}

// ActionClock::kThreadCpu reads F, B and W from what the actions' threads spent, an action
// without its CPU time by its wall time; the transfers stay on the wall clock.
TEST(MeasuredCosts, ThreadCpuTimeWhereTheActionsHaveIt) {
  const Graph g = testing::load_sample("mlp", 2);
  const std::vector<BackwardGraphs> chunks = testing::sample_chunks(g, 2, "none", 1);
  const Schedule s = add_send_recv(generate("zb-h1", 2, 4, 1));
  Costs costs = chunk_costs(chunks);
  costs.chunks[0].f = 1.0, costs.chunks[0].b = 1.5, costs.chunks[0].w = 0.5, costs.chunks[0].comm = 0.25;
  costs.chunks[1].f = 2.0, costs.chunks[1].b = 2.5, costs.chunks[1].w = 1.0, costs.chunks[1].comm = 0;
  std::vector<std::vector<ActionTime>> times = as_measured(simulate(s, costs));
  for (size_t d = 0; d < times.size(); ++d)
    for (size_t i = 0; i < times[d].size(); ++i) {
      const Action& a = s.devices[d][i];
      // Chunk 1's W was not read (-1): its wall time stands.
      if (is_compute(a.op) && !(a.op == Op::kW && a.chunk == 1)) times[d][i].cpu = 0.5 * (times[d][i].end - times[d][i].start);
    }
  const Costs wall = measured_costs(chunk_costs(chunks), s, {times});
  const Costs cpu = measured_costs(chunk_costs(chunks), s, {times}, ActionClock::kThreadCpu);
  for (size_t c = 0; c < 2; ++c) {
    EXPECT_DOUBLE_EQ(wall.chunks[c].f, costs.chunks[c].f) << c;
    EXPECT_DOUBLE_EQ(cpu.chunks[c].f, 0.5 * costs.chunks[c].f) << c;
    EXPECT_DOUBLE_EQ(cpu.chunks[c].b, 0.5 * costs.chunks[c].b) << c;
    EXPECT_DOUBLE_EQ(cpu.chunks[c].comm, wall.chunks[c].comm) << c;
  }
  EXPECT_DOUBLE_EQ(cpu.chunks[0].w, 0.25);
  EXPECT_DOUBLE_EQ(cpu.chunks[1].w, 1.0);
}

}  // namespace
}  // namespace pt
