// The validator: accepts every generator's output (compute-only and lowered) over stages 1..8,
// micro-batches 1..32 and the chunk counts each kind allows; rejects hand-written bad
// schedules with a one-line message and the device x step grid marking the failing step.
#include <gtest/gtest.h>

#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/validate.h"

namespace pt {
namespace {

TEST(Validate, AcceptsEveryGeneratorAndItsLowering) {
  int checked = 0;
  for (const KindInfo& k : schedule_kinds())
    for (int v = k.min_chunks; v <= std::min(k.max_chunks, 4); ++v)
      for (int p = 1; p <= 8; ++p)
        for (int m = 1; m <= 32; ++m) {
          const std::string where = k.name + " v=" + std::to_string(v) + " p=" +
                                    std::to_string(p) + " m=" + std::to_string(m);
          const Schedule s = generate(k.name, p, m, v);
          ASSERT_NO_THROW(validate(s, where)) << where;
          ASSERT_NO_THROW(validate(add_send_recv(s), where + " lowered")) << where;
          ++checked;
        }
  EXPECT_EQ(checked, (9 + 3) * 8 * 32);  // 9 one-value kinds + interleaved at v = 2, 3, 4
}

struct Failure {
  std::string message, grid;
};

Failure check(const std::string& csv) {
  try {
    validate(parse_csv(csv, "bad.csv"), "bad.csv");
  } catch (const ScheduleError& e) {
    return {e.what(), e.grid()};
  }
  return {"accepted", ""};
}

constexpr const char* kFix = "; the device x step grid marks where";

// The one-line message, and the grid with exactly these cells bracketed.
void expect_rejected(const std::string& csv, const std::string& message,
                     const std::vector<std::string>& marked) {
  const Failure f = check(csv);
  EXPECT_EQ(f.message, "bad.csv: " + message + kFix);
  size_t brackets = 0;
  for (size_t i = f.grid.find('['); i != std::string::npos; i = f.grid.find('[', i + 1)) ++brackets;
  EXPECT_EQ(brackets, marked.size()) << f.grid;
  for (const std::string& cell : marked)
    EXPECT_NE(f.grid.find("[" + cell + "]"), std::string::npos) << cell << "\n" << f.grid;
}

TEST(Validate, RejectsAMissingW) {
  expect_rejected("# stages: 2\n0F0,0F1,0B0,0W0,0B1\n1F0,1B0,1W0,1F1,1B1,1W1\n",
                  "device 0 step 4 (0B1) has no 0W1", {"0B1"});
  EXPECT_NE(check("0F0,0B0\n").grid.find("-> device 0"), std::string::npos);
}

TEST(Validate, RejectsAReceiveBeforeItsSendCanHappen) {
  // Device 1 waits for 0's activations before sending the gradient device 0 needs first.
  expect_rejected("0F0,0SF0,0RB0,0BW0,0F1,0SF1,0RB1,0BW1\n"
                  "1RF1,1F1,1BW1,1SB1,1RF0,1F0,1BW0,1SB0\n",
                  "deadlock: device 0 step 2 (0RB0) waits for 1SB0 on device 1; device 1 step "
                  "0 (1RF1) waits for 0SF1 on device 0",
                  {"0RB0", "1RF1"});
}

TEST(Validate, RejectsACrossDeviceDeadlockInACompiledSchedule) {
  // Device 0 runs micro-batch 0's backward first, device 1 micro-batch 1's forward first:
  // each waits for the other.
  expect_rejected("0F0,0BW0,0F1,0BW1\n1F1,1BW1,1F0,1BW0\n",
                  "deadlock: device 0 step 1 (0BW0) waits for 1B0 on device 1; device 1 step 0 "
                  "(1F1) waits for 0F1 on device 0",
                  {"0BW0", "1F1"});
}

TEST(Validate, RejectsOrderAndPlacementErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"0B0,0F0,0W0\n", "device 0 step 0 (0B0) comes before its F (0F0)"},
      {"0F0,0BW0\n0F0,1BW0\n", "device 1 step 0 (0F0): chunk 0 is on device 0, not 1"},
      {"0F0,0BW0,0F0\n", "device 0 step 2 (0F0) repeats step 0"},
      {"# micro_batches: 2\n0F0,0BW0\n", "device 0 has no 0F1"},
      {"0F0,0B0,0W0,0BW0\n",
       "device 0 step 3 (0BW0) is fused, but B or W of micro-batch 0 also appears"},
      {"0F0,0BW0,STEP\n1F0,1BW0\n",
       "device 1 has no STEP at its end, while other devices do"},
      // Lowered (it has sends) but the receive of device 1's input is missing.
      {"0F0,0SF0,0RB0,0BW0\n1F0,1BW0,1SB0\n",
       "device 1 step 0 (1F0): the schedule has sends and receives but no 1RF0 on device 1"},
  };
  for (const auto& [csv, message] : cases)
    EXPECT_EQ(check(csv).message, "bad.csv: " + std::string(message) + kFix) << csv;
}

TEST(Validate, GridMarksTheStepOnLargeSchedules) {
  Schedule s = generate("1f1b", 8, 32);
  auto& row = s.devices[5];
  size_t at = 20;
  while (row[at].op != Op::kBW) ++at;
  row[at].op = Op::kB;  // a B without its W
  try {
    validate(s, "1f1b");
    FAIL() << "accepted";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("device 5 step " + std::to_string(at)), std::string::npos)
        << e.what();
    EXPECT_NE(e.grid().find("-> device 5"), std::string::npos) << e.grid();
    EXPECT_NE(e.grid().find("[" + format_action(row[at]) + "]"), std::string::npos) << e.grid();
    EXPECT_NE(e.grid().find(" " + std::to_string(at) + " "), std::string::npos) << e.grid();
  }
}

}  // namespace
}  // namespace pt
