#include "partition/linear_partition.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace pt {

namespace {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();
constexpr int64_t kUnreached = std::numeric_limits<int64_t>::max();  // fewest bytes, no split

void check_problem(const LinearProblem& p, const MemoryModel& m) {
  const size_t n = p.size();
  PT_CHECK(p.param_bytes.size() == n && p.activation_bytes.size() == n,
           "per-position vectors differ in length");
  PT_CHECK(p.cut_bytes.size() == n + 1, "cut_bytes needs n+1 entries");
  auto non_negative = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [](int64_t x) { return x >= 0; });
  };
  PT_CHECK(non_negative(p.cost), "negative cost");
  PT_CHECK(non_negative(p.param_bytes) && non_negative(p.activation_bytes), "negative bytes");
  PT_CHECK(p.cut_cost.empty() || p.cut_cost.size() == n + 1, "cut_cost needs 0 or n+1 entries");
  PT_CHECK(p.computes.empty() || p.computes.size() == n, "computes needs 0 or n entries");
  PT_CHECK(non_negative(p.cut_cost), "negative cut cost");
  PT_CHECK(m.limit >= 0 && m.state_factor >= 0, "negative memory model");
  for (const SharedParam& s : p.shared)
    PT_CHECK(s.bytes >= 0 && s.readers.size() >= 2 && std::is_sorted(s.readers.begin(), s.readers.end()) &&
                 s.readers.front() >= 0 && s.readers.back() < static_cast<int>(n),
             "a shared parameter needs two or more readers in order");
}

// The solvers' parts each hold a computing position: at most as many parts as those.
void check_parts(const LinearProblem& p, int parts) {
  const int computing = RangeMeasure(p).computing();
  if (parts >= 1 && parts <= computing) return;
  const std::string n = std::to_string(p.size());
  throw UserError("partition",
                  "cannot cut " + n + " positions" +
                      (computing < static_cast<int>(p.size()) ? ", " + std::to_string(computing) + " of them computing," : "") +
                      " into " + std::to_string(parts) + " parts" +
                      (computing < static_cast<int>(p.size()) ? " that each hold one" : ""),
                  "use between 1 and " + std::to_string(computing) + " stages");
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

struct Span {
  int first, last;  // positions, inclusive; empty when first > last
  int width() const { return std::max(last - first + 1, 0); }
};

// Where part k of `parts` can end under max_cost whatever the memory: every part takes a
// computing position, the parts up to k cover at most (k+1)*max_cost and those after it at most
// (K-1-k)*max_cost.
Span end_span(const RangeMeasure& r, int n, int parts, int k, int64_t max_cost) {
  const int64_t total = r.cost(0, n);
  const int64_t ahead = saturating_mul(k + 1, max_cost);
  const int64_t behind = saturating_mul(parts - 1 - k, max_cost);
  // After the (k+1)-th computing position; at or before the one the later parts need first.
  const int lo = k == parts - 1 ? n : r.computing_at(k) + 1;
  const int hi = k == parts - 1 ? n + 1 : r.computing_at(r.computing() - (parts - 1 - k)) + 1;
  const int first = first_past(lo, hi, [&](int i) { return total - r.cost(0, i) <= behind; });
  const int last = first_past(first, hi, [&](int i) { return r.cost(0, i) > ahead; }) - 1;
  return {first, last};
}

// Decides whether some split into K parts has every part cost <= max_cost and every part
// memory <= limit, sweeping the parts left to right over the positions where they can end.
// Copies of shared parameters are left out (params(0, i) has none), so with shared parameters
// a "feasible" is only a lower bound, which solve_checked confirms with FewestCrossing.
//
// Memory of part k over [j, i), with f = in_flight(k), sf = state factor and prefix sums
// P (params), A (activations):
//   sf*(P[i]-P[j]) + f*(A[i]-A[j] + cut[j]) = g(j) + h(i),
//   g(j) = f*cut[j] - sf*P[j] - f*A[j],   h(i) = sf*P[i] + f*A[i].
// End i is reachable when some reachable start j in [lo(i), last_start(i)] has
// g(j) <= limit - h(i), where lo(i) is the first j with cost(j, i) <= max_cost and last_start(i)
// the last j whose part to i holds a computing position (i - 1 when every position computes).
// Both ends of that window only move right as i does, so the least g in it is the front of a
// monotone deque: linear per stage.
// Each stage visits only the ends its costs allow (end_span), a narrow band near the optimum.
class ReachSweep {
 public:
  ReachSweep(const LinearProblem& p, int parts, const MemoryModel& m)
      : p_(p), r_(p), m_(m), n_(static_cast<int>(p.size())), parts_(parts),
        reached_(n_ + 1, 0), g_(n_ + 1), deque_(n_ + 1) {}

  bool feasible(int64_t max_cost, int64_t limit) {
    Span starts{0, 0};
    reached_[0] = ++stamp_;
    for (int k = 0; k < parts_; ++k) {
      const Span ends = end_span(r_, n_, parts_, k, max_cost);
      if (ends.first > ends.last || !sweep_stage(k, starts, ends, max_cost, limit)) return false;
      starts = ends;
    }
    return reached_[n_] == stamp_;
  }

 private:
  // Marks the ends of part k reachable from the starts marked by the previous stage (stamps:
  // reached_[i] == stamp_ on entry for starts, on return for ends). False when none is.
  bool sweep_stage(int k, Span starts, Span ends, int64_t max_cost, int64_t limit) {
    const int64_t f = m_.in_flight(k, parts_), sf = m_.state_factor;
    const int64_t from = stamp_, to = ++stamp_;
    // The starts, read before any of them is marked an end of this stage.
    is_start_.assign(static_cast<size_t>(starts.width()), 0);
    for (int j = starts.first; j <= starts.last; ++j) is_start_[j - starts.first] = reached_[j] == from;
    size_t head = 0, tail = 0;  // deque_[head, tail): starts, g_ increasing
    auto enter = [&](int j) {
      if (j > starts.last || !is_start_[j - starts.first]) return;
      g_[j] = f * p_.cut_bytes[j] - sf * r_.params(0, j) - f * r_.activations(0, j);
      while (tail > head && g_[deque_[tail - 1]] >= g_[j]) --tail;
      deque_[tail++] = j;
    };
    int next = starts.first;  // the first start not entered yet
    int lo = starts.first;    // first start with cost(lo, i) <= max_cost
    bool any = false;
    for (int i = ends.first; i <= ends.last; ++i) {
      const int last = r_.last_start(i);
      for (; next <= last; ++next) enter(next);
      while (lo <= last && r_.cost(lo, i) > max_cost) ++lo;
      while (tail > head && deque_[head] < lo) ++head;
      const int64_t h = sf * r_.params(0, i) + f * r_.activations(0, i);
      if (!(tail > head && g_[deque_[head]] <= limit - h)) continue;
      reached_[i] = to;
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
  std::vector<char> is_start_;    // by start of the current stage: reached by the one before
};

// The second phase: among the splits whose part costs are all <= bound and whose parts fit the
// limit, the one with the fewest bytes crossing the inner cuts, then the smallest largest part
// cost, then the earliest cuts.
//
// Fewest bytes: a DP over the parts right to left, part k starting at j,
//   fewest[K][n] = 0,   fewest[k][j] = [k > 0] cut[j] + min over i in (j, last_end_k(j)] of
//                                                        fewest[k+1][i],
// last_end_k(j) the last end whose cost is within the bound and whose memory fits: for a fixed
// start, memory only grows with the end (bytes are >= 0), so the ends that fit are a prefix.
// As j falls the window's left edge falls with it, so a stack of suffix minima answers each
// min with one binary search.
// Part k over [j, i) is tight when fewest[k+1][i] = fewest[k][j] - [k > 0] cut[j]; the splits
// with the fewest bytes are exactly the chains of tight parts from 0 to n. Their least largest
// cost is the least t in [T*, bound] for which such a chain has every part cost <= t: a
// bisection whose probe marks, right to left, the starts that reach n. A probe is linear: ends
// are grouped by their fewest[k+1] value, a tight end's group is known from the start, and
// walking j down the probe keeps per group the nearest end that reaches n. At the least t, the
// walk from 0 that ends each part at the first tight end reaching n gives the earliest cuts.
class FewestCrossing {
 public:
  FewestCrossing(const LinearProblem& p, int parts, const MemoryModel& m, int64_t limit,
                 int64_t bound)
      : p_(p), r_(p), m_(m), limit_(limit), bound_(bound), n_(static_cast<int>(p.size())),
        parts_(parts), stages_(parts), fewest_(parts + 1), reach_(parts + 1) {
    for (int k = 0; k < parts_; ++k) build_stage(k);
    fewest_[parts_].assign(1, 0);  // over the span {n, n}
    reach_[parts_].assign(1, 1);
    for (int k = parts_ - 1; k >= 0; --k) fill_fewest(k);
    for (int k = 0; k < parts_; ++k) group_ends(k);
  }

  // Whether some split has every part cost <= bound and fits the limit (memory exact).
  bool feasible() { return probe(bound_); }

  // The split, knowing no split has a largest cost below least_cost (T*).
  std::vector<PartRange> solve(int64_t least_cost) {
    PT_CHECK(probe(bound_), "no split within the bound");
    std::vector<int> cuts = walk(bound_);
    // Invariant: cuts are the earliest of the chains whose largest cost is at most hi, and
    // reach it.
    int64_t lo = least_cost, hi = largest_cost(cuts);
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (probe(mid)) {
        cuts = walk(mid);
        hi = largest_cost(cuts);
      } else {
        lo = mid + 1;
      }
    }
    return ranges(cuts);
  }

 private:
  struct Stage {
    Span starts, ends;          // where part k can start and end under the bound
    std::vector<int> last_end;  // by start: the last end within the bound that fits memory
    std::vector<int> group;     // by end: the group of its fewest[k+1]; -1 where unreached
    std::vector<int> want;      // by start: the group of its tight ends; -1 where unreached
    int groups = 0;
  };

  void build_stage(int k) {
    Stage& s = stages_[k];
    s.starts = k == 0 ? Span{0, 0} : stages_[k - 1].ends;
    s.ends = end_span(r_, n_, parts_, k, bound_);
    s.last_end.resize(s.starts.width());
    int hi = s.ends.last;
    for (int j = s.starts.last; j >= s.starts.first; --j) {
      const int first = r_.first_end(j);  // last_end below it: no end
      while (hi >= first && r_.cost(j, hi) > bound_) --hi;
      const auto over_limit = [&](int i) { return r_.memory(j, i, k, parts_, m_) > limit_; };
      s.last_end[j - s.starts.first] =
          limit_ == kNoLimit ? hi : first_past(first, hi + 1, over_limit) - 1;
    }
  }

  void fill_fewest(int k) {
    const Stage& s = stages_[k];
    const std::vector<int64_t>& next = fewest_[k + 1];  // by end
    std::vector<int64_t>& out = fewest_[k];             // by start
    out.assign(s.starts.width(), kUnreached);
    std::vector<int> stack;  // ends from first_end(j), bottom to top: positions falling, fewest rising
    int i = s.ends.last;
    for (int j = s.starts.last; j >= s.starts.first; --j) {
      for (; i >= r_.first_end(j) && i >= s.ends.first; --i) {
        const int64_t v = next[i - s.ends.first];
        if (v == kUnreached) continue;
        while (!stack.empty() && next[stack.back() - s.ends.first] >= v) stack.pop_back();
        stack.push_back(i);
      }
      // The deepest end at or before last_end holds the least fewest in [first_end(j), last_end].
      const int last = s.last_end[j - s.starts.first];
      const auto at =
          std::partition_point(stack.begin(), stack.end(), [&](int e) { return e > last; });
      if (at != stack.end())
        out[j - s.starts.first] = (k > 0 ? p_.cut_bytes[j] : 0) + next[*at - s.ends.first];
    }
  }

  void group_ends(int k) {
    Stage& s = stages_[k];
    const std::vector<int64_t>& next = fewest_[k + 1];
    std::vector<int64_t> values;
    for (int64_t v : next)
      if (v != kUnreached) values.push_back(v);
    std::sort(values.begin(), values.end());
    values.erase(std::unique(values.begin(), values.end()), values.end());
    s.groups = static_cast<int>(values.size());
    auto group_of = [&](int64_t v) {
      const auto it = std::lower_bound(values.begin(), values.end(), v);
      return it != values.end() && *it == v ? static_cast<int>(it - values.begin()) : -1;
    };
    s.group.resize(next.size());
    for (size_t e = 0; e < next.size(); ++e)
      s.group[e] = next[e] == kUnreached ? -1 : group_of(next[e]);
    s.want.assign(s.starts.width(), -1);
    for (int j = s.starts.first; j <= s.starts.last; ++j) {
      const int64_t v = fewest_[k][j - s.starts.first];
      if (v == kUnreached) continue;
      s.want[j - s.starts.first] = group_of(v - (k > 0 ? p_.cut_bytes[j] : 0));
      PT_CHECK(s.want[j - s.starts.first] >= 0, "a start's fewest bytes reach no end");
    }
  }

  // Marks reach_[k][j] where part k can start at j and reach n over tight parts of cost <= t.
  // Visits only the starts and ends that costs <= t allow, within those the bound allows.
  bool probe(int64_t t) {
    for (int k = parts_ - 1; k >= 0; --k) {
      const Stage& s = stages_[k];
      const std::vector<char>& next = reach_[k + 1];  // by end
      std::vector<char>& out = reach_[k];             // by start
      out.assign(s.starts.width(), 0);
      nearest_.assign(s.groups, INT_MAX);  // by group: the nearest end after j reaching n
      const Span starts = k == 0 ? Span{0, 0} : end_span(r_, n_, parts_, k - 1, t);
      const Span ends = end_span(r_, n_, parts_, k, t);
      int i = ends.last, hi = ends.last;
      bool any = false;
      for (int j = starts.last; j >= starts.first; --j) {
        const int first = r_.first_end(j);
        for (; i >= first && i >= ends.first; --i)
          if (next[i - s.ends.first]) nearest_[s.group[i - s.ends.first]] = i;
        while (hi >= first && r_.cost(j, hi) > t) --hi;
        const int want = s.want[j - s.starts.first];
        if (want < 0 || nearest_[want] > std::min(hi, s.last_end[j - s.starts.first])) continue;
        out[j - s.starts.first] = 1;
        any = true;
      }
      if (!any) return false;
    }
    return reach_[0][0];
  }

  // The earliest cuts of the chains the last probe(t) found: each part ends at the first
  // tight end that reaches n.
  std::vector<int> walk(int64_t t) const {
    std::vector<int> cuts;
    int j = 0;
    for (int k = 0; k < parts_; ++k) {
      const Stage& s = stages_[k];
      const int want = s.want[j - s.starts.first], last = s.last_end[j - s.starts.first];
      int i = std::max(r_.first_end(j), s.ends.first);
      for (; i <= last && r_.cost(j, i) <= t; ++i)
        if (reach_[k + 1][i - s.ends.first] && s.group[i - s.ends.first] == want) break;
      PT_CHECK(i <= last && r_.cost(j, i) <= t, "a start that reaches n has no tight part");
      if (k < parts_ - 1) cuts.push_back(i);
      j = i;
    }
    PT_CHECK(j == n_, "walk does not end at n");
    return cuts;
  }

  int64_t largest_cost(const std::vector<int>& cuts) const {
    int64_t worst = 0;
    for (const PartRange& r : ranges(cuts)) worst = std::max(worst, r.cost);
    return worst;
  }

  std::vector<PartRange> ranges(const std::vector<int>& cuts) const {
    std::vector<PartRange> out(parts_);
    for (int k = 0; k < parts_; ++k) {
      const int begin = k == 0 ? 0 : cuts[k - 1], end = k == parts_ - 1 ? n_ : cuts[k];
      out[k] = {begin, end, r_.cost(begin, end), 0, r_.memory(begin, end, k, parts_, m_)};
    }
    return out;
  }

  const LinearProblem& p_;
  RangeMeasure r_;
  MemoryModel m_;
  int64_t limit_, bound_;
  int n_, parts_;
  std::vector<Stage> stages_;
  std::vector<std::vector<int64_t>> fewest_;  // by part, then start; fewest_[K] over {n}
  std::vector<std::vector<char>> reach_;      // by part, then start: set by the last probe
  std::vector<int> nearest_;
};

// The solver when cut_cost is priced. Part k over [j, i) takes time(k, j, i) = cost(j, i) plus
// the cut_cost of its inner cuts, which depends on both ends, so neither the sweep's windows nor
// FewestCrossing's groups apply. DPs over (start, end) pairs, parts right to left, answer the
// same questions in three passes:
//  1. least[k][j] = min over ends i of max(time(k, j, i), least[k+1][i]): T* = least[0][0].
//  2. Under bound = floor(T* * (1 + slack)), per start the pair (fewest crossing bytes, least
//     largest time) of the chains to n, compared in that order: adding a part adds the same
//     bytes to both sides of a comparison and a max can only keep an order, so the best chain
//     from j extends a best chain from its end. best[0][0] = (B*, L*).
//  3. The fewest crossing bytes per start with every time <= L*; the walk from 0 ends each part
//     at the first end that keeps B*: of the splits reaching (B*, L*), the earliest cuts.
// A pass under a bound visits only the pairs it allows: a time is at least the cost, so part k
// starts and ends within end_span's cost bands and its end stops where cost(j, i) passes the
// bound; memory only grows with the end, so ends also stop at the last that fits. Pass 1 takes
// as its bound the time of the unpriced solver's split, which is near T* when links are cheap
// against stages: near-linear then, O(n^2 * parts) at worst.
class PricedSplit {
 public:
  PricedSplit(const LinearProblem& p, int parts, const MemoryModel& m, int64_t limit)
      : p_(p), r_(p), m_(m), limit_(limit), n_(static_cast<int>(p.size())), parts_(parts),
        last_fit_(parts, std::vector<int>(p.size() + 1, -1)) {}

  // T* given some split's largest time `upper`.
  int64_t least_time(int64_t upper) {
    std::vector<int64_t> next(n_ + 1, kNoLimit), here(n_ + 1);
    next[n_] = 0;
    for (int k = parts_ - 1; k >= 0; --k) {
      std::fill(here.begin(), here.end(), kNoLimit);
      const Span from = starts(k, upper), ends = end_span(r_, n_, parts_, k, upper);
      for (int j = from.first; j <= from.last; ++j)
        for_each_end(k, ends, j, upper, [&](int i, int64_t t) {
          if (next[i] != kNoLimit) here[j] = std::min(here[j], std::max(t, next[i]));
        });
      std::swap(next, here);
    }
    PT_CHECK(next[0] <= upper, "the unpriced split is not among those searched");
    return next[0];
  }

  std::vector<PartRange> solve(int64_t bound) {
    // Pass 2: (bytes, largest time) per start.
    using Best = std::pair<int64_t, int64_t>;
    const Best none{kUnreached, kUnreached};
    std::vector<Best> next(n_ + 1, none), here(n_ + 1);
    next[n_] = {0, 0};
    for (int k = parts_ - 1; k >= 0; --k) {
      std::fill(here.begin(), here.end(), none);
      const Span from = starts(k, bound), ends = end_span(r_, n_, parts_, k, bound);
      for (int j = from.first; j <= from.last; ++j)
        for_each_end(k, ends, j, bound, [&](int i, int64_t t) {
          if (next[i] == none) return;
          here[j] = std::min(here[j], Best{crossing(k, j) + next[i].first, std::max(t, next[i].second)});
        });
      std::swap(next, here);
    }
    PT_CHECK(next[0] != none, "no split within the bound");
    // Pass 3: fewest bytes with every time <= L*, then the walk.
    const int64_t most = next[0].second;
    std::vector<std::vector<int64_t>> fewest(parts_ + 1, std::vector<int64_t>(n_ + 1, kUnreached));
    fewest[parts_][n_] = 0;
    for (int k = parts_ - 1; k >= 0; --k) {
      const Span from = starts(k, most), ends = end_span(r_, n_, parts_, k, most);
      for (int j = from.first; j <= from.last; ++j)
        for_each_end(k, ends, j, most, [&](int i, int64_t) {
          if (fewest[k + 1][i] != kUnreached)
            fewest[k][j] = std::min(fewest[k][j], crossing(k, j) + fewest[k + 1][i]);
        });
    }
    PT_CHECK(fewest[0][0] == next[0].first, "the fewest bytes differ between passes");
    std::vector<PartRange> out;
    int j = 0;
    for (int k = 0; k < parts_; ++k) {
      int end = -1;
      for_each_end(k, end_span(r_, n_, parts_, k, most), j, most, [&](int i, int64_t) {
        if (end < 0 && fewest[k + 1][i] != kUnreached &&
            crossing(k, j) + fewest[k + 1][i] == fewest[k][j])
          end = i;
      });
      PT_CHECK(end > j, "a start on the best chain has no part");
      out.push_back({j, end, r_.cost(j, end), r_.link(j, end, k, parts_),
                     r_.memory(j, end, k, parts_, m_)});
      j = end;
    }
    PT_CHECK(j == n_, "walk does not end at n");
    return out;
  }

 private:
  int64_t crossing(int k, int j) const { return k > 0 ? p_.cut_bytes[j] : 0; }

  // Where part k can start when every part costs at most bound.
  Span starts(int k, int64_t bound) const {
    return k == 0 ? Span{0, 0} : end_span(r_, n_, parts_, k - 1, bound);
  }

  // The last end of part k from j whose memory fits, found once.
  int last_fit(int k, int j) {
    int& at = last_fit_[k][j];
    if (at < 0) {
      const auto over = [&](int i) { return r_.memory(j, i, k, parts_, m_) > limit_; };
      at = limit_ == kNoLimit ? n_ : first_past(std::min(r_.first_end(j), n_ + 1), n_ + 1, over) - 1;
    }
    return at;
  }

  // fn(i, time) for every end i of part k from j that fits memory, lies in the part's end band
  // under bound (`ends`, end_span's, the same for every start of the part), and takes time
  // <= bound; the last part ends at n.
  template <typename Fn>
  void for_each_end(int k, const Span& ends, int j, int64_t bound, Fn fn) {
    const int last = std::min(ends.last, last_fit(k, j));
    for (int i = std::max(r_.first_end(j), ends.first); i <= last && r_.cost(j, i) <= bound; ++i) {
      const int64_t t = r_.cost(j, i) + r_.link(j, i, k, parts_);
      if (t <= bound) fn(i, t);
    }
  }

  const LinearProblem& p_;
  RangeMeasure r_;
  MemoryModel m_;
  int64_t limit_;
  int n_, parts_;
  std::vector<std::vector<int>> last_fit_;  // by part, then start; -1 until found
};

// The largest part memory of a split that is always valid: K-1 parts ending just after each of
// the first K-1 computing positions, then the rest.
int64_t some_split_memory(const LinearProblem& p, int parts, const MemoryModel& m) {
  RangeMeasure r(p);
  const int n = static_cast<int>(p.size());
  int64_t worst = 0;
  for (int k = 0, begin = 0; k < parts; ++k) {
    const int end = k == parts - 1 ? n : r.computing_at(k) + 1;
    worst = std::max(worst, r.memory(begin, end, k, parts, m));
    begin = end;
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

// Whether some split has every part cost <= bound and fits `limit`, copies of shared parameters
// counted (FewestCrossing's memory is exact); monotone in both.
bool fits_exactly(const LinearProblem& p, int parts, const MemoryModel& m, int64_t limit, int64_t bound) {
  return FewestCrossing(p, parts, m, limit, bound).feasible();
}

// The smallest limit that fits with the copies counted, knowing `hi` fits.
int64_t exact_smallest_limit(const LinearProblem& p, int parts, const MemoryModel& m, int64_t no_cost_bound,
                             int64_t hi) {
  int64_t lo = 0;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits_exactly(p, parts, m, mid, no_cost_bound))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// The smallest limit that fits: the sweep's, or with shared parameters the exact one.
int64_t least_limit(const LinearProblem& p, int parts, const MemoryModel& m, ReachSweep& sweep, int64_t total) {
  const int64_t hi = some_split_memory(p, parts, m);
  return p.shared.empty() ? smallest_limit(sweep, total, hi) : exact_smallest_limit(p, parts, m, total, hi);
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

// floor(best * (1 + slack)), in long double: exact for any int64 best.
int64_t slack_bound(int64_t best, double slack, int64_t total) {
  const long double b = std::floor(static_cast<long double>(best) * (1.0L + slack));
  return b >= static_cast<long double>(total) ? total : static_cast<int64_t>(b);
}

void check_slack(double slack) {
  if (!(slack >= 0) || !std::isfinite(slack))
    throw UserError("partition", "slack must be a finite number >= 0, got " + std::to_string(slack),
                    "use 0 for the exact optimum, or e.g. 0.02 for 2%");
}

std::vector<PartRange> solve_checked(const LinearProblem& p, int parts, const MemoryModel& m,
                                     const SolveOptions& opts) {
  RangeMeasure r(p);
  const int n = static_cast<int>(p.size());
  const int64_t total = r.cost(0, n);
  const int64_t limit = m.limit == 0 ? kNoLimit : m.limit;
  if (r.priced()) {
    // The unpriced optimum (or the refusal when nothing fits: memory knows no prices) bounds T*.
    LinearProblem free_links = p;
    free_links.cut_cost.clear();
    int64_t upper = 0, k = 0;
    for (const PartRange& part : solve_checked(free_links, parts, m, SolveOptions{0}))
      upper = std::max(upper, part.cost + r.link(part.begin, part.end, static_cast<int>(k++), parts));
    PricedSplit priced(p, parts, m, limit);
    return priced.solve(slack_bound(priced.least_time(upper), opts.slack, kNoLimit));
  }
  ReachSweep sweep(p, parts, m);
  // The sweep leaves shared parameters' copies out: its answers are confirmed exactly.
  const bool copies = !p.shared.empty() && limit != kNoLimit;
  if (!sweep.feasible(total, limit) || (copies && !fits_exactly(p, parts, m, limit, total)))
    throw_no_fit(parts, m.limit, least_limit(p, parts, m, sweep, total));

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
  if (copies && !fits_exactly(p, parts, m, limit, lo)) {
    int64_t a = lo + 1, b = total;
    while (a < b) {
      const int64_t mid = a + (b - a) / 2;
      if (fits_exactly(p, parts, m, limit, mid))
        b = mid;
      else
        a = mid + 1;
    }
    lo = a;
  }
  return FewestCrossing(p, parts, m, limit, slack_bound(lo, opts.slack, total)).solve(lo);
}

}  // namespace

RangeMeasure::RangeMeasure(const LinearProblem& p)
    : p_(p), cost_(p.size() + 1), params_(p.size() + 1), act_(p.size() + 1),
      next_(p.size() + 1), prev_(p.size() + 1) {
  const int n = static_cast<int>(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    cost_[i + 1] = cost_[i] + p.cost[i];
    params_[i + 1] = params_[i] + p.param_bytes[i];
    act_[i + 1] = act_[i] + p.activation_bytes[i];
  }
  for (int i = 0; i < n; ++i)
    if (p.computes.empty() || p.computes[static_cast<size_t>(i)]) computing_.push_back(i);
  prev_[0] = -1;
  for (int i = 0; i < n; ++i)
    prev_[static_cast<size_t>(i) + 1] = p.computes.empty() || p.computes[static_cast<size_t>(i)] ? i : prev_[static_cast<size_t>(i)];
  next_[static_cast<size_t>(n)] = n;
  for (int i = n - 1; i >= 0; --i)
    next_[static_cast<size_t>(i)] = p.computes.empty() || p.computes[static_cast<size_t>(i)] ? i : next_[static_cast<size_t>(i) + 1];
  priced_ = std::any_of(p.cut_cost.begin(), p.cut_cost.end(), [](int64_t c) { return c != 0; });
}

int64_t RangeMeasure::link(int begin, int end, int part, int parts) const {
  if (!priced_) return 0;
  return (part > 0 ? p_.cut_cost[begin] : 0) + (part < parts - 1 ? p_.cut_cost[end] : 0);
}

int64_t RangeMeasure::params(int begin, int end) const {
  int64_t bytes = params_[end] - params_[begin];
  for (const SharedParam& s : p_.shared) {
    if (s.readers.front() >= begin) continue;  // counted where first read, or not in the range
    const auto next = std::lower_bound(s.readers.begin(), s.readers.end(), begin);
    if (next != s.readers.end() && *next < end) bytes += s.bytes;
  }
  return bytes;
}

int64_t RangeMeasure::memory(int begin, int end, int part, int parts,
                             const MemoryModel& m) const {
  return m.state_factor * params(begin, end) +
         m.in_flight(part, parts) * (activations(begin, end) + p_.cut_bytes[begin]);
}

std::vector<PartRange> solve_min_bottleneck(const LinearProblem& p, int parts,
                                            const MemoryModel& m, const SolveOptions& opts) {
  check_problem(p, m);
  check_parts(p, parts);
  check_slack(opts.slack);
  return solve_checked(p, parts, m, opts);
}

int64_t min_feasible_limit(const LinearProblem& p, int parts, const MemoryModel& m) {
  check_problem(p, m);
  check_parts(p, parts);
  ReachSweep sweep(p, parts, m);
  RangeMeasure r(p);
  return least_limit(p, parts, m, sweep, r.cost(0, static_cast<int>(p.size())));
}

std::vector<PartRange> split_at(const LinearProblem& p, const std::vector<int>& cuts,
                                const MemoryModel& m) {
  check_problem(p, m);
  const int n = static_cast<int>(p.size());
  const int parts = static_cast<int>(cuts.size()) + 1;
  if (parts > n)  // the caller's cuts: parts need not compute, only hold a position
    throw UserError("partition", "cannot cut " + std::to_string(n) + " positions into " + std::to_string(parts) + " parts",
                    "use between 1 and " + std::to_string(n) + " stages");
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
    out[k] = {begin, end, r.cost(begin, end), r.link(begin, end, k, parts),
              r.memory(begin, end, k, parts, m)};
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


}  // namespace pt
