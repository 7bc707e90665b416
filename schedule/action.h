// schedule/action.h: one step of one device in a pipeline schedule, and its short text form.
//
// In: nothing (plain data). Out: Action values that Schedule lists per device.
// Text form (chunk, op, micro-batch):  2F13  chunk 2 forward of micro-batch 13
//   0B3 input-gradient backward   0W3 weight-gradient backward   0BW3 both, fused
//   1SF4 / 1RF4  send / receive the activations chunk 1 makes for (SF) or takes from (RF) its
//               neighbour for micro-batch 4;  1SB4 / 1RB4  the same for gradients
//   STEP        the optimizer step
// The peer of a send or receive follows from the schedule's placement (schedule.h), so the text
// carries none: SF of chunk c goes to chunk c+1's device, RF of chunk c comes from chunk c-1's,
// SB of chunk c goes to chunk c-1's, RB of chunk c comes from chunk c+1's.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pt {

enum class Op : unsigned char { kF, kB, kW, kBW, kSendF, kRecvF, kSendB, kRecvB, kStep };

struct Action {
  Op op = Op::kF;
  int chunk = 0;
  int micro_batch = 0;

  bool operator==(const Action&) const = default;
};

inline bool is_compute(Op op) { return op == Op::kF || op == Op::kB || op == Op::kW || op == Op::kBW; }
inline bool is_comm(Op op) {
  return op == Op::kSendF || op == Op::kRecvF || op == Op::kSendB || op == Op::kRecvB;
}

std::string format_action(const Action& a);
// nullopt when `text` is not of the form above (surrounding blanks are not allowed here).
std::optional<Action> parse_action(std::string_view text);

}  // namespace pt
