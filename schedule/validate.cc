#include "schedule/validate.h"

#include <algorithm>

#include "schedule/render.h"
#include "schedule/walk.h"

namespace pt {
namespace {

constexpr int kNone = -1;

// Where each action of each (chunk, micro-batch) sits: its step on the chunk's device.
struct Positions {
  int C = 0, M = 0;
  std::vector<int> f, b, w, bw, send_f, recv_f, send_b, recv_b;

  Positions(int chunks, int micro_batches) : C(chunks), M(micro_batches) {
    for (auto* v : {&f, &b, &w, &bw, &send_f, &recv_f, &send_b, &recv_b})
      v->assign(static_cast<size_t>(C) * M, kNone);
  }
  std::vector<int>& of(Op op) {
    switch (op) {
      case Op::kF: return f;
      case Op::kB: return b;
      case Op::kW: return w;
      case Op::kBW: return bw;
      case Op::kSendF: return send_f;
      case Op::kRecvF: return recv_f;
      case Op::kSendB: return send_b;
      default: return recv_b;
    }
  }
  size_t at(int c, int m) const { return static_cast<size_t>(c) * M + m; }
};

class Validator {
 public:
  Validator(const Schedule& s, const std::string& where)
      : s_(s), where_(where), C(s.total_chunks()), M(s.micro_batches), pos_(C, M) {}

  void run() {
    if (static_cast<int>(s_.devices.size()) != s_.stages || s_.stages < 1 || s_.chunks < 1 ||
        M < 1)
      throw UserError(where_, "has " + std::to_string(s_.devices.size()) + " device rows for " +
                                  std::to_string(s_.stages) + " stages",
                      "write one row per device");
    for (int d = 0; d < s_.stages; ++d) place_actions(d);
    for (int c = 0; c < C; ++c)
      for (int m = 0; m < M; ++m) check_complete(c, m), check_order(c, m);
    if (s_.lowered())
      for (int c = 0; c + 1 < C; ++c)
        if (s_.device_of(c) != s_.device_of(c + 1))
          for (int m = 0; m < M; ++m) check_transfers(c, m);
    check_steps();
    check_runs();
  }

 private:
  [[noreturn]] void fail(std::vector<GridMark> marks, const std::string& what) const {
    throw ScheduleError(where_, what, step_grid(s_, marks));
  }
  std::string cell(int d, int step) const {
    return "device " + std::to_string(d) + " step " + std::to_string(step) + " (" +
           format_action(s_.devices[static_cast<size_t>(d)][static_cast<size_t>(step)]) + ")";
  }
  static std::string name(Op op, int c, int m) { return format_action({op, c, m}); }

  // Range, device and uniqueness of every action.
  void place_actions(int d) {
    const auto& list = s_.devices[static_cast<size_t>(d)];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[static_cast<size_t>(i)];
      if (a.op == Op::kStep) continue;
      const int c = a.chunk;
      if (c >= C || a.micro_batch >= M)
        fail({{d, i}}, cell(d, i) + ": chunk or micro-batch out of range (the schedule has " +
                           std::to_string(C) + " chunks and " + std::to_string(M) +
                           " micro-batches)");
      if (s_.device_of(c) != d)
        fail({{d, i}}, cell(d, i) + ": chunk " + std::to_string(c) + " is on device " +
                           std::to_string(s_.device_of(c)) + ", not " + std::to_string(d));
      check_peer(d, i, a);
      int& slot = pos_.of(a.op)[pos_.at(c, a.micro_batch)];
      if (slot != kNone)
        fail({{d, slot}, {d, i}}, cell(d, i) + " repeats step " + std::to_string(slot));
      slot = i;
    }
  }

  void check_peer(int d, int i, const Action& a) const {
    if (!is_comm(a.op)) return;
    const int peer = (a.op == Op::kSendF || a.op == Op::kRecvB) ? a.chunk + 1 : a.chunk - 1;
    if (peer < 0 || peer >= C || s_.device_of(peer) == d)
      fail({{d, i}}, cell(d, i) + ": chunk " + std::to_string(a.chunk) +
                         " has no neighbour on another device on that side");
  }

  void check_complete(int c, int m) const {
    const int d = s_.device_of(c);
    const size_t k = pos_.at(c, m);
    const int end = static_cast<int>(s_.devices[static_cast<size_t>(d)].size());
    if (pos_.f[k] == kNone)
      fail({{d, end}}, "device " + std::to_string(d) + " has no " + name(Op::kF, c, m));
    if (pos_.bw[k] != kNone && (pos_.b[k] != kNone || pos_.w[k] != kNone))
      fail({{d, pos_.bw[k]}}, cell(d, pos_.bw[k]) + " is fused, but B or W of micro-batch " +
                                  std::to_string(m) + " also appears");
    if (pos_.bw[k] == kNone && pos_.b[k] == kNone)
      fail({{d, pos_.f[k]}}, cell(d, pos_.f[k]) + " has no " + name(Op::kB, c, m) + " (or " +
                                 name(Op::kBW, c, m) + ")");
    if (pos_.b[k] != kNone && pos_.w[k] == kNone)
      fail({{d, pos_.b[k]}}, cell(d, pos_.b[k]) + " has no " + name(Op::kW, c, m));
    if (pos_.w[k] != kNone && pos_.b[k] == kNone)
      fail({{d, pos_.w[k]}}, cell(d, pos_.w[k]) + " has no " + name(Op::kB, c, m));
  }

  // `later` must come after `earlier` on device d.
  void after(int d, int earlier, int later, const std::string& rule) const {
    if (earlier != kNone && later != kNone && later < earlier)
      fail({{d, later}, {d, earlier}}, cell(d, later) + " comes before " + rule);
  }

  void check_order(int c, int m) const {
    const int d = s_.device_of(c);
    const size_t k = pos_.at(c, m);
    const int back = pos_.bw[k] != kNone ? pos_.bw[k] : pos_.b[k];
    after(d, pos_.f[k], back, "its F (" + name(Op::kF, c, m) + ")");
    after(d, pos_.b[k], pos_.w[k], "its B (" + name(Op::kB, c, m) + ")");
    if (c + 1 < C && s_.device_of(c + 1) == d) {
      const size_t n = pos_.at(c + 1, m);
      after(d, pos_.f[k], pos_.f[n], "F of the chunk before it (" + name(Op::kF, c, m) + ")");
      const int next_back = pos_.bw[n] != kNone ? pos_.bw[n] : pos_.b[n];
      after(d, next_back, back, "B of the chunk after it (chunk " + std::to_string(c + 1) + ")");
    }
  }

  // Chunk c and c+1 on different devices: activations go down, gradients come back.
  void check_transfers(int c, int m) const {
    const int d0 = s_.device_of(c), d1 = s_.device_of(c + 1);
    const size_t k0 = pos_.at(c, m), k1 = pos_.at(c + 1, m);
    const int back0 = pos_.bw[k0] != kNone ? pos_.bw[k0] : pos_.b[k0];
    const int back1 = pos_.bw[k1] != kNone ? pos_.bw[k1] : pos_.b[k1];
    need(d0, pos_.send_f[k0], pos_.f[k0], name(Op::kSendF, c, m));
    need(d1, pos_.recv_f[k1], pos_.f[k1], name(Op::kRecvF, c + 1, m));
    need(d1, pos_.send_b[k1], back1, name(Op::kSendB, c + 1, m));
    need(d0, pos_.recv_b[k0], back0, name(Op::kRecvB, c, m));
    after(d0, pos_.f[k0], pos_.send_f[k0], "the F whose output it sends");
    after(d1, pos_.recv_f[k1], pos_.f[k1], "the receive of its input (" + name(Op::kRecvF, c + 1, m) + ")");
    after(d1, back1, pos_.send_b[k1], "the B whose gradient it sends");
    after(d0, pos_.recv_b[k0], back0, "the receive of its gradient (" + name(Op::kRecvB, c, m) + ")");
  }

  void need(int d, int slot, int user, const std::string& what) const {
    if (slot == kNone)
      fail({{d, user}}, cell(d, user) + ": the schedule has sends and receives but no " + what +
                            " on device " + std::to_string(d));
  }

  void check_steps() const {
    int with = 0;
    for (const auto& list : s_.devices)
      with += std::any_of(list.begin(), list.end(), [](const Action& a) { return a.op == Op::kStep; });
    if (with == 0) return;
    for (int d = 0; d < s_.stages; ++d) {
      const auto& list = s_.devices[static_cast<size_t>(d)];
      for (int i = 0; i < static_cast<int>(list.size()); ++i)
        if (list[static_cast<size_t>(i)].op == Op::kStep && i + 1 != static_cast<int>(list.size()))
          fail({{d, i}}, cell(d, i) + ": STEP must be the last action of its device");
      if (list.empty() || list.back().op != Op::kStep)
        fail({{d, static_cast<int>(list.size())}},
             "device " + std::to_string(d) + " has no STEP at its end, while other devices do");
    }
  }

  void check_runs() const {
    const Walk w = walk_schedule(s_, unit_costs(s_.stages, s_.chunks));
    if (w.complete()) return;
    std::vector<GridMark> marks;
    std::string what = "deadlock:";
    constexpr size_t kNamed = 3;  // the line names this many waiting devices, then counts
    for (int d = 0; d < s_.stages; ++d) {
      const int step = w.stuck[static_cast<size_t>(d)];
      if (step < 0) continue;
      marks.push_back({d, step});
      if (marks.size() <= kNamed)
        what += (marks.size() > 1 ? ";" : "") + std::string(" ") + cell(d, step) +
                " waits for " + w.waits_for[static_cast<size_t>(d)];
    }
    if (marks.size() > kNamed)
      what += "; " + std::to_string(marks.size() - kNamed) + " more devices wait";
    fail(marks, what);
  }

  const Schedule& s_;
  const std::string where_;
  const int C, M;
  Positions pos_;
};

}  // namespace

void validate(const Schedule& s, const std::string& where) { Validator(s, where).run(); }

}  // namespace pt
