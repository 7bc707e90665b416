#include "schedule/list_scheduler.h"

#include <algorithm>
#include <queue>
#include <set>
#include <tuple>

#include "core/error.h"

namespace pt {

std::vector<double> footprints(const Costs& costs, int stages, Placement placement) {
  std::vector<double> fp(static_cast<size_t>(stages), 0.0);
  for (size_t c = 0; c < costs.chunks.size(); ++c)
    fp[static_cast<size_t>(device_of(placement, stages, static_cast<int>(c)))] +=
        costs.chunks[c].activation;
  return fp;
}

double least_memory(const Costs& costs, int stages, Placement placement) {
  std::vector<double> entry(static_cast<size_t>(stages), 0.0), other(entry);
  for (int c = 0; c < static_cast<int>(costs.chunks.size()); ++c) {
    const size_t d = static_cast<size_t>(device_of(placement, stages, c));
    const double act = costs.chunks[static_cast<size_t>(c)].activation;
    if (c < stages) entry[d] = act;
    else other[d] = std::max(other[d], act);
  }
  double need = 0;
  for (size_t d = 0; d < entry.size(); ++d) need = std::max(need, entry[d] + other[d]);
  return need;
}

namespace {

constexpr double kEps = 1e-9;

struct Candidate {
  double ready;
  int m, c;
};

struct Device {
  double free_at = 0;
  double first_start = -1;  // when the device's first action starts
  double held = 0;  // activations kept now
  std::vector<Candidate> forward, backward;
  std::set<std::pair<int, int>> pending_w;  // (micro-batch, chunk), oldest first
  std::vector<Action> order;
};

class ListScheduler {
 public:
  ListScheduler(int stages, int micro_batches, const Costs& costs, const ListPolicy& policy)
      : P(stages), M(micro_batches), C(stages * policy.chunks), costs_(costs), pol_(policy),
        dev_(static_cast<size_t>(P)), fin_f_(static_cast<size_t>(C * M), -1),
        fin_b_(static_cast<size_t>(C * M), -1) {
    PT_CHECK(static_cast<int>(costs.chunks.size()) == C, "costs for " +
             std::to_string(costs.chunks.size()) + " chunks, schedule has " + std::to_string(C));
    other_.assign(static_cast<size_t>(P), 0.0);
    for (int c = 0; c < C; ++c) {
      device_.push_back(device_of(policy.placement, P, c));
      if (!is_entry(c))
        other_[static_cast<size_t>(device_.back())] =
            std::max(other_[static_cast<size_t>(device_.back())], costs.chunks[static_cast<size_t>(c)].activation);
    }
    for (int d = 0; d < P; ++d) {
      const double cap = cap_of(d);
      const double need = costs.chunks[static_cast<size_t>(d)].activation + other_[static_cast<size_t>(d)];
      if (cap + kEps * std::max(1.0, cap) < need)
        throw UserError("memory limit", "device " + std::to_string(d) + " needs " +
                                            std::to_string(need) +
                                            " for one micro-batch but the limit is " +
                                            std::to_string(cap),
                        "raise the limit");
    }
  }

  double run() {
    add_forward(0, 0, 0.0);
    const size_t total = static_cast<size_t>(C) * M * (pol_.split ? 3 : 2);
    while (!events_.empty() && scheduled_ < total) {
      auto [t, d] = events_.top();
      events_.pop();
      step(d, t);
    }
    PT_CHECK(scheduled_ == total, "list scheduler stalled after " + std::to_string(scheduled_) +
                                      " of " + std::to_string(total) + " actions");
    double makespan = 0;
    for (const Device& x : dev_) makespan = std::max(makespan, x.free_at);
    return makespan;
  }

  // The longest device span, first start to last end: what a step costs once steps overlap.
  double longest_span() const {
    double span = 0;
    for (const Device& x : dev_)
      if (x.first_start >= 0) span = std::max(span, x.free_at - x.first_start);
    return span;
  }

  std::vector<std::vector<Action>> orders() {
    std::vector<std::vector<Action>> out;
    for (Device& x : dev_) out.push_back(std::move(x.order));
    return out;
  }

 private:
  using Event = std::pair<double, int>;

  double cap_of(int d) const {
    return pol_.cap.empty() ? 1e300 : pol_.cap[static_cast<size_t>(d)];
  }
  int lag_of(int d) const { return pol_.w_lag.empty() ? -1 : pol_.w_lag[static_cast<size_t>(d)]; }
  size_t at(int m, int c) const { return static_cast<size_t>(c) * M + m; }
  double comm(int from, int to) const {  // chunk `from` and `to` are neighbours
    if (device_[static_cast<size_t>(from)] == device_[static_cast<size_t>(to)]) return 0;
    return costs_.chunks[static_cast<size_t>(std::min(from, to))].comm;
  }
  bool is_entry(int c) const { return c == device_[static_cast<size_t>(c)]; }  // round 0

  void wake(int d, double t) { events_.push({std::max(t, dev_[static_cast<size_t>(d)].free_at), d}); }
  void add_forward(int m, int c, double ready) {
    const int d = device_[static_cast<size_t>(c)];
    dev_[static_cast<size_t>(d)].forward.push_back({ready, m, c});
    wake(d, ready);
  }
  void add_backward(int m, int c, double ready) {
    const int d = device_[static_cast<size_t>(c)];
    dev_[static_cast<size_t>(d)].backward.push_back({ready, m, c});
    wake(d, ready);
  }

  // Memory rule: F(m, c) fits if what the device holds plus c's activation stays within the
  // cap; a micro-batch's first F on a device (entry) must also leave room for one more of the
  // device's other chunks, so a micro-batch already on its way can always take its next step.
  bool admissible(int d, const Candidate& x) const {
    const double act = costs_.chunks[static_cast<size_t>(x.c)].activation;
    const double room = is_entry(x.c) ? act + other_[static_cast<size_t>(d)] : act;
    return dev_[static_cast<size_t>(d)].held + room <= cap_of(d) + kEps * std::max(1.0, room);
  }

  // Index of the best candidate ready by `now` (and admitted, for F), or -1.
  int best_backward(const Device& x, double now) const {
    int best = -1;
    for (size_t i = 0; i < x.backward.size(); ++i) {
      const Candidate& k = x.backward[i];
      if (k.ready > now + kEps) continue;
      if (best < 0 || std::make_pair(k.m, -k.c) < std::make_pair(x.backward[best].m, -x.backward[best].c))
        best = static_cast<int>(i);
    }
    return best;
  }
  std::pair<int, int> forward_key(const Candidate& k) const {
    return pol_.forward_order == ForwardOrder::kOldest ? std::make_pair(k.m, -k.c)
                                                       : std::make_pair(k.c, k.m);
  }
  int best_forward(int d, double now) const {
    const Device& x = dev_[static_cast<size_t>(d)];
    int best = -1;
    for (size_t i = 0; i < x.forward.size(); ++i) {
      const Candidate& k = x.forward[i];
      if (k.ready > now + kEps || !admissible(d, k)) continue;
      if (best < 0 || forward_key(k) < forward_key(x.forward[best])) best = static_cast<int>(i);
    }
    return best;
  }

  void step(int d, double now) {
    Device& x = dev_[static_cast<size_t>(d)];
    if (x.free_at > now + kEps) return;  // busy; its own event comes at free_at
    const bool w_due = pol_.split && !x.pending_w.empty() && lag_of(d) >= 0 &&
                       static_cast<int>(x.pending_w.size()) > lag_of(d);
    if (w_due) return run_w(d, now);
    const int b = best_backward(x, now), f = best_forward(d, now);
    if (pol_.forward_first && f >= 0) return run_f(d, f, now);
    if (b >= 0) return run_b(d, b, now);
    if (f >= 0) return run_f(d, f, now);
    if (pol_.split && !x.pending_w.empty()) return run_w(d, now);
    double next = 1e300;  // nothing ready: wait for the earliest known arrival
    for (const Candidate& k : x.backward) next = std::min(next, k.ready);
    for (const Candidate& k : x.forward)
      if (admissible(d, k)) next = std::min(next, k.ready);
    if (next < 1e300 && next > now + kEps) events_.push({next, d});
  }

  double finish(int d, Action a, double now, double duration) {
    Device& x = dev_[static_cast<size_t>(d)];
    if (x.order.empty()) x.first_start = now;
    x.order.push_back(a);
    x.free_at = now + duration;
    events_.push({x.free_at, d});
    ++scheduled_;
    return x.free_at;
  }

  void run_f(int d, int i, double now) {
    Device& x = dev_[static_cast<size_t>(d)];
    const Candidate k = x.forward[static_cast<size_t>(i)];
    x.forward[static_cast<size_t>(i)] = x.forward.back();
    x.forward.pop_back();
    x.held += costs_.chunks[static_cast<size_t>(k.c)].activation;
    const double end = finish(d, {Op::kF, k.c, k.m}, now, costs_.chunks[static_cast<size_t>(k.c)].f);
    fin_f_[at(k.m, k.c)] = end;
    if (k.c == 0 && k.m + 1 < M) add_forward(k.m + 1, 0, now);
    if (k.c + 1 < C) add_forward(k.m, k.c + 1, end + comm(k.c, k.c + 1));
    if (k.c + 1 == C) add_backward(k.m, k.c, end);
    else if (fin_b_[at(k.m, k.c + 1)] >= 0)
      add_backward(k.m, k.c, std::max(end, fin_b_[at(k.m, k.c + 1)] + comm(k.c + 1, k.c)));
  }

  void run_b(int d, int i, double now) {
    Device& x = dev_[static_cast<size_t>(d)];
    const Candidate k = x.backward[static_cast<size_t>(i)];
    x.backward[static_cast<size_t>(i)] = x.backward.back();
    x.backward.pop_back();
    const ChunkCost& cost = costs_.chunks[static_cast<size_t>(k.c)];
    const double end = pol_.split ? finish(d, {Op::kB, k.c, k.m}, now, cost.b)
                                  : finish(d, {Op::kBW, k.c, k.m}, now, cost.b + cost.w);
    x.held -= pol_.split ? cost.activation - cost.w_keep : cost.activation;
    if (pol_.split) x.pending_w.insert({k.m, k.c});
    fin_b_[at(k.m, k.c)] = end;
    if (k.c > 0 && fin_f_[at(k.m, k.c - 1)] >= 0)
      add_backward(k.m, k.c - 1, std::max(fin_f_[at(k.m, k.c - 1)], end + comm(k.c, k.c - 1)));
  }

  void run_w(int d, double now) {
    Device& x = dev_[static_cast<size_t>(d)];
    const auto [m, c] = *x.pending_w.begin();
    x.pending_w.erase(x.pending_w.begin());
    const ChunkCost& cost = costs_.chunks[static_cast<size_t>(c)];
    x.held -= cost.w_keep;
    finish(d, {Op::kW, c, m}, now, cost.w);
  }

  const int P, M, C;
  const Costs& costs_;
  const ListPolicy& pol_;
  std::vector<Device> dev_;
  std::vector<int> device_;  // chunk -> device
  std::vector<double> fin_f_, fin_b_;
  std::vector<double> other_;  // per device: the largest activation of a non-entry chunk
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  size_t scheduled_ = 0;
};

}  // namespace

ListResult list_schedule(const std::string& kind, int stages, int micro_batches,
                         const Costs& costs, const ListPolicy& policy) {
  PT_CHECK(stages >= 1 && micro_batches >= 1 && policy.chunks >= 1);
  ListScheduler s(stages, micro_batches, costs, policy);
  ListResult r;
  r.makespan = s.run();
  r.span = s.longest_span();
  r.schedule.kind = kind;
  r.schedule.stages = stages;
  r.schedule.chunks = policy.chunks;
  r.schedule.micro_batches = micro_batches;
  r.schedule.placement = policy.placement;
  r.schedule.devices = s.orders();
  return r;
}

}  // namespace pt
