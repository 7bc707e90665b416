// Action text form and schedule CSV form: round trips and located parse errors.
#include <gtest/gtest.h>

#include "core/error.h"
#include "schedule/action.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/schedule.h"

namespace pt {
namespace {

TEST(Action, TextFormRoundTrips) {
  const Action all[] = {{Op::kF, 2, 13}, {Op::kB, 0, 3},      {Op::kW, 0, 3},
                        {Op::kBW, 0, 3}, {Op::kSendF, 1, 4},  {Op::kRecvF, 1, 4},
                        {Op::kSendB, 1, 4}, {Op::kRecvB, 1, 4}, {Op::kStep, 0, 0}};
  const char* text[] = {"2F13", "0B3", "0W3", "0BW3", "1SF4", "1RF4", "1SB4", "1RB4", "STEP"};
  for (size_t i = 0; i < std::size(all); ++i) {
    EXPECT_EQ(format_action(all[i]), text[i]);
    ASSERT_TRUE(parse_action(text[i])) << text[i];
    EXPECT_EQ(*parse_action(text[i]), all[i]) << text[i];
  }
}

TEST(Action, MalformedTextIsRejected) {
  for (const char* bad : {"", "F3", "0F", "0X3", "0F3x", "-1F3", "0F-3", "0 F3", "step", "0BWW3"})
    EXPECT_FALSE(parse_action(bad)) << bad;
}

TEST(ScheduleCsv, RoundTripsEveryKindCompiledAndLowered) {
  for (const KindInfo& k : schedule_kinds()) {
    const Schedule s = generate(k.name, 4, 6);
    for (const Schedule& x : {s, add_send_recv(s)}) {
      const Schedule back = parse_csv(format_csv(x), "x.csv");
      EXPECT_EQ(back.kind, x.kind);
      EXPECT_EQ(back.stages, x.stages);
      EXPECT_EQ(back.chunks, x.chunks);
      EXPECT_EQ(back.micro_batches, x.micro_batches);
      EXPECT_EQ(back.placement, x.placement);
      EXPECT_EQ(back.devices, x.devices) << k.name;
    }
  }
}

TEST(ScheduleCsv, InfersWhatTheHeaderLeavesOut) {
  const Schedule s = parse_csv("# hand-made\n0F0, 0F1, 0BW0, 0BW1\n\n1F0,1BW0,1F1,1BW1\n", "h.csv");
  EXPECT_EQ(s.kind, "custom");
  EXPECT_EQ(s.stages, 2);
  EXPECT_EQ(s.chunks, 1);
  EXPECT_EQ(s.micro_batches, 2);
  EXPECT_EQ(s.placement, Placement::kLoop);
  EXPECT_EQ(format_action(s.devices[0][2]), "0BW0");
}

TEST(ScheduleCsv, ErrorsNameFileLineAndCell) {
  auto message = [](const std::string& text) {
    try {
      parse_csv(text, "bad.csv");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("# kind: x\n0F0,0F1\n0F0,0Q1\n"),
            "bad.csv:3: cell 2 ('0Q1') is not an action; write actions like 0F3, 1B2, 1W2, "
            "0BW3, 1SF4, 1RB4 or STEP");
  EXPECT_EQ(message("0F0,,0F1\n"), "bad.csv:1: cell 2 ('') is not an action; write actions "
                                   "like 0F3, 1B2, 1W2, 0BW3, 1SF4, 1RB4 or STEP");
  EXPECT_EQ(message("0F0,\n"), "bad.csv:1: the row ends with an empty cell; remove the trailing comma");
  EXPECT_EQ(message("# stages: 3\n0F0\n1F0\n"),
            "bad.csv:1: says 3 stages but the file has 2 device rows; write one row per device");
  EXPECT_EQ(message("# placement: zigzag\n0F0\n"),
            "bad.csv:1: placement 'zigzag' is not known; use loop or v");
  EXPECT_EQ(message("# only comments\n"),
            "bad.csv: holds no device rows; write one row of actions per device");
}

TEST(Placement, VPutsChunkIAndTwoPMinusOneMinusIOnDeviceI) {
  for (int p : {1, 2, 4, 8})
    for (int c = 0; c < 2 * p; ++c)
      EXPECT_EQ(device_of(Placement::kV, p, c), c < p ? c : 2 * p - 1 - c);
  EXPECT_EQ(device_of(Placement::kLoop, 4, 6), 2);
}

}  // namespace
}  // namespace pt
