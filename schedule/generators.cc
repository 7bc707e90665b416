#include "schedule/generators.h"

#include <algorithm>
#include <deque>

#include "core/error.h"
#include "schedule/costs.h"
#include "schedule/list_scheduler.h"

namespace pt {

const std::vector<KindInfo>& schedule_kinds() {
  static const std::vector<KindInfo> kinds = {
      {"gpipe", 1, 1, 1, Placement::kLoop, false, "all forwards, then all backwards"},
      {"1f1b", 1, 1, 1, Placement::kLoop, false, "one forward one backward after a warm-up"},
      {"interleaved", 2, 64, 2, Placement::kLoop, false, "Megatron's interleaved 1F1B"},
      {"zb-h1", 1, 1, 1, Placement::kLoop, true, "zero bubble, 1F1B's memory"},
      {"zb-h2", 1, 1, 1, Placement::kLoop, true, "zero bubble, about twice 1F1B's memory"},
      {"zb-v", 2, 2, 2, Placement::kV, true, "zero bubble V, 1F1B's memory"},
      {"v-zb", 2, 2, 2, Placement::kV, true, "V-shape, zero bubble at 1F1B's memory"},
      {"v-half", 2, 2, 2, Placement::kV, true, "V-shape, half of 1F1B's memory"},
      {"v-min", 2, 2, 2, Placement::kV, true, "V-shape, a third of 1F1B's memory"},
      {"dualpipev", 2, 2, 2, Placement::kV, true, "DualPipeV: V-shape, forward and backward of two micro-batches paired"},
  };
  return kinds;
}

const KindInfo& find_kind(const std::string& name) {
  std::string known;
  for (const KindInfo& k : schedule_kinds()) {
    if (k.name == name) return k;
    known += k.name + ", ";
  }
  throw UserError("--kind " + name, "unknown schedule kind", "use one of " + known + "auto");
}

namespace {

using Lists = std::vector<std::vector<Action>>;

// GPipe: device d runs F of every micro-batch, then their fused backwards in the same order.
Lists gpipe(int P, int M) {
  Lists out(static_cast<size_t>(P));
  for (int d = 0; d < P; ++d) {
    for (int m = 0; m < M; ++m) out[static_cast<size_t>(d)].push_back({Op::kF, d, m});
    for (int m = 0; m < M; ++m) out[static_cast<size_t>(d)].push_back({Op::kBW, d, m});
  }
  return out;
}

// Interleaves a device's forward and backward sequences: `warmup` forwards, then one forward
// and one backward in turn, then the remaining backwards (1F1B's shape, with or without chunks).
std::vector<Action> one_f_one_b(const std::vector<Action>& fwd, const std::vector<Action>& bwd,
                                size_t warmup) {
  warmup = std::min(warmup, fwd.size());
  std::vector<Action> out(fwd.begin(), fwd.begin() + static_cast<long>(warmup));
  size_t f = warmup, b = 0;
  while (f < fwd.size()) {
    out.push_back(fwd[f++]);
    out.push_back(bwd[b++]);
  }
  while (b < bwd.size()) out.push_back(bwd[b++]);
  return out;
}

// 1F1B: device d warms up with P-1-d forwards, enough to keep the pipe full.
Lists one_f_one_b(int P, int M) {
  Lists out;
  for (int d = 0; d < P; ++d) {
    std::vector<Action> fwd, bwd;
    for (int m = 0; m < M; ++m) {
      fwd.push_back({Op::kF, d, m});
      bwd.push_back({Op::kBW, d, m});
    }
    out.push_back(one_f_one_b(fwd, bwd, static_cast<size_t>(P - 1 - d)));
  }
  return out;
}

// Megatron's interleaved 1F1B: chunk k*P + d on device d. Micro-batches go in groups of P; in a
// group the device runs its chunks in turn (forward: chunk 0 first; backward: last chunk first).
// Warm-up: 2(P-1-d) + (V-1)P forwards. Megatron needs M to be a multiple of P; for any other M
// the order is built for M rounded up to one and the phantom micro-batches are dropped: that
// only removes actions, so no wait is added and the order stays deadlock-free.
Lists interleaved(int P, int M, int V) {
  const int padded = (M + P - 1) / P * P;
  Lists out;
  for (int d = 0; d < P; ++d) {
    std::vector<Action> fwd, bwd;
    for (int g = 0; g < padded; g += P)
      for (int k = 0; k < V; ++k)
        for (int m = g; m < g + P; ++m) {
          fwd.push_back({Op::kF, k * P + d, m});
          bwd.push_back({Op::kBW, (V - 1 - k) * P + d, m});
        }
    std::vector<Action> order =
        one_f_one_b(fwd, bwd, static_cast<size_t>(2 * (P - 1 - d) + (V - 1) * P));
    std::erase_if(order, [&](const Action& a) { return a.micro_batch >= M; });
    out.push_back(std::move(order));
  }
  return out;
}

// DualPipeV (DeepSeek's DualPipe cut in half, after Sea AI Lab): V placement, device r holding
// chunk r (phase 0, the way down) and chunk 2P-1-r (phase 1, the way up). Each phase takes its
// forwards and its backwards in micro-batch order. Device r runs eight steps:
//   1. 2(P-1-r) phase-0 forwards           5. P-1-r times: B1, then the pair F1 & B0
//   2. r+1 times: F0, F1                   6. r+1 times: B1, B0; from the middle of the step on
//   3. P-1-r times: B1 (split), W, F1         (rank parity decides which of the two first) the
//   4. M-2P+r+1 times: the pairs F0 & B1,      backwards are split, their W's left pending
//      then F1 & B0                        7. P-1-r times: W, then B0 (split)
//                                          8. r+1 W's
// A backward not split runs B and W fused; a pending W runs in the order its B ran. DualPipeV
// overlaps a pair's forward and backward with each other's communication; here a pair runs back
// to back, forward first, and the simulator already keeps transfers off the devices' time.
// DualPipeV needs M >= 2P; for fewer the order is built for 2P and the phantom micro-batches are
// dropped, which only removes actions (as for interleaved).
Lists dualpipev(int P, int M) {
  const int padded = std::max(M, 2 * P);
  Lists out;
  for (int r = 0; r < P; ++r) {
    std::vector<Action> a;
    const int chunk[2] = {r, 2 * P - 1 - r};
    int fwd[2] = {0, 0}, bwd[2] = {0, 0};
    std::deque<Action> pending;
    auto F = [&](int phase) { a.push_back({Op::kF, chunk[phase], fwd[phase]++}); };
    auto B = [&](int phase, bool split) {
      const Action b{split ? Op::kB : Op::kBW, chunk[phase], bwd[phase]++};
      a.push_back(b);
      if (split) pending.push_back({Op::kW, b.chunk, b.micro_batch});
    };
    auto W = [&] {
      a.push_back(pending.front());
      pending.pop_front();
    };
    for (int i = 0; i < 2 * (P - 1 - r); ++i) F(0);
    for (int i = 0; i < r + 1; ++i) F(0), F(1);
    for (int i = 0; i < P - 1 - r; ++i) B(1, true), W(), F(1);
    for (int i = 0; i < padded - 2 * P + r + 1; ++i) F(0), B(1, false), F(1), B(0, false);
    for (int i = 0; i < P - 1 - r; ++i) B(1, false), F(1), B(0, false);
    bool split = false;
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) split = true;
      B(1, split);
      if (i == (r + 1) / 2 && r % 2 == 0) split = true;
      B(0, split);
    }
    for (int i = 0; i < P - 1 - r; ++i) W(), B(0, true);
    for (int i = 0; i < r + 1; ++i) W();
    PT_CHECK(pending.empty() && fwd[0] == padded && fwd[1] == padded && bwd[0] == padded && bwd[1] == padded,
             "dualpipev: a device's steps do not cover every micro-batch");
    std::erase_if(a, [&](const Action& x) { return x.micro_batch >= M; });
    out.push_back(std::move(a));
  }
  return out;
}

// The zero-bubble kinds: list scheduling with unit costs under each schedule's memory.
// cap[d] is in micro-batches of a whole stage.
ListPolicy split_policy(const KindInfo& k, std::vector<double> cap) {
  ListPolicy policy;
  policy.chunks = k.default_chunks;
  policy.placement = k.placement;
  policy.split = true;
  policy.cap = std::move(cap);
  return policy;
}
Lists listed(const KindInfo& k, int P, int M, std::vector<double> cap) {
  const ListPolicy policy = split_policy(k, std::move(cap));
  return list_schedule(k.name, P, M, unit_costs(P, k.default_chunks), policy).schedule.devices;
}

template <typename F>
std::vector<double> per_device(int P, F f) {
  std::vector<double> out;
  for (int d = 0; d < P; ++d) out.push_back(f(d));
  return out;
}

// V-ZB: zb-v's cap of P micro-batches (1F1B's peak), with each pending W counted as still
// keeping `share` of its chunk's activation (what B leaves for W, --w-keep). The cap then bounds
// the W's left pending by what they keep, not by their number: an F is admitted only when the
// W's pending leave room for it, and when they do not, the device runs W's (rule 4 of
// list_scheduler.h). So with --w-keep <= share the peak stays at P.
// share is the largest of 1/2, 3/8, 1/4 whose order, with unit costs, is as short as zb-v's
// (share 0) in both the makespan and the longest device span, else 0 (zb-v's order): with unit
// costs v-zb never pays bubble for the memory it bounds. For P = 3..16 and M >= 2P, 1/2 mostly
// holds, else 3/8 or 1/4 (P=8, M=32: 3/8); 3/4 and 1 (all of F's activation kept until W) never
// do (share 1 leaves 8.6% at P=8, M=16); at P = 2 no share above 0 does (v-zb is zb-v's order).
// With uneven costs the fixed order does pay: the gpt sample at P=4, M=16 idles 15.6% of the
// span, zb-v 9.2%.
Lists v_zb(const KindInfo& k, int P, int M) {
  const ListPolicy policy = split_policy(k, per_device(P, [&](int) { return double(P); }));
  const Costs plain = unit_costs(P, k.default_chunks);
  ListResult best = list_schedule(k.name, P, M, plain, policy);  // share 0: zb-v's order
  for (double share : {0.5, 0.375, 0.25}) {
    Costs kept = plain;
    for (ChunkCost& c : kept.chunks) c.w_keep = share * c.activation;
    ListResult r = list_schedule(k.name, P, M, kept, policy);  // times as with `plain`
    if (r.makespan <= best.makespan + 1e-9 && r.span <= best.span + 1e-9) return r.schedule.devices;
  }
  return best.schedule.devices;
}

// Caps are in micro-batches (a whole stage's activation); W's run in idle time (the
// zero-bubble authors' rule) or, for v-zb, when what they keep blocks a forward. Numbers are
// each paper's memory.
Lists split_kind(const KindInfo& k, int P, int M) {
  const double p = P;
  auto all = [&](double x) { return per_device(P, [&](int) { return x; }); };
  if (k.name == "zb-h1")  // 1F1B's in-flight count P-d
    return listed(k, P, M, per_device(P, [&](int d) { return p - d; }));
  if (k.name == "zb-h2")  // 2(P-d)-1 in flight: the warm-up is full, so is the steady state
    return listed(k, P, M, per_device(P, [&](int d) { return 2 * (p - d) - 1; }));
  if (k.name == "zb-v") return listed(k, P, M, all(p));
  if (k.name == "v-zb") return v_zb(k, P, M);
  if (k.name == "v-half") return listed(k, P, M, all(static_cast<double>((P + 2) / 2)));
  PT_CHECK(k.name == "v-min");
  // At a third of the memory the order of forwards matters: keep the faster of the two.
  const std::vector<double> cap = all(static_cast<double>((P + 4) / 3));
  ListResult best;
  for (ForwardOrder order : {ForwardOrder::kOldest, ForwardOrder::kEntryFirst}) {
    ListPolicy policy{k.default_chunks, k.placement, true, cap, {}, false, order};
    ListResult r = list_schedule(k.name, P, M, unit_costs(P, k.default_chunks), policy);
    if (best.schedule.devices.empty() || r.makespan < best.makespan) best = std::move(r);
  }
  return best.schedule.devices;
}

}  // namespace

Schedule generate(const std::string& kind, int stages, int micro_batches, int chunks) {
  const KindInfo& k = find_kind(kind);
  if (chunks == 0) chunks = k.default_chunks;
  if (chunks < k.min_chunks || chunks > k.max_chunks)
    throw UserError("--kind " + kind, "takes " +
                                          (k.min_chunks == k.max_chunks
                                               ? std::to_string(k.min_chunks)
                                               : std::to_string(k.min_chunks) + " or more") +
                                          " chunks per device, not " + std::to_string(chunks),
                    "change --chunks");
  if (stages < 1 || micro_batches < 1)
    throw UserError("--kind " + kind, "needs at least one stage and one micro-batch", "");
  Schedule s;
  s.kind = kind;
  s.stages = stages;
  s.chunks = chunks;
  s.micro_batches = micro_batches;
  s.placement = k.placement;
  if (kind == "gpipe") s.devices = gpipe(stages, micro_batches);
  else if (kind == "1f1b") s.devices = one_f_one_b(stages, micro_batches);
  else if (kind == "interleaved") s.devices = interleaved(stages, micro_batches, chunks);
  else if (kind == "dualpipev") s.devices = dualpipev(stages, micro_batches);
  else s.devices = split_kind(k, stages, micro_batches);
  return s;
}

}  // namespace pt
