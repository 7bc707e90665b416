#include "partition/linear_partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "core/error.h"

namespace pt {
namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
constexpr int64_t kGiB = int64_t{1} << 30;
const SolveOptions kNoSlack{0.0};  // the exact least bottleneck

// The oracle's own arithmetic: plain loops, no prefix sums.
int64_t naive_cost(const LinearProblem& p, int begin, int end) {
  int64_t s = 0;
  for (int i = begin; i < end; ++i) s += p.cost[i];
  return s;
}

// What the part's inner cuts add to its time: cut_cost at its start and at its end.
int64_t naive_link(const LinearProblem& p, int begin, int end, int part, int parts) {
  if (p.cut_cost.empty()) return 0;
  return (part > 0 ? p.cut_cost[begin] : 0) + (part < parts - 1 ? p.cut_cost[end] : 0);
}

int64_t naive_time(const LinearProblem& p, int begin, int end, int part, int parts) {
  return naive_cost(p, begin, end) + naive_link(p, begin, end, part, parts);
}

int64_t naive_memory(const LinearProblem& p, int begin, int end, int part, int parts,
                     const MemoryModel& m) {
  int64_t params = 0, acts = 0;
  for (int i = begin; i < end; ++i) {
    params += p.param_bytes[i];
    acts += p.activation_bytes[i];
  }
  for (const SharedParam& s : p.shared) {  // a copy where a later part reads it again
    bool read_here = false;
    for (int r : s.readers) read_here = read_here || (r >= begin && r < end);
    if (read_here && s.readers.front() < begin) params += s.bytes;
  }
  return m.state_factor * params + (parts - part) * (acts + p.cut_bytes[begin]);
}

bool fits(int64_t memory, const MemoryModel& m) { return m.limit == 0 || memory <= m.limit; }

// Every split of [0, n) into `parts` ranges, as cut lists, visited in turn.
template <typename Visit>
void for_each_split(int n, int parts, Visit visit) {
  std::vector<int> cuts;
  auto rec = [&](auto&& self, int next) -> void {
    if (static_cast<int>(cuts.size()) == parts - 1) {
      visit(cuts);
      return;
    }
    for (int c = next; c < n; ++c) {
      cuts.push_back(c);
      self(self, c + 1);
      cuts.pop_back();
    }
  };
  rec(rec, 1);
}

// Whether every part of the split holds a computing position (LinearProblem::computes; all
// compute when it is empty): the splits the solvers may return.
bool parts_compute(const LinearProblem& p, int parts, const std::vector<int>& cuts) {
  if (p.computes.empty()) return true;
  const int n = static_cast<int>(p.size());
  for (int k = 0; k < parts; ++k) {
    const int begin = k == 0 ? 0 : cuts[k - 1], end = k == parts - 1 ? n : cuts[k];
    if (std::none_of(p.computes.begin() + begin, p.computes.begin() + end, [](char c) { return c != 0; }))
      return false;
  }
  return true;
}

struct BruteForce {
  int64_t best_cost = kInf;       // over splits that fit m.limit; kInf when none does
  int64_t smallest_limit = kInf;  // min over all splits of the largest part memory
};

BruteForce brute_force(const LinearProblem& p, int parts, const MemoryModel& m) {
  const int n = static_cast<int>(p.size());
  BruteForce out;
  for_each_split(n, parts, [&](const std::vector<int>& cuts) {
    if (!parts_compute(p, parts, cuts)) return;
    int64_t worst_cost = 0, worst_memory = 0;
    for (int k = 0; k < parts; ++k) {
      const int begin = k == 0 ? 0 : cuts[k - 1], end = k == parts - 1 ? n : cuts[k];
      worst_cost = std::max(worst_cost, naive_time(p, begin, end, k, parts));
      worst_memory = std::max(worst_memory, naive_memory(p, begin, end, k, parts, m));
    }
    out.smallest_limit = std::min(out.smallest_limit, worst_memory);
    if (fits(worst_memory, m)) out.best_cost = std::min(out.best_cost, worst_cost);
  });
  return out;
}

// The ranges cover [0, n) in order, are non-empty, carry their true cost, link and memory, and
// fit. Returns the largest part time (cost plus link).
int64_t expect_valid_split(const LinearProblem& p, int parts, const MemoryModel& m,
                           const std::vector<PartRange>& split) {
  EXPECT_EQ(static_cast<int>(split.size()), parts);
  int64_t worst = 0;
  int at = 0;
  for (int k = 0; k < static_cast<int>(split.size()); ++k) {
    const PartRange& r = split[k];
    EXPECT_EQ(r.begin, at) << "part " << k;
    EXPECT_LT(r.begin, r.end) << "part " << k;
    if (!p.computes.empty() && r.begin < r.end)
      EXPECT_TRUE(std::any_of(p.computes.begin() + r.begin, p.computes.begin() + r.end, [](char c) { return c != 0; }))
          << "part " << k << " holds no computing position";
    EXPECT_EQ(r.cost, naive_cost(p, r.begin, r.end)) << "part " << k;
    EXPECT_EQ(r.link, naive_link(p, r.begin, r.end, k, parts)) << "part " << k;
    EXPECT_EQ(r.memory, naive_memory(p, r.begin, r.end, k, parts, m)) << "part " << k;
    EXPECT_TRUE(fits(r.memory, m)) << "part " << k << " memory " << r.memory;
    worst = std::max(worst, r.time());
    at = r.end;
  }
  EXPECT_EQ(at, static_cast<int>(p.size()));
  return worst;
}

// The spec's bound on the largest part cost: floor(T* * (1 + slack)).
int64_t slack_bound(int64_t best, double slack) {
  return static_cast<int64_t>(std::floor(static_cast<long double>(best) * (1.0L + slack)));
}

// Bytes crossing the inner cuts: cut_bytes[begin] of parts 1..K-1.
int64_t crossing_bytes(const LinearProblem& p, const std::vector<PartRange>& split) {
  int64_t s = 0;
  for (size_t k = 1; k < split.size(); ++k) s += p.cut_bytes[split[k].begin];
  return s;
}

std::vector<int> cuts_of(const std::vector<PartRange>& split) {
  std::vector<int> cuts;
  for (size_t k = 1; k < split.size(); ++k) cuts.push_back(split[k].begin);
  return cuts;
}

struct FewestCrossing {
  int64_t crossing = kInf, worst = kInf;
  std::vector<int> cuts;
};

// Among the splits that fit m.limit with every part time <= bound: the fewest crossing bytes,
// then the smallest largest time, then the earliest cuts (splits are visited in that order).
FewestCrossing brute_force_fewest_crossing(const LinearProblem& p, int parts,
                                           const MemoryModel& m, int64_t bound) {
  const int n = static_cast<int>(p.size());
  FewestCrossing out;
  for_each_split(n, parts, [&](const std::vector<int>& cuts) {
    if (!parts_compute(p, parts, cuts)) return;
    int64_t worst = 0, crossing = 0;
    bool fit = true;
    for (int k = 0; k < parts; ++k) {
      const int begin = k == 0 ? 0 : cuts[k - 1], end = k == parts - 1 ? n : cuts[k];
      worst = std::max(worst, naive_time(p, begin, end, k, parts));
      fit = fit && fits(naive_memory(p, begin, end, k, parts, m), m);
      if (k > 0) crossing += p.cut_bytes[begin];
    }
    if (!fit || worst > bound) return;
    if (crossing < out.crossing || (crossing == out.crossing && worst < out.worst))
      out = {crossing, worst, cuts};
  });
  return out;
}

LinearProblem random_problem(std::mt19937_64& rng, int n) {
  auto draw = [&](int64_t hi) { return std::uniform_int_distribution<int64_t>(0, hi)(rng); };
  LinearProblem p;
  for (int i = 0; i < n; ++i) {
    p.cost.push_back(draw(3) == 0 ? 0 : draw(20));  // about a quarter zeros
    p.param_bytes.push_back(draw(2) == 0 ? 0 : draw(1000));
    p.activation_bytes.push_back(draw(300));
  }
  for (int i = 0; i <= n; ++i) p.cut_bytes.push_back(draw(500));  // not monotone
  // Half the problems share a parameter or two among positions (a tie, a module called twice).
  for (int k = draw(1) == 0 ? 0 : 1 + static_cast<int>(draw(1)); k > 0 && n >= 2; --k) {
    SharedParam s{draw(1000), {}};
    for (int i = 0; i < n; ++i)
      if (draw(2) == 0) s.readers.push_back(i);
    if (s.readers.size() < 2) s.readers = {0, n - 1};
    p.param_bytes[static_cast<size_t>(s.readers.front())] += s.bytes;
    p.shared.push_back(std::move(s));
  }
  return p;
}

// Costs large enough for a few percent of slack to admit other splits; half the time crossing
// bytes from three values, so that many splits tie.
LinearProblem random_slack_problem(std::mt19937_64& rng, int n) {
  auto draw = [&](int64_t hi) { return std::uniform_int_distribution<int64_t>(0, hi)(rng); };
  LinearProblem p = random_problem(rng, n);
  for (int64_t& c : p.cost) c = c * 50 + draw(49);
  if (draw(1) == 0)
    for (int64_t& b : p.cut_bytes) b = 64 * draw(2);
  return p;
}

// A limit around the smallest that fits: none, just below, at, just above, or anywhere.
int64_t random_limit(std::mt19937_64& rng, int64_t smallest) {
  switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
    case 0: return 0;
    case 1: return std::max<int64_t>(smallest - 1, 1);
    case 2: return std::max<int64_t>(smallest, 1);
    case 3: return smallest + 1;
    default: return std::uniform_int_distribution<int64_t>(1, 2 * smallest + 2)(rng);
  }
}

TEST(SolveMinBottleneck, MatchesBruteForceOnSmallProblems) {
  std::mt19937_64 rng(20240611);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 12)(rng);
    const int parts = std::uniform_int_distribution<int>(1, n)(rng);
    const LinearProblem p = random_problem(rng, n);
    MemoryModel m;
    m.state_factor = std::uniform_int_distribution<int64_t>(0, 4)(rng);
    const int64_t smallest = brute_force(p, parts, m).smallest_limit;
    m.limit = random_limit(rng, smallest);
    const BruteForce want = brute_force(p, parts, m);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": n=" + std::to_string(n) +
                 " parts=" + std::to_string(parts) + " limit=" + std::to_string(m.limit));

    EXPECT_EQ(min_feasible_limit(p, parts, m), want.smallest_limit);
    if (want.best_cost == kInf) {
      ++infeasible;
      EXPECT_THROW(solve_min_bottleneck(p, parts, m), UserError);
      continue;
    }
    ++feasible;
    const auto split = solve_min_bottleneck(p, parts, m, kNoSlack);
    EXPECT_EQ(expect_valid_split(p, parts, m, split), want.best_cost);
    if (::testing::Test::HasFailure()) break;
  }
  // The generator must exercise both outcomes.
  EXPECT_GT(feasible, 1000);
  EXPECT_GT(infeasible, 300);
}

TEST(SolveMinBottleneck, FewestCrossingBytesWithinTheSlackMatchBruteForce) {
  std::mt19937_64 rng(20250301);
  int feasible = 0, slack_used = 0, bytes_saved = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 11)(rng);
    const int parts = std::uniform_int_distribution<int>(1, n)(rng);
    const LinearProblem p = random_slack_problem(rng, n);
    MemoryModel m;
    m.state_factor = std::uniform_int_distribution<int64_t>(0, 4)(rng);
    m.limit = random_limit(rng, brute_force(p, parts, m).smallest_limit);
    const int64_t best = brute_force(p, parts, m).best_cost;
    if (best == kInf) continue;
    ++feasible;
    int64_t exact_crossing = kInf;
    for (double slack : {0.0, 0.02, 0.1}) {
      const int64_t bound = slack_bound(best, slack);
      SCOPED_TRACE("trial " + std::to_string(trial) + ": n=" + std::to_string(n) +
                   " parts=" + std::to_string(parts) + " limit=" + std::to_string(m.limit) +
                   " slack=" + std::to_string(slack) + " bound=" + std::to_string(bound));
      const FewestCrossing want = brute_force_fewest_crossing(p, parts, m, bound);
      const auto split = solve_min_bottleneck(p, parts, m, SolveOptions{slack});
      const int64_t worst = expect_valid_split(p, parts, m, split);
      EXPECT_LE(worst, bound);
      EXPECT_EQ(crossing_bytes(p, split), want.crossing);
      EXPECT_EQ(worst, want.worst);
      EXPECT_EQ(cuts_of(split), want.cuts);
      if (slack == 0) {
        EXPECT_EQ(worst, best);
        exact_crossing = want.crossing;
      }
      slack_used += worst > best;
      bytes_saved += want.crossing < exact_crossing;
    }
    if (::testing::Test::HasFailure()) break;
  }
  // The generator must make the slack matter.
  EXPECT_GT(feasible, 1500);
  EXPECT_GT(slack_used, 200);
  EXPECT_GT(bytes_saved, 200);
}

// With transfers priced a part's time depends on where both its cuts fall: the solver must still
// find the least largest time, then within the slack the fewest crossing bytes, the least largest
// time and the earliest cuts, as enumerating every split does.
TEST(SolveMinBottleneck, PricedCutsMatchBruteForce) {
  std::mt19937_64 rng(20261127);
  int feasible = 0, infeasible = 0, moved = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 11)(rng);
    const int parts = std::uniform_int_distribution<int>(1, n)(rng);
    LinearProblem p = random_slack_problem(rng, n);
    const LinearProblem free_links = p;
    for (int i = 0; i <= n; ++i)
      p.cut_cost.push_back(std::uniform_int_distribution<int64_t>(0, 3)(rng) == 0
                               ? 0
                               : std::uniform_int_distribution<int64_t>(1, 600)(rng));
    MemoryModel m;
    m.state_factor = std::uniform_int_distribution<int64_t>(0, 4)(rng);
    m.limit = random_limit(rng, brute_force(p, parts, m).smallest_limit);
    const int64_t best = brute_force(p, parts, m).best_cost;
    SCOPED_TRACE("trial " + std::to_string(trial) + ": n=" + std::to_string(n) +
                 " parts=" + std::to_string(parts) + " limit=" + std::to_string(m.limit));
    if (best == kInf) {
      ++infeasible;
      EXPECT_THROW(solve_min_bottleneck(p, parts, m), UserError);
      continue;
    }
    ++feasible;
    for (double slack : {0.0, 0.02, 0.1}) {
      const int64_t bound = slack_bound(best, slack);
      SCOPED_TRACE("slack=" + std::to_string(slack) + " bound=" + std::to_string(bound));
      const FewestCrossing want = brute_force_fewest_crossing(p, parts, m, bound);
      const auto split = solve_min_bottleneck(p, parts, m, SolveOptions{slack});
      const int64_t worst = expect_valid_split(p, parts, m, split);
      if (slack == 0) EXPECT_EQ(worst, best);
      EXPECT_EQ(crossing_bytes(p, split), want.crossing);
      EXPECT_EQ(worst, want.worst);
      EXPECT_EQ(cuts_of(split), want.cuts);
      if (slack == 0) moved += cuts_of(split) != cuts_of(solve_min_bottleneck(free_links, parts, m, kNoSlack));
    }
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(feasible, 1500);
  EXPECT_GT(infeasible, 200);
  EXPECT_GT(moved, 300);  // the prices must move cuts, or the test shows nothing
}

// Every part must hold a computing position (LinearProblem::computes: a node with FLOPs): the
// sweep, the fewest-crossing DP, the priced DPs and the least limit each keep to the splits that
// do, as enumerating them does; more parts than computing positions is refused.
TEST(SolveMinBottleneck, EveryPartHoldsAComputingPosition) {
  std::mt19937_64 rng(20261203);
  int feasible = 0, infeasible = 0, refused = 0, constrained = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 11)(rng);
    LinearProblem p = random_slack_problem(rng, n);
    for (int i = 0; i < n; ++i) p.computes.push_back(std::uniform_int_distribution<int>(0, 2)(rng) != 0);
    const int computing = static_cast<int>(std::count(p.computes.begin(), p.computes.end(), 1));
    const int parts = std::uniform_int_distribution<int>(1, n)(rng);
    MemoryModel m;
    m.state_factor = std::uniform_int_distribution<int64_t>(0, 4)(rng);
    const bool priced = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
    if (priced)
      for (int i = 0; i <= n; ++i) p.cut_cost.push_back(std::uniform_int_distribution<int64_t>(0, 600)(rng));
    SCOPED_TRACE("trial " + std::to_string(trial) + ": n=" + std::to_string(n) + " parts=" + std::to_string(parts) +
                 " computing=" + std::to_string(computing) + (priced ? " priced" : ""));
    if (parts > computing) {
      ++refused;
      EXPECT_THROW(solve_min_bottleneck(p, parts, m), UserError);
      EXPECT_THROW(min_feasible_limit(p, parts, m), UserError);
      continue;
    }
    const int64_t smallest = brute_force(p, parts, m).smallest_limit;
    EXPECT_EQ(min_feasible_limit(p, parts, m), smallest);
    m.limit = random_limit(rng, smallest);
    const int64_t best = brute_force(p, parts, m).best_cost;
    if (best == kInf) {
      ++infeasible;
      EXPECT_THROW(solve_min_bottleneck(p, parts, m), UserError);
      continue;
    }
    ++feasible;
    LinearProblem all = p;
    all.computes.clear();
    constrained += brute_force(all, parts, m).best_cost < best;
    for (double slack : {0.0, 0.02, 0.1}) {
      const int64_t bound = slack_bound(best, slack);
      const FewestCrossing want = brute_force_fewest_crossing(p, parts, m, bound);
      const auto split = solve_min_bottleneck(p, parts, m, SolveOptions{slack});
      const int64_t worst = expect_valid_split(p, parts, m, split);
      if (slack == 0) {
        EXPECT_EQ(worst, best);
      }
      EXPECT_EQ(crossing_bytes(p, split), want.crossing) << "slack " << slack;
      EXPECT_EQ(worst, want.worst) << "slack " << slack;
      EXPECT_EQ(cuts_of(split), want.cuts) << "slack " << slack;
    }
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(feasible, 1000);
  EXPECT_GT(infeasible, 100);
  EXPECT_GT(refused, 300);
  EXPECT_GT(constrained, 100);  // the rule must change the best split, or the test shows nothing
}

TEST(SolveMinBottleneck, SlackBuysABlockBoundary) {
  // A block of 1000, then one of 10 + 1000 + 20. The best balance, 1020, cuts inside the
  // second block where 4 KiB cross; the boundary at 1 costs 1030 and nothing crosses it.
  LinearProblem p;
  p.cost = {1000, 10, 1000, 20};
  p.param_bytes.assign(4, 0);
  p.activation_bytes.assign(4, 0);
  p.cut_bytes = {0, 0, 4096, 4096, 0};
  auto cuts = [&](double slack) { return cuts_of(solve_min_bottleneck(p, 2, {}, {slack})); };
  EXPECT_EQ(cuts(0.0), std::vector<int>{2});
  EXPECT_EQ(cuts(0.0098), std::vector<int>{2});  // bound floor(1029.996) = 1029: no room
  EXPECT_EQ(cuts(0.01), std::vector<int>{1});    // bound floor(1030.2) = 1030: the boundary
  EXPECT_EQ(cuts(0.02), std::vector<int>{1});
  const auto split = solve_min_bottleneck(p, 2, MemoryModel{});  // default slack 2%
  EXPECT_EQ(cuts_of(split), std::vector<int>{1});
  EXPECT_EQ(crossing_bytes(p, split), 0);
  EXPECT_EQ(split[1].cost, 1030);
}

TEST(SolveMinBottleneck, SlackMustBeFiniteAndNonNegative) {
  std::mt19937_64 rng(3);
  const LinearProblem p = random_problem(rng, 4);
  try {
    solve_min_bottleneck(p, 2, MemoryModel{}, {-0.5});
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "partition: slack must be a finite number >= 0, got -0.500000; use 0 for the "
                 "exact optimum, or e.g. 0.02 for 2%");
  }
  EXPECT_THROW(solve_min_bottleneck(p, 2, MemoryModel{}, {std::nan("")}), UserError);
  EXPECT_THROW(solve_min_bottleneck(p, 2, MemoryModel{}, {std::numeric_limits<double>::infinity()}),
               UserError);
}

TEST(SolveMinBottleneck, NoFitNamesTheSmallestLimit) {
  // The only split, [0,1) [1,2), holds 2 and 1 micro-batches: 2 * 1 GiB and 1 * 1.37 GiB.
  LinearProblem p;
  p.cost = {1, 1};
  p.param_bytes = {0, 0};
  p.activation_bytes = {kGiB, 1471026299};  // 1.37 GiB
  p.cut_bytes = {0, 0, 0};
  MemoryModel m;
  m.limit = kGiB;
  EXPECT_EQ(min_feasible_limit(p, 2, m), 2 * kGiB);
  try {
    solve_min_bottleneck(p, 2, m);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "partition: no split into 2 stages fits the memory limit of 1.00 GiB per stage "
                 "(the smallest that fits is 2.00 GiB); raise --memory-limit, add stages, or "
                 "choose a recompute policy that keeps less");
  }
}

TEST(SolveMinBottleneck, NoFitIsExactWhenRoundingWouldHideTheGap) {
  LinearProblem p;
  p.cost = {1};
  p.param_bytes = {kGiB / 4 + 1};  // state factor 4: one byte over 1 GiB
  p.activation_bytes = {0};
  p.cut_bytes = {0, 0};
  MemoryModel m;
  m.limit = kGiB;
  try {
    solve_min_bottleneck(p, 1, m);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("limit of 1073741824 B per stage (the smallest that "
                                         "fits is 1073741828 B)"),
              std::string::npos)
        << e.what();
  }
}

TEST(SolveMinBottleneck, PartsEqualPositions) {
  std::mt19937_64 rng(7);
  const LinearProblem p = random_problem(rng, 9);
  const auto split = solve_min_bottleneck(p, 9, MemoryModel{});
  expect_valid_split(p, 9, MemoryModel{}, split);
  for (int k = 0; k < 9; ++k) EXPECT_EQ(split[k].end - split[k].begin, 1);
}

TEST(SolveMinBottleneck, OnePartIsEverything) {
  std::mt19937_64 rng(8);
  const LinearProblem p = random_problem(rng, 11);
  const auto split = solve_min_bottleneck(p, 1, MemoryModel{});
  ASSERT_EQ(split.size(), 1u);
  EXPECT_EQ(split[0].begin, 0);
  EXPECT_EQ(split[0].end, 11);
  EXPECT_EQ(split[0].cost, naive_cost(p, 0, 11));
}

TEST(SolveMinBottleneck, AllZeroCostsStillHonourMemory) {
  LinearProblem p;
  p.cost.assign(6, 0);
  p.param_bytes = {10, 10, 10, 10, 10, 10};
  p.activation_bytes.assign(6, 0);
  p.cut_bytes.assign(7, 0);
  MemoryModel m;
  m.state_factor = 1;
  m.limit = 20;  // at most two positions a part
  const auto split = solve_min_bottleneck(p, 3, m);
  EXPECT_EQ(expect_valid_split(p, 3, m, split), 0);
  for (const PartRange& r : split) EXPECT_EQ(r.end - r.begin, 2);
}

TEST(MinFeasibleLimit, ZeroWhenNothingTakesMemory) {
  LinearProblem p;
  p.cost = {3, 0, 5, 1};
  p.param_bytes.assign(4, 0);
  p.activation_bytes.assign(4, 0);
  p.cut_bytes = {0, 0, 7, 0, 0};  // a cut at 2 would cost memory
  EXPECT_EQ(min_feasible_limit(p, 2, MemoryModel{}), 0);
  EXPECT_EQ(min_feasible_limit(p, 3, MemoryModel{}), 0);   // cuts at 1 and 3
  EXPECT_EQ(min_feasible_limit(p, 4, MemoryModel{}), 14);  // part 2 starts at 2, 2 in flight
}

TEST(SolveMinBottleneck, TooManyOrTooFewParts) {
  std::mt19937_64 rng(1);
  const LinearProblem p = random_problem(rng, 3);
  try {
    solve_min_bottleneck(p, 4, MemoryModel{});
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "partition: cannot cut 3 positions into 4 parts; use between 1 and 3 stages");
  }
  EXPECT_THROW(solve_min_bottleneck(p, 0, MemoryModel{}), UserError);
  EXPECT_THROW(min_feasible_limit(p, 4, MemoryModel{}), UserError);
}

// O(n^2 K) dynamic programme: best[k][i] = least bottleneck of parts 0..k covering [0, i).
int64_t dp_min_bottleneck(const LinearProblem& p, int parts, const MemoryModel& m) {
  const int n = static_cast<int>(p.size());
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + p.cost[i];
  std::vector<int64_t> params(n + 1, 0), acts(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    params[i + 1] = params[i] + p.param_bytes[i];
    acts[i + 1] = acts[i] + p.activation_bytes[i];
  }
  std::vector<int64_t> prev(n + 1, kInf), cur(n + 1, kInf);
  prev[0] = 0;
  for (int k = 0; k < parts; ++k) {
    std::fill(cur.begin(), cur.end(), kInf);
    for (int i = 1; i <= n; ++i)
      for (int j = 0; j < i; ++j) {
        if (prev[j] == kInf) continue;
        const int64_t mem = m.state_factor * (params[i] - params[j]) +
                            (parts - k) * (acts[i] - acts[j] + p.cut_bytes[j]);
        if (!fits(mem, m)) continue;
        cur[i] = std::min(cur[i], std::max(prev[j], prefix[i] - prefix[j]));
      }
    std::swap(prev, cur);
  }
  return prev[n];
}

TEST(SolveMinBottleneck, MatchesDynamicProgrammeAtTwoThousandPositions) {
  std::mt19937_64 rng(99);
  const LinearProblem p = random_problem(rng, 2000);
  MemoryModel m;
  m.limit = min_feasible_limit(p, 8, m) * 11 / 10;  // tight enough to bind
  const int64_t want = dp_min_bottleneck(p, 8, m);
  ASSERT_NE(want, kInf);
  EXPECT_EQ(expect_valid_split(p, 8, m, solve_min_bottleneck(p, 8, m, kNoSlack)), want);
  m.limit = 0;
  EXPECT_EQ(expect_valid_split(p, 8, m, solve_min_bottleneck(p, 8, m, kNoSlack)),
            dp_min_bottleneck(p, 8, m));
}

// O(n^2 K) dynamic programme over (crossing bytes, largest cost), lexicographic, of the splits
// with every part cost <= bound that fit: extending a prefix never reorders two of them.
std::pair<int64_t, int64_t> dp_fewest_crossing(const LinearProblem& p, int parts,
                                               const MemoryModel& m, int64_t bound) {
  const int n = static_cast<int>(p.size());
  std::vector<int64_t> prefix(n + 1, 0), params(n + 1, 0), acts(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    prefix[i + 1] = prefix[i] + p.cost[i];
    params[i + 1] = params[i] + p.param_bytes[i];
    acts[i + 1] = acts[i] + p.activation_bytes[i];
  }
  using Key = std::pair<int64_t, int64_t>;
  const Key none{kInf, kInf};
  std::vector<Key> prev(n + 1, none), cur(n + 1, none);
  prev[0] = {0, 0};
  for (int k = 0; k < parts; ++k) {
    std::fill(cur.begin(), cur.end(), none);
    for (int i = 1; i <= n; ++i)
      for (int j = i - 1; j >= 0 && prefix[i] - prefix[j] <= bound; --j) {
        if (prev[j] == none) continue;
        const int64_t mem = m.state_factor * (params[i] - params[j]) +
                            (parts - k) * (acts[i] - acts[j] + p.cut_bytes[j]);
        if (!fits(mem, m)) continue;
        cur[i] = std::min(cur[i], Key{prev[j].first + (k > 0 ? p.cut_bytes[j] : 0),
                                      std::max(prev[j].second, prefix[i] - prefix[j])});
      }
    std::swap(prev, cur);
  }
  return prev[n];
}

TEST(SolveMinBottleneck, FewestCrossingMatchesDynamicProgrammeAtTwoThousandPositions) {
  std::mt19937_64 rng(101);
  const LinearProblem p = random_slack_problem(rng, 2000);
  for (int64_t limit_percent : {0, 105, 130}) {
    MemoryModel m;
    m.limit = min_feasible_limit(p, 8, m) * limit_percent / 100;
    const int64_t best = dp_min_bottleneck(p, 8, m);
    ASSERT_NE(best, kInf);
    for (double slack : {0.0, 0.02, 0.1}) {
      SCOPED_TRACE("limit " + std::to_string(m.limit) + " slack " + std::to_string(slack));
      const auto want = dp_fewest_crossing(p, 8, m, slack_bound(best, slack));
      const auto split = solve_min_bottleneck(p, 8, m, SolveOptions{slack});
      const int64_t worst = expect_valid_split(p, 8, m, split);
      EXPECT_EQ(crossing_bytes(p, split), want.first);
      EXPECT_EQ(worst, want.second);
    }
  }
}

TEST(SolveMinBottleneck, TenThousandPositionsIntoEightParts) {
  std::mt19937_64 rng(100);
  const LinearProblem p = random_problem(rng, 10000);
  MemoryModel m;
  m.limit = min_feasible_limit(p, 8, m) * 12 / 10;
  const auto exact = solve_min_bottleneck(p, 8, m, kNoSlack);
  const int64_t best = expect_valid_split(p, 8, m, exact);
  EXPECT_GE(best, (naive_cost(p, 0, 10000) + 7) / 8);
  const auto split = solve_min_bottleneck(p, 8, m);
  EXPECT_LE(expect_valid_split(p, 8, m, split), slack_bound(best, 0.02));
  EXPECT_LE(crossing_bytes(p, split), crossing_bytes(p, exact));
}

LinearProblem uniform_problem(int n) {
  LinearProblem p;
  p.cost.assign(n, 1);
  p.param_bytes.assign(n, 100);
  p.activation_bytes.assign(n, 10);
  p.cut_bytes.assign(n + 1, 5);
  return p;
}

TEST(SplitAt, BuildsTheRangesAsked) {
  const LinearProblem p = uniform_problem(6);
  MemoryModel m;
  const auto split = split_at(p, {2, 5}, m);
  expect_valid_split(p, 3, m, split);
  EXPECT_EQ(split[1].begin, 2);
  EXPECT_EQ(split[1].end, 5);
  EXPECT_EQ(split[1].memory, 4 * 300 + 2 * (30 + 5));
}

TEST(SplitAt, RejectsBadCuts) {
  const LinearProblem p = uniform_problem(6);
  auto message = [&](const std::vector<int>& cuts) -> std::string {
    try {
      split_at(p, cuts, MemoryModel{});
    } catch (const UserError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message({3, 3}),
            "partition: cut 1 at position 3 is not between 3 and 6 (exclusive); give cuts as "
            "strictly increasing positions in 1..5");
  EXPECT_EQ(message({0}),
            "partition: cut 0 at position 0 is not between 0 and 6 (exclusive); give cuts as "
            "strictly increasing positions in 1..5");
  EXPECT_EQ(message({2, 6}),
            "partition: cut 1 at position 6 is not between 2 and 6 (exclusive); give cuts as "
            "strictly increasing positions in 1..5");
  EXPECT_EQ(message({4, 2}),
            "partition: cut 1 at position 2 is not between 4 and 6 (exclusive); give cuts as "
            "strictly increasing positions in 1..5");
  EXPECT_EQ(message({1, 2, 3, 4, 5, 5}),
            "partition: cannot cut 6 positions into 7 parts; use between 1 and 6 stages");
}

TEST(SplitAt, NamesThePartOverTheLimit) {
  const LinearProblem p = uniform_problem(6);
  MemoryModel m;
  m.limit = 1300;  // part 0 [0, 3): 4*300 + 2*(30+5) = 1270; part 1 [3, 6): 1200 + 35
  EXPECT_NO_THROW(split_at(p, {3}, m));
  try {
    split_at(p, {4}, m);  // part 0 [0, 4): 1600 + 2*45 = 1690
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "partition: part 0 [0, 4) needs 1.65 KiB, over the memory limit of 1.27 KiB; "
                 "move the cuts, raise --memory-limit, or choose a recompute policy that keeps "
                 "less");
  }
}

TEST(FormatBytes, ThreeSignificantDigits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(3 * 1024), "3.00 KiB");
  EXPECT_EQ(format_bytes(12 * 1024 * 1024 + 512 * 1024), "12.5 MiB");
  EXPECT_EQ(format_bytes(1471026299), "1.37 GiB");
  EXPECT_EQ(format_bytes(300 * kGiB), "300 GiB");
  EXPECT_EQ(format_bytes(kGiB * 1024 * 5), "5.00 TiB");
  EXPECT_EQ(format_bytes(10 * 1024 - 1), "10.0 KiB");  // 9.999 rounds up a digit
}

}  // namespace
}  // namespace pt
