// `pipetrain schedule` run as a user would: what it prints, writes and returns.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/run_cli.h"

namespace {

// One folder per test process, made once.
fs::path folder() {
  static const fs::path d = scratch("schedule");
  return d;
}

Result pipetrain(const std::string& args) { return run("schedule " + args); }

TEST(ScheduleCli, JsonHasTheDocumentedShapeAndTheClosedForm) {
  const Result r = pipetrain("--kind 1f1b --stages 4 --micro-batches 8 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"kind", "stages", "micro_batches", "chunks", "makespan", "bubble",
                          "bubble_steps_overlapped", "devices"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j.size(), 8u);
  EXPECT_EQ(j["kind"], "1f1b");
  EXPECT_DOUBLE_EQ(j["makespan"].get<double>(), 33.0);
  EXPECT_DOUBLE_EQ(j["bubble"].get<double>(), 3.0 / 11);
  ASSERT_EQ(j["devices"].size(), 4u);
  for (const auto& d : j["devices"]) {
    EXPECT_EQ(d.size(), 6u);
    EXPECT_TRUE(d["peak_bytes"].is_null());  // unit costs carry no bytes
  }
  EXPECT_DOUBLE_EQ(j["devices"][0]["peak_activations"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(j["devices"][3]["peak_activations"].get<double>(), 1.0);
  // Device 3 idles 3 units before its first F and 3 after its last B: none inside its span.
  EXPECT_DOUBLE_EQ(j["devices"][3]["bubble_steps_overlapped"].get<double>(), 0.0);
}

// ZB-V with m >= 2p leaves no idle time inside any device's span (its paper's zero bubble), while
// the first step alone still idles at the edges.
TEST(ScheduleCli, JsonGivesTheBubbleWithStepsOverlapped) {
  const Result r = pipetrain("--kind zb-v --stages 4 --micro-batches 8 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["bubble"].get<double>(), 1.0 / 17);
  EXPECT_DOUBLE_EQ(j["bubble_steps_overlapped"].get<double>(), 0.0);
  for (const auto& d : j["devices"]) EXPECT_DOUBLE_EQ(d["bubble_steps_overlapped"].get<double>(), 0.0);
}

TEST(ScheduleCli, PrintsATimelineBubbleAndPeak) {
  const Result r = pipetrain("--kind zb-v -s 4 -m 8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("device 3   |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("makespan 25.5  bubble 0.0588235"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device 0: busy 24  bubble 0.0588235  peak activations 4"), std::string::npos);
}

TEST(ScheduleCli, CsvWrittenThenReadBackSimulatesTheSame) {
  const fs::path csv = folder() / "zbh1.csv", svg = folder() / "zbh1.svg";
  const Result w = pipetrain("--kind zb-h1 -s 4 -m 8 --csv " + csv.string() + " --svg " +
                             svg.string() + " --json");
  ASSERT_EQ(w.code, 0) << w.err;
  const Result r = pipetrain("--from-csv " + csv.string() + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(w.out), nlohmann::json::parse(r.out));
  const std::string picture = slurp(svg);
  EXPECT_EQ(picture.rfind("<svg", 0), 0u);
  EXPECT_NE(picture.find("<rect"), std::string::npos);
  EXPECT_EQ(temp_files_in(folder()), 0);
}

TEST(ScheduleCli, ModelCostsGiveBytes) {
  const Result r = pipetrain("--model samples/gpt/gpt.onnx --micro-batch 2 --kind 1f1b -s 2 -m 4 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["makespan"].get<double>(), 0);
  EXPECT_GT(j["devices"][0]["peak_bytes"].get<double>(), 0);
  // Units are bytes over what one micro-batch leaves on an average stage: same ratios.
  EXPECT_NEAR(j["devices"][0]["peak_activations"].get<double>() /
                  j["devices"][1]["peak_activations"].get<double>(),
              j["devices"][0]["peak_bytes"].get<double>() / j["devices"][1]["peak_bytes"].get<double>(),
              1e-9);
}

TEST(ScheduleCli, AutoBeatsTheHandMadeKindsOnAHeavyLastStage) {
  const Result r = pipetrain("--kind auto -s 4 -m 8 --costs 1,1,1,1,1,1,1,1,1,2,2,2 "
                             "--memory-limit 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("best hand-made schedule that fits: v-half, makespan 43\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("makespan 38  bubble"), std::string::npos) << r.out;
}

TEST(ScheduleCli, BadInputIsOneLineAndExitTwo) {
  expect_one_line_error(pipetrain("--kind zigzag -s 4 -m 8"),
               "--kind zigzag: unknown schedule kind; use one of gpipe, 1f1b, interleaved, "
               "zb-h1, zb-h2, zb-v, v-zb, v-half, v-min, dualpipev, auto");
  expect_one_line_error(pipetrain("--kind zb-v -s 4 -m 8 --chunks 3"),
               "--kind zb-v: takes 2 chunks per device, not 3; change --chunks");
  expect_one_line_error(pipetrain("--kind gpipe -s 4 -m 8 --memory-limit 4"),
               "--kind gpipe: device 0 keeps 8 micro-batches of activations at its peak, over --memory-limit 4; "
               "choose a kind with less memory, or --kind auto");
  expect_one_line_error(pipetrain("--kind 1f1b -s 4 -m 8 --costs 1,2"),
               "--costs: has 2 numbers; give F,B,W (3 numbers) or F,B,W for each stage (12)");
  const fs::path bad = folder() / "bad.csv";
  std::ofstream(bad) << "# stages: 2\n0F0,0BW0\n1F0,1XW0\n";
  expect_one_line_error(pipetrain("--from-csv " + bad.string()),
               bad.string() + ":3: cell 2 ('1XW0') is not an action; write actions like 0F3, "
               "1B2, 1W2, 0BW3, 1SF4, 1RB4 or STEP");
}

TEST(ScheduleCli, AnInvalidScheduleShowsTheGridAndWritesNothing) {
  const fs::path bad = folder() / "deadlock.csv", out = folder() / "never.svg";
  std::ofstream(bad) << "0F0,0BW0,0F1,0BW1\n1F1,1BW1,1F0,1BW0\n";
  const Result r = pipetrain("--from-csv " + bad.string() + " --svg " + out.string());
  expect_one_line_error(r, bad.string() + ": deadlock: device 0 step 1 (0BW0) waits for 1B0 on device 1; "
                  "device 1 step 0 (1F1) waits for 0F1 on device 0; the device x step grid "
                  "marks where");
  EXPECT_NE(r.out.find("-> device 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[0BW0]"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
