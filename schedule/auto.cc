#include "schedule/auto.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "schedule/generators.h"
#include "schedule/list_scheduler.h"
#include "schedule/validate.h"
#include "schedule/walk.h"

namespace pt {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Candidate {
  Schedule schedule;
  const Costs* costs = nullptr;
  double makespan = kInf;
  std::string how;
};

class AutoSearch {
 public:
  AutoSearch(int stages, int micro_batches, const AutoOptions& o)
      : P(stages), M(micro_batches), opt_(o) {}

  AutoResult run() {
    check_limit();
    for (const Costs& costs : opt_.chunkings) try_hand_made(costs);
    const Candidate hand = best_;
    for (const Costs& costs : opt_.chunkings) try_policies(costs);
    refine();
    PT_CHECK(best_.costs, "a limit above least_memory fitted nothing");
    AutoResult r;
    r.schedule = best_.schedule;
    r.schedule.kind = "auto";
    r.simulation = simulate(r.schedule, *best_.costs, "auto");
    r.how = best_.how;
    r.tried = tried_;
    r.best_hand_made = hand.costs ? hand.how : "";
    r.best_hand_made_makespan = hand.makespan;
    return r;
  }

 private:
  // Below the least the list scheduler needs, no schedule keeps every device's micro-batch.
  void check_limit() const {
    if (opt_.memory_limit <= 0) return;
    double least = kInf;
    for (const Costs& costs : opt_.chunkings)
      for (Placement placement : {Placement::kLoop, Placement::kV})
        least = std::min(least, least_memory(costs, P, placement));
    if (opt_.memory_limit < least * (1 - 1e-9))
      throw UserError("--memory-limit", "no schedule fits: one micro-batch needs " +
                                            std::to_string(least) + " on some device",
                      "raise the limit to at least that");
  }

  bool fits(const Schedule& s, const Costs& costs) {
    const std::vector<double> peaks = peak_memory(s, costs);
    const double peak = *std::max_element(peaks.begin(), peaks.end());
    return opt_.memory_limit <= 0 || peak <= opt_.memory_limit * (1 + 1e-9);
  }

  // Simulated makespan if `s` fits, else infinity; keeps the best.
  double offer(Schedule s, const Costs& costs, const std::string& how) {
    ++tried_;
    if (!fits(s, costs)) return kInf;
    const Walk w = walk_schedule(s, costs);
    PT_CHECK(w.complete(), how + " does not run to its end");
    double makespan = 0;
    for (const auto& row : w.end)
      for (double e : row) makespan = std::max(makespan, e);
    if (makespan < best_.makespan * (1 - 1e-12)) best_ = {std::move(s), &costs, makespan, how};
    return makespan;
  }

  void try_hand_made(const Costs& costs) {
    const int v = static_cast<int>(costs.chunks.size()) / P;
    for (const KindInfo& k : schedule_kinds()) {
      if (v < k.min_chunks || v > k.max_chunks) continue;
      Schedule s = generate(k.name, P, M, v);
      validate(s, k.name);
      offer(std::move(s), costs, k.name);
    }
  }

  static std::string describe(const ListPolicy& p, const std::vector<double>& fp) {
    std::string caps, lags;
    char buf[32];
    for (size_t d = 0; d < p.cap.size(); ++d) {
      std::snprintf(buf, sizeof buf, "%.3g", p.cap[d] / fp[d]);
      caps += (caps.empty() ? "" : " ") + std::string(buf);
    }
    for (int l : p.w_lag) lags += (lags.empty() ? "" : " ") + std::to_string(l);
    return std::string("list scheduler: ") + placement_name(p.placement) + " placement, " +
           std::to_string(p.chunks) + " chunk(s) per device, " +
           (p.split ? "B/W split" : "fused BW") + ", micro-batches admitted per device [" +
           (caps.empty() ? "any" : caps) + "], W lag per device [" +
           (lags.empty() ? "idle time only" : lags) + "], " +
           (p.forward_order == ForwardOrder::kOldest ? "oldest" : "lowest chunk") +
           " forward first";
  }

  double offer_policy(const Costs& costs, const ListPolicy& p) {
    const std::vector<double> fp = footprints(costs, P, p.placement);
    ListResult r;
    try {
      r = list_schedule("auto", P, M, costs, p);
    } catch (const UserError&) {
      return kInf;  // a cap below what one micro-batch needs
    }
    const double makespan = offer(std::move(r.schedule), costs, describe(p, fp));
    if (makespan < best_list_makespan_) {
      best_list_makespan_ = makespan;
      best_policy_ = p;
      best_policy_costs_ = &costs;
    }
    return makespan;
  }

  // Caps to try, per device: the limit itself (all the memory there is), and 1F1B-, ZB-H2-
  // and V-shaped in-flight counts, each clipped to the limit.
  std::vector<std::vector<double>> cap_shapes(const std::vector<double>& fp) const {
    const double limit = opt_.memory_limit > 0 ? opt_.memory_limit : kInf;
    std::vector<std::vector<double>> shapes;
    auto shape = [&](auto count) {
      std::vector<double> caps;
      for (int d = 0; d < P; ++d)
        caps.push_back(std::min(limit, fp[static_cast<size_t>(d)] * count(d)));
      shapes.push_back(caps);
    };
    if (opt_.memory_limit > 0) shapes.push_back(std::vector<double>(static_cast<size_t>(P), limit));
    shape([&](int d) { return static_cast<double>(P - d); });
    shape([&](int d) { return 2.0 * (P - d) - 1; });
    shape([&](int) { return static_cast<double>(P); });
    shape([&](int) { return static_cast<double>(M); });
    return shapes;
  }

  void try_policies(const Costs& costs) {
    const int v = static_cast<int>(costs.chunks.size()) / P;
    std::vector<Placement> placements = {Placement::kLoop};
    if (v == 2) placements.push_back(Placement::kV);
    for (Placement placement : placements)
      for (bool split : {true, false}) {
        const std::vector<double> fp = footprints(costs, P, placement);
        for (const std::vector<double>& caps : cap_shapes(fp))
          for (const std::vector<int>& lags : lag_shapes(split))
            for (ForwardOrder order : {ForwardOrder::kOldest, ForwardOrder::kEntryFirst}) {
              ListPolicy p;
              p.chunks = v;
              p.placement = placement;
              p.split = split;
              p.cap = caps;
              p.w_lag = lags;
              p.forward_order = order;
              offer_policy(costs, p);
            }
      }
  }

  std::vector<std::vector<int>> lag_shapes(bool split) const {
    if (!split) return {{}};
    std::vector<std::vector<int>> shapes = {{}};
    auto shape = [&](auto lag) {
      std::vector<int> lags;
      for (int d = 0; d < P; ++d) lags.push_back(lag(d));
      shapes.push_back(lags);
    };
    shape([](int) { return 0; });
    shape([](int) { return 1; });
    shape([](int d) { return d; });
    shape([&](int d) { return P - 1 - d; });
    return shapes;
  }

  // Coordinate descent from the best list policy: each device's W lag and cap in turn.
  void refine() {
    if (!best_policy_costs_) return;
    int budget = opt_.refine_evaluations;
    bool improved = true;
    while (improved && budget > 0) {
      improved = false;
      for (int d = 0; d < P && budget > 0; ++d) {
        ListPolicy base = best_policy_;
        if (base.split) {
          if (base.w_lag.empty()) base.w_lag.assign(static_cast<size_t>(P), -1);
          for (int lag : {-1, 0, 1, 2, 3, 4, 6, 8, P - 1 - d, d}) {
            if (budget-- <= 0) break;
            ListPolicy p = base;
            p.w_lag[static_cast<size_t>(d)] = lag;
            const double before = best_list_makespan_;
            offer_policy(*best_policy_costs_, p);
            improved |= best_list_makespan_ < before;
          }
        }
        if (base.cap.empty()) continue;
        const std::vector<double> fp = footprints(*best_policy_costs_, P, base.placement);
        for (double step : {-2.0, -1.0, 1.0, 2.0}) {
          if (budget-- <= 0) break;
          ListPolicy p = best_policy_;
          p.cap[static_cast<size_t>(d)] += step * fp[static_cast<size_t>(d)];
          if (opt_.memory_limit > 0) p.cap[static_cast<size_t>(d)] = std::min(p.cap[static_cast<size_t>(d)], opt_.memory_limit);
          const double before = best_list_makespan_;
          offer_policy(*best_policy_costs_, p);
          improved |= best_list_makespan_ < before;
        }
      }
    }
  }

  const int P, M;
  const AutoOptions& opt_;
  Candidate best_;
  ListPolicy best_policy_;
  const Costs* best_policy_costs_ = nullptr;
  double best_list_makespan_ = kInf;
  int tried_ = 0;
};

}  // namespace

AutoResult auto_schedule(int stages, int micro_batches, const AutoOptions& options) {
  if (options.chunkings.empty())
    throw UserError("auto", "needs costs for at least one chunking", "");
  return AutoSearch(stages, micro_batches, options).run();
}

}  // namespace pt
