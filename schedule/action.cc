#include "schedule/action.h"

#include <array>
#include <charconv>

namespace pt {
namespace {

struct OpName {
  Op op;
  std::string_view text;
};

constexpr std::array<OpName, 8> kOpNames = {{{Op::kF, "F"},
                                             {Op::kB, "B"},
                                             {Op::kW, "W"},
                                             {Op::kBW, "BW"},
                                             {Op::kSendF, "SF"},
                                             {Op::kRecvF, "RF"},
                                             {Op::kSendB, "SB"},
                                             {Op::kRecvB, "RB"}}};

std::string_view op_text(Op op) {
  for (const OpName& n : kOpNames)
    if (n.op == op) return n.text;
  return "STEP";
}

// Reads a non-negative decimal number from the front of `s`; nullopt if there is none.
std::optional<int> take_number(std::string_view& s) {
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end == s.data() || value < 0) return std::nullopt;
  s.remove_prefix(static_cast<size_t>(end - s.data()));
  return value;
}

}  // namespace

std::string format_action(const Action& a) {
  if (a.op == Op::kStep) return "STEP";
  return std::to_string(a.chunk) + std::string(op_text(a.op)) + std::to_string(a.micro_batch);
}

std::optional<Action> parse_action(std::string_view text) {
  if (text == "STEP") return Action{Op::kStep, 0, 0};
  if (text.empty() || text[0] == '-' || text[0] == '+') return std::nullopt;
  std::optional<int> chunk = take_number(text);
  if (!chunk) return std::nullopt;
  size_t letters = 0;
  while (letters < text.size() && text[letters] >= 'A' && text[letters] <= 'Z') ++letters;
  const std::string_view name = text.substr(0, letters);
  text.remove_prefix(letters);
  if (text.empty() || text[0] == '-' || text[0] == '+') return std::nullopt;
  std::optional<int> micro_batch = take_number(text);
  if (!micro_batch || !text.empty()) return std::nullopt;
  for (const OpName& n : kOpNames)
    if (n.text == name) return Action{n.op, *chunk, *micro_batch};
  return std::nullopt;
}

}  // namespace pt
