// Golden CSVs: a few generated schedules pinned as files users can read, diff and hand-edit.
// PT_UPDATE_GOLDENS=1 rewrites them (then read the diff before committing).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"

namespace pt {
namespace {

struct Golden {
  const char* file;
  const char* kind;
  int p, m, v;
  bool lowered;
};

const Golden kGoldens[] = {
    {"1f1b_p4_m8.csv", "1f1b", 4, 8, 1, false},
    {"interleaved_p4_m8_v2.csv", "interleaved", 4, 8, 2, false},
    {"zb-h1_p4_m8.csv", "zb-h1", 4, 8, 1, false},
    {"zb-v_p4_m8.csv", "zb-v", 4, 8, 2, false},
    {"v-min_p4_m8.csv", "v-min", 4, 8, 2, false},
    {"dualpipev_p4_m8.csv", "dualpipev", 4, 8, 2, false},
    {"1f1b_p2_m3_lowered.csv", "1f1b", 2, 3, 1, true},
};

TEST(Golden, GeneratedSchedulesMatchTheFiles) {
  const bool update = std::getenv("PT_UPDATE_GOLDENS") != nullptr;
  for (const Golden& g : kGoldens) {
    const Schedule s = generate(g.kind, g.p, g.m, g.v);
    const std::string text = format_csv(g.lowered ? add_send_recv(s) : s);
    const std::string path = std::string("tests/schedule/golden/") + g.file;
    if (update) std::ofstream(path) << text;
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    std::stringstream golden;
    golden << in.rdbuf();
    EXPECT_EQ(text, golden.str()) << path;
    // The file, read back, simulates to the same numbers as the generator's schedule.
    const Schedule back = parse_csv(golden.str(), path);
    EXPECT_DOUBLE_EQ(simulate(back, unit_costs(g.p, g.v), path).makespan,
                     simulate(s, unit_costs(g.p, g.v), g.kind).makespan);
  }
}

TEST(Golden, The1f1bFileIsTheTextbookOrder) {
  // Device 3 (the last) alternates from the start; device 0 warms up with 3 forwards.
  std::ifstream in("tests/schedule/golden/1f1b_p4_m8.csv");
  std::string line, rows[4];
  int r = 0;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') rows[r++] = line;
  EXPECT_EQ(rows[0].substr(0, 35), "0F0,0F1,0F2,0F3,0BW0,0F4,0BW1,0F5,0");
  EXPECT_EQ(rows[3].substr(0, 24), "3F0,3BW0,3F1,3BW1,3F2,3B");
}

}  // namespace
}  // namespace pt
