#include "schedule/lower.h"

#include "core/error.h"

namespace pt {

Schedule add_send_recv(const Schedule& in) {
  PT_CHECK(!in.lowered(), "schedule is lowered already");
  Schedule out = in;
  const int C = in.total_chunks();
  auto cross = [&](int c1, int c2) {
    return c2 >= 0 && c2 < C && in.device_of(c1) != in.device_of(c2);
  };
  for (size_t d = 0; d < in.devices.size(); ++d) {
    std::vector<Action>& list = out.devices[d];
    list.clear();
    for (const Action& a : in.devices[d]) {
      if (a.op == Op::kStep) continue;
      const int c = a.chunk, m = a.micro_batch;
      const bool backward = a.op == Op::kB || a.op == Op::kBW;
      if (a.op == Op::kF && cross(c, c - 1)) list.push_back({Op::kRecvF, c, m});
      if (backward && cross(c, c + 1)) list.push_back({Op::kRecvB, c, m});
      list.push_back(a);
      if (a.op == Op::kF && cross(c, c + 1)) list.push_back({Op::kSendF, c, m});
      if (backward && cross(c, c - 1)) list.push_back({Op::kSendB, c, m});
    }
    list.push_back({Op::kStep, 0, 0});
  }
  return out;
}

}  // namespace pt
