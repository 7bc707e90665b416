// partition/linear_partition.h: the exact solver under every partition strategy.
//
// In: a graph flattened to positions 0..n-1 (nodes in topological order) with, per position, a
// cost, parameter bytes and kept activation bytes, and per cut point the bytes of the tensors
// crossing it. Out: K contiguous ranges, each holding a computing position and within the
// memory limit, whose largest range cost is within a slack of the least possible, and which
// among those send the fewest bytes across the cuts. Knows nothing of graphs: partitioner.cc builds the problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/bytes.h"  // format_bytes, for the reports that print part memory

namespace pt {

// A parameter read at several positions (a tie, a module called twice): param_bytes counts it at
// its first reader; every other part holding one of its readers holds a copy of it too.
struct SharedParam {
  int64_t bytes = 0;
  std::vector<int> readers;  // positions, ascending, at least two
};

struct LinearProblem {
  std::vector<int64_t> cost;              // n: cost of position i (>= 0)
  std::vector<int64_t> param_bytes;       // n: parameter bytes first used at position i (>= 0)
  std::vector<SharedParam> shared;        // parameters read at several positions
  std::vector<int64_t> activation_bytes;  // n: bytes position i keeps per micro-batch (>= 0)
  std::vector<int64_t> cut_bytes;         // n+1: bytes of tensors crossing a cut placed just
                                          // before position i (cut_bytes[0]: the graph inputs)
  // n+1 or empty: what moving the tensors of a cut placed before position i costs the parts on
  // either side of it, in `cost` units (partition/link.h prices it). An inner cut at i adds
  // cut_cost[i] to the part ending there (it waits for the gradients coming back) and to the
  // part starting there (it waits for the activations); empty or all 0: transfers are free.
  std::vector<int64_t> cut_cost;
  // n or empty: whether position i computes (a node with FLOPs; not a Reshape, Transpose or
  // Gather alone). Every part the solvers make holds at least one computing position, so no
  // stage is left with data movement only; empty: every position computes (parts are only
  // non-empty). split_at, where the caller names the cuts, does not ask.
  std::vector<char> computes;
  size_t size() const { return cost.size(); }
};

// Memory of part k (0-based) of K covering [begin, end):
//   state_factor * params + in_flight(k) * (activations + cut_bytes[begin])
// where params are the bytes first used in the range plus a copy of every shared parameter that
// a position in the range reads and an earlier part read first;
// where in_flight(k) = K - k: under 1F1B the k-th part holds K - k micro-batches at once, and
// it keeps the tensors it received for its backward. limit 0 means no limit.
struct MemoryModel {
  int64_t limit = 0;
  int64_t state_factor = 4;  // parameter + gradient + two AdamW moments

  int64_t in_flight(int part, int parts) const { return parts - part; }
};

struct PartRange {
  int begin = 0;  // first position
  int end = 0;    // one past the last position
  int64_t cost = 0;
  int64_t link = 0;  // cut_cost of its inner cuts: the transfers it waits for
  int64_t memory = 0;

  int64_t time() const { return cost + link; }
};

// Memory of one part under the model above. O(1) given the prefix sums.
class RangeMeasure {
 public:
  explicit RangeMeasure(const LinearProblem& p);
  int64_t cost(int begin, int end) const { return cost_[end] - cost_[begin]; }
  int64_t params(int begin, int end) const;  // with the copies of shared parameters
  int64_t activations(int begin, int end) const { return act_[end] - act_[begin]; }
  int64_t memory(int begin, int end, int part, int parts, const MemoryModel& m) const;
  int64_t link(int begin, int end, int part, int parts) const;  // cut_cost of its inner cuts
  bool priced() const { return priced_; }                       // some cut_cost is not 0
  // The computing positions (LinearProblem::computes): how many; the k-th (0-based); the least
  // end of a part from `begin` that holds one (n + 1: none does); the last start of a part up to
  // `end` that holds one (-1: none does).
  int computing() const { return static_cast<int>(computing_.size()); }
  int computing_at(int k) const { return computing_[static_cast<size_t>(k)]; }
  int first_end(int begin) const { return next_[static_cast<size_t>(begin)] + 1; }
  int last_start(int end) const { return prev_[static_cast<size_t>(end)]; }

 private:
  const LinearProblem& p_;
  std::vector<int64_t> cost_, params_, act_;  // prefix sums, size n+1
  std::vector<int> computing_;                // positions, ascending
  std::vector<int> next_, prev_;              // size n+1: first computing >= i (n: none), last < i
  bool priced_ = false;
};

struct SolveOptions {
  // How far above the least bottleneck T* a split may go to send fewer bytes across its cuts:
  // splits whose largest part cost is at most floor(T* * (1 + slack)) count as balanced. 0
  // keeps T* exactly. Finite and >= 0; 0.02 lets cuts move to block boundaries for 2%.
  double slack = 0.02;
};

// Splits [0, n) into `parts` contiguous ranges, each holding a computing position
// (LinearProblem::computes), whose memory fits m.limit; returns the ranges in order, cost, link
// and memory filled. A part's time is its cost plus its link; the
// bottleneck is the largest part time. Exact, in two phases:
//  1. T*, the least largest part cost: binary search over the bottleneck with an
//     O(n * parts) reachability sweep per probe.
//  2. Among the splits whose largest part cost is <= floor(T* * (1 + opts.slack)), the one
//     with the fewest bytes crossing the inner cuts (sum of cut_bytes[begin] over parts
//     1..K-1), ties broken by the smaller largest part cost, then by the earliest cuts (first
//     cut first). A DP over the parts, O(n * parts * log n), then a bisection over the largest
//     cost in [T*, bound] whose probes are O(n * parts) each.
// With cut_cost priced a part's time depends on both its cuts, so the same two phases run as
// plain DPs over (start, end) pairs instead, O(n^2 * parts) each, with the same answer: the
// fewest crossing bytes within the bound, then the smallest largest time, then the earliest cuts.
// Throws UserError when parts is not in [1, computing positions], when opts.slack is negative
// or not finite, or
// when no split fits (the message names the smallest limit that would, see min_feasible_limit).
std::vector<PartRange> solve_min_bottleneck(const LinearProblem& p, int parts,
                                            const MemoryModel& m, const SolveOptions& opts = {});

// Parts ending where the caller says: cuts[i] is the first position of part i+1. Throws
// UserError naming the bad cut unless 0 < cuts[0] < cuts[1] < ... < n, and naming the part
// when one does not fit m.limit.
std::vector<PartRange> split_at(const LinearProblem& p, const std::vector<int>& cuts,
                                const MemoryModel& m);

// The smallest m.limit under which some split into `parts` fits, whatever the cost: the
// minimum over splits of the largest part memory (m.limit itself is ignored). Can be 0, which
// as a limit means none. Throws UserError when parts is not in [1, computing positions].
int64_t min_feasible_limit(const LinearProblem& p, int parts, const MemoryModel& m);


}  // namespace pt
