#include "schedule/walk.h"

#include <algorithm>

#include "core/error.h"

namespace pt {

bool Walk::complete() const {
  return std::all_of(stuck.begin(), stuck.end(), [](int s) { return s < 0; });
}

double duration(const Action& a, const Costs& costs) {
  if (!is_compute(a.op)) return 0;
  const ChunkCost& c = costs.chunks[static_cast<size_t>(a.chunk)];
  switch (a.op) {
    case Op::kF: return c.f;
    case Op::kB: return c.b;
    case Op::kW: return c.w;
    default: return c.b + c.w;  // kBW
  }
}

namespace {

// What has been done, keyed by (kind of result, chunk, micro-batch).
enum Key { kFwd, kBwd, kWgt, kSentF, kSentB, kKeys };

class Walker {
 public:
  Walker(const Schedule& s, const Costs& costs)
      : s_(s), costs_(costs), P(s.stages), C(s.total_chunks()), M(s.micro_batches),
        lowered_(s.lowered()), done_(static_cast<size_t>(kKeys) * C * M, -1.0),
        head_(done_.size(), -1), next_(static_cast<size_t>(P), -1),
        pos_(static_cast<size_t>(P), 0), time_(static_cast<size_t>(P), 0.0),
        missing_(static_cast<size_t>(P)) {
    PT_CHECK(static_cast<int>(costs.chunks.size()) == C);
    w_.start.resize(static_cast<size_t>(P));
    w_.end.resize(static_cast<size_t>(P));
    for (int d = 0; d < P; ++d) {
      w_.start[static_cast<size_t>(d)].assign(s.devices[static_cast<size_t>(d)].size(), -1);
      w_.end[static_cast<size_t>(d)].assign(s.devices[static_cast<size_t>(d)].size(), -1);
    }
  }

  Walk run() {
    std::vector<int> work;
    for (int d = P - 1; d >= 0; --d) work.push_back(d);
    while (!work.empty()) {
      const int d = work.back();
      work.pop_back();
      advance(d, &work);
    }
    w_.stuck.assign(static_cast<size_t>(P), -1);
    w_.waits_for.assign(static_cast<size_t>(P), "");
    for (int d = 0; d < P; ++d)
      if (pos_[static_cast<size_t>(d)] < s_.devices[static_cast<size_t>(d)].size()) {
        w_.stuck[static_cast<size_t>(d)] = static_cast<int>(pos_[static_cast<size_t>(d)]);
        w_.waits_for[static_cast<size_t>(d)] = missing_[static_cast<size_t>(d)];
      }
    return std::move(w_);
  }

 private:
  size_t key(Key k, int c, int m) const { return (static_cast<size_t>(k) * C + c) * M + m; }
  bool cross(int c1, int c2) const { return s_.device_of(c1) != s_.device_of(c2); }
  double comm(int c1, int c2) const {
    return cross(c1, c2) ? costs_.chunks[static_cast<size_t>(std::min(c1, c2))].comm : 0;
  }

  // One input: the result `k` of chunk `c`; `extra` is added to its time. False if not yet done.
  bool need(Key k, int c, int m, double extra, double* ready, size_t* missing) const {
    const double t = done_[key(k, c, m)];
    if (t < 0) {
      *missing = key(k, c, m);
      return false;
    }
    *ready = std::max(*ready, t + extra);
    return true;
  }

  // A neighbour's result: through its RECV in a lowered schedule, else directly plus comm.
  bool need_neighbour(Key k, int c, int here, int m, double* ready, size_t* missing) const {
    if (lowered_ && cross(c, here)) return true;
    return need(k, c, m, comm(c, here), ready, missing);
  }

  bool inputs(const Action& a, double* ready, size_t* missing) const {
    const int c = a.chunk, m = a.micro_batch;
    switch (a.op) {
      case Op::kF: return c == 0 || need_neighbour(kFwd, c - 1, c, m, ready, missing);
      case Op::kB:
      case Op::kBW:
        return need(kFwd, c, m, 0, ready, missing) &&
               (c + 1 == C || need_neighbour(kBwd, c + 1, c, m, ready, missing));
      case Op::kW: return need(kBwd, c, m, 0, ready, missing);
      case Op::kSendF: return need(kFwd, c, m, 0, ready, missing);
      case Op::kSendB: return need(kBwd, c, m, 0, ready, missing);
      case Op::kRecvF: return need(kSentF, c - 1, m, comm(c - 1, c), ready, missing);
      case Op::kRecvB: return need(kSentB, c + 1, m, comm(c + 1, c), ready, missing);
      case Op::kStep: return true;
    }
    return true;
  }

  void produce(Key k, const Action& a, double t, std::vector<int>* work) {
    const size_t i = key(k, a.chunk, a.micro_batch);
    done_[i] = t;
    for (int d = head_[i]; d >= 0; d = next_[static_cast<size_t>(d)]) work->push_back(d);
    head_[i] = -1;
  }

  void advance(int d, std::vector<int>* work) {
    const auto& list = s_.devices[static_cast<size_t>(d)];
    size_t& pos = pos_[static_cast<size_t>(d)];
    double& now = time_[static_cast<size_t>(d)];
    for (; pos < list.size(); ++pos) {
      const Action& a = list[pos];
      double ready = now;
      size_t missing = 0;
      if (!inputs(a, &ready, &missing)) {
        next_[static_cast<size_t>(d)] = head_[missing];
        head_[missing] = d;
        missing_[static_cast<size_t>(d)] = describe(missing);
        return;
      }
      const double end = ready + duration(a, costs_);
      w_.start[static_cast<size_t>(d)][pos] = ready;
      w_.end[static_cast<size_t>(d)][pos] = end;
      now = end;
      if (a.op == Op::kF) produce(kFwd, a, end, work);
      if (a.op == Op::kB || a.op == Op::kBW) produce(kBwd, a, end, work);
      if (a.op == Op::kW || a.op == Op::kBW) produce(kWgt, a, end, work);
      if (a.op == Op::kSendF) produce(kSentF, a, end, work);
      if (a.op == Op::kSendB) produce(kSentB, a, end, work);
    }
  }

  std::string describe(size_t k) const {
    const int m = static_cast<int>(k % M), c = static_cast<int>(k / M % C);
    static const Op kOps[] = {Op::kF, Op::kB, Op::kW, Op::kSendF, Op::kSendB};
    const Action a{kOps[k / (static_cast<size_t>(M) * C)], c, m};
    return format_action(a) + " on device " + std::to_string(s_.device_of(c));
  }

  const Schedule& s_;
  const Costs& costs_;
  const int P, C, M;
  const bool lowered_;
  std::vector<double> done_;
  std::vector<int> head_, next_;  // devices waiting on each key, as linked lists
  std::vector<size_t> pos_;
  std::vector<double> time_;
  std::vector<std::string> missing_;
  Walk w_;
};

}  // namespace

Walk walk_schedule(const Schedule& s, const Costs& costs) { return Walker(s, costs).run(); }

}  // namespace pt
