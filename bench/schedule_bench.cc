// bench/schedule_bench.cc: how long schedules take to make, check and time.
//
//   schedule_bench [STAGES MICRO_BATCHES] [AUTO_STAGES AUTO_MICRO_BATCHES]
// For every kind at STAGES x MICRO_BATCHES (default 64 x 1024): generate, validate, lower
// (and validate the lowered form), simulate with unit costs; prints the seconds of each and
// their sum. Then `auto` at AUTO_STAGES x AUTO_MICRO_BATCHES (default 16 x 128) with uneven
// costs (every fourth stage 1.5x as heavy, W half of B) and a limit of half the stages'
// micro-batches of memory: its time, makespan, and the best hand-made kind that fits.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "schedule/auto.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"
#include "schedule/validate.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

pt::Costs uneven(int p, int v) {
  std::vector<pt::ChunkCost> stages;
  for (int s = 0; s < p; ++s) {
    const double k = s % 4 == 3 ? 1.5 : 1.0;
    stages.push_back({k, k, 0.5 * k, 1, 0, 0.05});
  }
  return pt::split_stages(stages, v);
}

}  // namespace

int main(int argc, char** argv) {
  const int P = argc > 2 ? std::atoi(argv[1]) : 64, M = argc > 2 ? std::atoi(argv[2]) : 1024;
  const int AP = argc > 4 ? std::atoi(argv[3]) : 16, AM = argc > 4 ? std::atoi(argv[4]) : 128;
  try {
    std::printf("%-12s %9s %9s %9s %9s %9s %9s %8s\n", "kind", "actions", "generate", "validate",
                "lower", "simulate", "total s", "bubble");
    for (const pt::KindInfo& k : pt::schedule_kinds()) {
      auto t0 = Clock::now();
      const pt::Schedule s = pt::generate(k.name, P, M);
      const double gen = since(t0);
      t0 = Clock::now();
      pt::validate(s, k.name);
      const double val = since(t0);
      t0 = Clock::now();
      const pt::Schedule lowered = pt::add_send_recv(s);
      pt::validate(lowered, k.name);
      const double low = since(t0);
      t0 = Clock::now();
      const pt::Simulation sim = pt::simulate(s, pt::unit_costs(P, s.chunks), k.name);
      const double simt = since(t0);
      std::printf("%-12s %9zu %9.3f %9.3f %9.3f %9.3f %9.3f %8.4f\n", k.name.c_str(),
                  s.action_count(), gen, val, low, simt, gen + val + low + simt, sim.bubble);
    }
    pt::AutoOptions o;
    o.chunkings = {uneven(AP, 1), uneven(AP, 2)};
    o.memory_limit = AP / 2;
    const auto t0 = Clock::now();
    const pt::AutoResult r = pt::auto_schedule(AP, AM, o);
    const double t = since(t0);
    std::printf("auto p=%d m=%d limit %g: %.3f s, %d schedules simulated, makespan %.2f "
                "(best hand-made that fits: %s, %.2f)\n  chose %s\n",
                AP, AM, o.memory_limit, t, r.tried, r.simulation.makespan,
                r.best_hand_made.empty() ? "none" : r.best_hand_made.c_str(),
                r.best_hand_made_makespan, r.how.c_str());
  } catch (const pt::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
