#include "partition/linear_partition.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace pt {

namespace {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

void check_problem(const LinearProblem& p, const MemoryModel& m) {
  const size_t n = p.size();
  PT_CHECK(p.param_bytes.size() == n && p.activation_bytes.size() == n,
           "per-position vectors differ in length");
  PT_CHECK(p.cut_bytes.size() == n + 1, "cut_bytes needs n+1 entries");
  PT_CHECK(std::all_of(p.cost.begin(), p.cost.end(), [](int64_t c) { return c >= 0; }),
           "negative cost");
  PT_CHECK(m.limit >= 0 && m.state_factor >= 0, "negative memory model");
}

void check_parts(const LinearProblem& p, int parts) {
  const int64_t n = static_cast<int64_t>(p.size());
  if (parts < 1 || parts > n)
    throw UserError("partition",
                    "cannot cut " + std::to_string(n) + " positions into " +
                        std::to_string(parts) + " parts",
                    "use between 1 and " + std::to_string(n) + " stages");
}

// Two byte counts side by side; exact when rounding would make them read the same.
std::pair<std::string, std::string> format_pair(int64_t a, int64_t b) {
  std::string fa = format_bytes(a), fb = format_bytes(b);
  if (fa != fb) return {fa, fb};
  return {std::to_string(a) + " B", std::to_string(b) + " B"};
}

// a * b for a, b >= 0, clamped to the int64 maximum.
int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t out;
  return __builtin_mul_overflow(a, b, &out) ? kNoLimit : out;
}

// The first i in [lo, hi) where `is_past` holds, hi if none; is_past is false then true.
template <typename Pred>
int first_past(int lo, int hi, Pred is_past) {
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (is_past(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// Decides whether some split into K parts has every part cost <= max_cost and every part
// memory <= limit, sweeping the parts left to right over the positions where they can end.
//
// Memory of part k over [j, i), with f = in_flight(k), sf = state factor and prefix sums
// P (params), A (activations):
//   sf*(P[i]-P[j]) + f*(A[i]-A[j] + cut[j]) = g(j) + h(i),
//   g(j) = f*cut[j] - sf*P[j] - f*A[j],   h(i) = sf*P[i] + f*A[i].
// End i is reachable when some reachable start j in [lo(i), i-1] has g(j) <= limit - h(i),
// where lo(i) is the first j with cost(j, i) <= max_cost. Both ends of that window only move
// right as i does, so the least g in it is the front of a monotone deque: linear per stage.
// Each stage visits only the ends its costs allow (end_span), a narrow band near the optimum.
class ReachSweep {
 public:
  ReachSweep(const LinearProblem& p, int parts, const MemoryModel& m)
      : p_(p), r_(p), m_(m), n_(static_cast<int>(p.size())), parts_(parts),
        reached_(n_ + 1, 0), g_(n_ + 1), deque_(n_ + 1), first_end_(parts) {}

  bool feasible(int64_t max_cost, int64_t limit) { return run(max_cost, limit, nullptr); }

  // The split found at (max_cost, limit), which must be feasible.
  std::vector<PartRange> split(int64_t max_cost, int64_t limit) {
    std::vector<std::vector<int>> pred(parts_);  // pred[k][i - first_end_[k]]: start of part k
    PT_CHECK(run(max_cost, limit, &pred), "split asked for at an infeasible bound");
    std::vector<PartRange> out(parts_);
    int end = n_;
    for (int k = parts_ - 1; k >= 0; --k) {
      const int begin = pred[k][end - first_end_[k]];
      PT_CHECK(begin >= 0 && begin < end, "broken predecessor chain");
      out[k] = {begin, end, r_.cost(begin, end), r_.memory(begin, end, k, parts_, m_)};
      end = begin;
    }
    PT_CHECK(end == 0, "reconstructed split does not start at 0");
    return out;
  }

 private:
  struct Span {
    int first, last;  // positions, inclusive; empty when first > last
  };

  // Where part k can end under max_cost whatever the memory: every part takes a position, the
  // parts up to k cover at most (k+1)*max_cost and those after it at most (K-1-k)*max_cost.
  Span end_span(int k, int64_t max_cost) const {
    const int64_t total = r_.cost(0, n_);
    const int64_t ahead = saturating_mul(k + 1, max_cost);
    const int64_t behind = saturating_mul(parts_ - 1 - k, max_cost);
    const int lo = k == parts_ - 1 ? n_ : k + 1, hi = n_ - (parts_ - 1 - k) + 1;
    const int first = first_past(lo, hi, [&](int i) { return total - r_.cost(0, i) <= behind; });
    const int last = first_past(first, hi, [&](int i) { return r_.cost(0, i) > ahead; }) - 1;
    return {first, last};
  }

  bool run(int64_t max_cost, int64_t limit, std::vector<std::vector<int>>* pred) {
    Span starts{0, 0};
    reached_[0] = ++stamp_;
    for (int k = 0; k < parts_; ++k) {
      const Span ends = end_span(k, max_cost);
      if (ends.first > ends.last) return false;
      first_end_[k] = ends.first;
      std::vector<int>* stage_pred = pred ? &(*pred)[k] : nullptr;
      if (stage_pred) stage_pred->assign(ends.last - ends.first + 1, -1);
      if (!sweep_stage(k, starts, ends, max_cost, limit, stage_pred)) return false;
      starts = ends;
    }
    return reached_[n_] == stamp_;
  }

  // Marks the ends of part k reachable from the starts marked by the previous stage (stamps:
  // reached_[i] == stamp_ on entry for starts, on return for ends). False when none is.
  bool sweep_stage(int k, Span starts, Span ends, int64_t max_cost, int64_t limit,
                   std::vector<int>* pred) {
    const int64_t f = m_.in_flight(k, parts_), sf = m_.state_factor;
    const int64_t from = stamp_, to = ++stamp_;
    size_t head = 0, tail = 0;  // deque_[head, tail): starts, g_ increasing
    auto enter = [&](int j) {
      if (j > starts.last || reached_[j] != from) return;
      g_[j] = f * p_.cut_bytes[j] - sf * r_.params(0, j) - f * r_.activations(0, j);
      while (tail > head && g_[deque_[tail - 1]] >= g_[j]) --tail;
      deque_[tail++] = j;
    };
    for (int j = starts.first; j < ends.first; ++j) enter(j);
    int lo = starts.first;  // first start with cost(lo, i) <= max_cost
    bool any = false;
    for (int i = ends.first; i <= ends.last; ++i) {
      while (lo < i - 1 && r_.cost(lo, i) > max_cost) ++lo;
      while (tail > head && deque_[head] < lo) ++head;
      const int64_t h = sf * r_.params(0, i) + f * r_.activations(0, i);
      const int best = tail > head && g_[deque_[head]] <= limit - h ? deque_[head] : -1;
      enter(i);  // as a start, i serves the ends after it: read it before marking it an end
      if (best < 0) continue;
      reached_[i] = to;
      if (pred) (*pred)[i - ends.first] = best;
      any = true;
    }
    return any;
  }

  const LinearProblem& p_;
  RangeMeasure r_;
  MemoryModel m_;
  int n_, parts_;
  int64_t stamp_ = 0;
  std::vector<int64_t> reached_;  // by position: the stamp of the last stage that reached it
  std::vector<int64_t> g_;        // by position: g(j) of the current stage, where entered
  std::vector<int> deque_;
  std::vector<int> first_end_;  // by part: the first end its last sweep visited
};

// The largest part memory of a split that is always valid: K-1 single positions, then the rest.
int64_t some_split_memory(const LinearProblem& p, int parts, const MemoryModel& m) {
  RangeMeasure r(p);
  const int n = static_cast<int>(p.size());
  int64_t worst = 0;
  for (int k = 0; k < parts; ++k) {
    const int end = k == parts - 1 ? n : k + 1;
    worst = std::max(worst, r.memory(k, end, k, parts, m));
  }
  return worst;
}

// The smallest limit that fits, knowing the problem is valid.
int64_t smallest_limit(ReachSweep& sweep, int64_t no_cost_bound, int64_t hi) {
  int64_t lo = 0;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sweep.feasible(no_cost_bound, mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

[[noreturn]] void throw_no_fit(int parts, int64_t limit, int64_t smallest) {
  auto [have, need] = format_pair(limit, smallest);
  throw UserError("partition",
                  "no split into " + std::to_string(parts) +
                      " stages fits the memory limit of " + have +
                      " per stage (the smallest that fits is " + need + ")",
                  "raise --memory-limit, add stages, or choose a recompute policy that keeps "
                  "less");
}

std::vector<PartRange> solve_checked(const LinearProblem& p, int parts, const MemoryModel& m) {
  RangeMeasure r(p);
  const int n = static_cast<int>(p.size());
  const int64_t total = r.cost(0, n);
  const int64_t limit = m.limit == 0 ? kNoLimit : m.limit;
  ReachSweep sweep(p, parts, m);
  if (!sweep.feasible(total, limit))
    throw_no_fit(parts, m.limit, smallest_limit(sweep, total, some_split_memory(p, parts, m)));

  // Gallop up from the lower bound, then bisect: probes near the optimum sweep narrow spans.
  int64_t max_cost = 0;
  for (int64_t c : p.cost) max_cost = std::max(max_cost, c);
  int64_t lo = std::max(max_cost, (total + parts - 1) / parts), hi = lo;
  for (int64_t step = std::max<int64_t>(max_cost, 1); !sweep.feasible(hi, limit);
       step = saturating_mul(step, 2)) {
    lo = hi + 1;
    hi = std::min(total, hi + std::min(step, total));
  }
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sweep.feasible(mid, limit))
      hi = mid;
    else
      lo = mid + 1;
  }
  return sweep.split(lo, limit);
}

}  // namespace

RangeMeasure::RangeMeasure(const LinearProblem& p)
    : p_(p), cost_(p.size() + 1), params_(p.size() + 1), act_(p.size() + 1) {
  for (size_t i = 0; i < p.size(); ++i) {
    cost_[i + 1] = cost_[i] + p.cost[i];
    params_[i + 1] = params_[i] + p.param_bytes[i];
    act_[i + 1] = act_[i] + p.activation_bytes[i];
  }
}

int64_t RangeMeasure::memory(int begin, int end, int part, int parts,
                             const MemoryModel& m) const {
  return m.state_factor * params(begin, end) +
         m.in_flight(part, parts) * (activations(begin, end) + p_.cut_bytes[begin]);
}

std::vector<PartRange> solve_min_bottleneck(const LinearProblem& p, int parts,
                                            const MemoryModel& m) {
  check_problem(p, m);
  check_parts(p, parts);
  return solve_checked(p, parts, m);
}

int64_t min_feasible_limit(const LinearProblem& p, int parts, const MemoryModel& m) {
  check_problem(p, m);
  check_parts(p, parts);
  ReachSweep sweep(p, parts, m);
  RangeMeasure r(p);
  return smallest_limit(sweep, r.cost(0, static_cast<int>(p.size())),
                        some_split_memory(p, parts, m));
}

std::vector<PartRange> split_at(const LinearProblem& p, const std::vector<int>& cuts,
                                const MemoryModel& m) {
  check_problem(p, m);
  const int n = static_cast<int>(p.size());
  const int parts = static_cast<int>(cuts.size()) + 1;
  check_parts(p, parts);
  for (size_t c = 0; c < cuts.size(); ++c) {
    const int prev = c == 0 ? 0 : cuts[c - 1];
    if (cuts[c] <= prev || cuts[c] >= n)
      throw UserError("partition",
                      "cut " + std::to_string(c) + " at position " + std::to_string(cuts[c]) +
                          " is not between " + std::to_string(prev) + " and " +
                          std::to_string(n) + " (exclusive)",
                      "give cuts as strictly increasing positions in 1.." + std::to_string(n - 1));
  }
  RangeMeasure r(p);
  std::vector<PartRange> out(parts);
  for (int k = 0; k < parts; ++k) {
    const int begin = k == 0 ? 0 : cuts[k - 1], end = k == parts - 1 ? n : cuts[k];
    out[k] = {begin, end, r.cost(begin, end), r.memory(begin, end, k, parts, m)};
    if (m.limit != 0 && out[k].memory > m.limit) {
      auto [need, have] = format_pair(out[k].memory, m.limit);
      throw UserError("partition",
                      "part " + std::to_string(k) + " [" + std::to_string(begin) + ", " +
                          std::to_string(end) + ") needs " + need +
                          ", over the memory limit of " + have,
                      "move the cuts, raise --memory-limit, or choose a recompute policy that "
                      "keeps less");
    }
  }
  return out;
}

std::string format_bytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 0) return "-" + format_bytes(-std::max(bytes, -kNoLimit));
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 6) {
    v /= 1024;
    ++unit;
  }
  const int decimals = v < 9.995 ? 2 : v < 99.95 ? 1 : 0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, kUnits[unit]);
  return buf;
}

}  // namespace pt
