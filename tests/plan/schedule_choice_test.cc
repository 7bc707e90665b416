// plan/schedule_choice.h: the one place a pipeline's schedule is chosen from what the user names
// (a kind, auto, a CSV), as `train` and `schedule` both use it.
#include "plan/schedule_choice.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "schedule/generators.h"
#include "schedule/lower.h"

namespace pt {
namespace {

std::string temp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("pt_choice_" + std::to_string(::getpid()) + "_" + name)).string();
}

const auto kNoCosts = [](int) -> Costs {
  ADD_FAILURE() << "only auto prices schedules";
  return {};
};

std::string error_of(const ScheduleSpec& s) {
  try {
    choose_schedule(s, kNoCosts);
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ScheduleChoice, AKindInAnyCaseIsGeneratedAndLowered) {
  const ScheduleChoice c = choose_schedule({"ZB-V", "", 4, 8, 0, 0}, kNoCosts);
  const Schedule want = generate("zb-v", 4, 8, 0);
  EXPECT_EQ(format_csv(c.schedule), format_csv(want));
  EXPECT_EQ(format_csv(c.lowered), format_csv(add_send_recv(want)));
  EXPECT_FALSE(c.costs);
  EXPECT_FALSE(c.lowered_csv);
}

TEST(ScheduleChoice, ACsvIsTheFilesScheduleAndMustMatchWhatIsAskedFor) {
  const std::string path = temp("1f1b.csv"), lowered = temp("lowered.csv");
  const Schedule s = generate("1f1b", 2, 4, 0);
  write_file_atomic(path, format_csv(s), "");
  write_file_atomic(lowered, format_csv(add_send_recv(s)), "");
  EXPECT_EQ(format_csv(choose_schedule({"", path, 2, 4, 0, 0}, kNoCosts).schedule), format_csv(s));
  EXPECT_EQ(format_csv(choose_schedule({"", path, 0, 0, 0, 0}, kNoCosts).schedule), format_csv(s));  // the file's sizes
  EXPECT_EQ(error_of({"", path, 4, 4, 0, 0}),
            "the schedule in '" + path + "': has 2 stages, 1 chunk(s) per stage and 4 micro-batches; set stages, "
            "chunks and micro-batches to match it");
  // A lowered CSV runs its sends as written; its compute actions are the schedule.
  const ScheduleChoice c = choose_schedule({"", lowered, 2, 4, 0, 0}, kNoCosts);
  EXPECT_TRUE(c.lowered_csv);
  EXPECT_EQ(format_csv(c.schedule), format_csv(s));
  EXPECT_EQ(format_csv(c.lowered), format_csv(add_send_recv(s)));
  std::filesystem::remove(path);
  std::filesystem::remove(lowered);
}

// auto prices 1 and 2 chunks per device; a model that cannot be cut twice per device is run at
// one, and one that cannot be cut once is the partition's own error.
TEST(ScheduleChoice, AutoTriesOneAndTwoChunksAndTakesWhatCanBeCut) {
  std::vector<int> asked;
  const ScheduleChoice c = choose_schedule({"auto", "", 4, 8, 0, 0}, [&](int v) {
    asked.push_back(v);
    if (v == 2) throw UserError("partition", "too few nodes for 8 chunks", "");
    return unit_costs(4, v);
  });
  EXPECT_EQ(asked, (std::vector<int>{1, 2}));
  ASSERT_TRUE(c.costs);
  EXPECT_EQ(c.costs->chunks.size(), 4u);
  EXPECT_EQ(c.schedule.total_chunks(), 4);
  EXPECT_EQ(c.note.rfind("auto: ", 0), 0u);
  try {
    choose_schedule({"auto", "", 4, 8, 0, 0}, [&](int v) -> Costs { throw UserError("partition", "no cut", ""); });
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "partition: no cut");
  }
}

}  // namespace
}  // namespace pt
