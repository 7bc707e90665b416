// A newcomer's first hour with `partition`, `run`, `inspect` and the config (issue 21, items 9
// and 10): what a new user types gets the right result or one line naming what to change. Each
// test pins the exit code and the message. The models are tests/cli/fixtures/make_fixtures.py's.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exec/npy.h"
#include "tests/cli/run_cli.h"

namespace {

const std::string kFixtures = "tests/cli/fixtures/";

fs::path npy(const fs::path& path, std::vector<int64_t> shape, float first) {
  pt::Tensor t;
  t.type = pt::TensorType{pt::DType::kFloat32, std::move(shape)};
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  float* p = reinterpret_cast<float*>(t.data.data());
  for (int64_t i = 0; i < t.type.numel(); ++i) p[i] = first + static_cast<float>(i);
  pt::write_npy(t, path.string());
  return path;
}

// Item 9: `partition --export` without --micro-batch says the stage files hold batch 1 and how
// to choose it; with --micro-batch, or for a model whose shapes are all static, nothing is said.
TEST(FirstHour, ExportWithoutMicroBatchSaysTheBatchIsFixed) {
  const fs::path d = scratch("export_batch");
  const Result r = run("partition samples/mlp/mlp.onnx -s 2 --export " + (d / "a").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "note: the stage files have the batch fixed at 1 (axis 0 of 'input' is symbolic in the "
                   "model); choose it with --micro-batch N\n");
  EXPECT_TRUE(fs::exists(d / "a" / "stage_1.onnx"));
  const Result chosen = run("partition samples/mlp/mlp.onnx -s 2 -b 4 --export " + (d / "b").string());
  ASSERT_EQ(chosen.code, 0) << chosen.err;
  EXPECT_EQ(chosen.err, "");
  const Result fixed = run("partition " + kFixtures + "static_empty.onnx -s 1 --export " + (d / "c").string());
  ASSERT_EQ(fixed.code, 0) << fixed.err;
  EXPECT_EQ(fixed.err, "");
}

// Item 9: `run` binds the batch from the first input in the graph's order whose first axis is
// symbolic: z (5 rows), though `a` (1 row, static) comes first by name. y = z + a.
TEST(FirstHour, RunBindsTheBatchInGraphOrder) {
  const fs::path d = scratch("graph_order");
  const Result r = run("run " + kFixtures + "graph_order.onnx --input z=" + npy(d / "z.npy", {5, 3}, 0).string() +
                       " --input a=" + npy(d / "a.npy", {1, 3}, 10).string() + " -o " + d.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const pt::Tensor y = pt::read_npy((d / "y.npy").string());
  ASSERT_EQ(y.type.shape, (std::vector<int64_t>{5, 3}));
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(y.as<float>()[i], static_cast<float>(i + 10 + i % 3)) << i;
  // 0 rows where the batch is bound: one line naming the input.
  expect_one_line_error(run("run " + kFixtures + "graph_order.onnx --input z=" + npy(d / "z0.npy", {0, 3}, 0).string() +
                            " --input a=" + (d / "a.npy").string() + " -o " + d.string()),
                        "--input z: holds float32[0,3]: its first axis binds the batch and has 0 rows; give at "
                        "least one row");
}

// Item 9: a model with only static shapes, whose first input by name is empty (as ONNX's node
// tests with an empty `axes` are), runs instead of stopping at "micro-batch: must be at least 1".
TEST(FirstHour, RunOfAStaticModelWithAnEmptyInput) {
  const fs::path d = scratch("static_empty");
  const Result r = run("run " + kFixtures + "static_empty.onnx --input x=" + npy(d / "x.npy", {2, 3}, 1).string() +
                       " --input e=" + npy(d / "e.npy", {0, 3}, 0).string() + " -o " + d.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const pt::Tensor y = pt::read_npy((d / "y.npy").string());
  ASSERT_EQ(y.type.shape, (std::vector<int64_t>{2, 3}));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(y.as<float>()[i], static_cast<float>(i + 1));
}

// Item 10: an --input the model does not have is named, with the model's inputs as declared.
TEST(FirstHour, RunNamesAnUnknownInputAndListsTheModelsInputs) {
  const fs::path d = scratch("unknown_input");
  expect_one_line_error(run("run " + kFixtures + "graph_order.onnx --input inp=" + npy(d / "x.npy", {5, 3}, 0).string() +
                            " -o " + d.string()),
                        "--input inp: the model has no input of that name (its inputs: z float32[N,3], a "
                        "float32[1,3]); name one of them");
}

// Item 10: a key written twice is an error naming both lines (yaml-cpp would read the first),
// at the top level and inside a section; an empty file says so.
TEST(FirstHour, ConfigKeysWrittenTwiceAndEmptyConfigs) {
  const fs::path d = scratch("config_keys");
  const fs::path top = write(d / "top.yaml", "model: samples/mlp/mlp.onnx\nsteps: 3\npipeline:\n  stages: 2\nsteps: 4\n");
  expect_one_line_error(run("train " + top.string()),
                        top.string() + ":5: steps: written twice, on lines 2 and 5; keep one of them");
  const fs::path inner = write(d / "inner.yaml", "model: samples/mlp/mlp.onnx\npipeline:\n  stages: 2\n  stages: 3\n");
  expect_one_line_error(run("train " + inner.string()),
                        inner.string() + ":4: pipeline.stages: written twice, on lines 3 and 4; keep one of them");
  const fs::path empty = write(d / "empty.yaml", "");
  expect_one_line_error(run("train " + empty.string()),
                        empty.string() + ": the file is empty (no keys); write the config's keys, starting from "
                                         "samples/charlm/train.yaml");
  const fs::path comments = write(d / "comments.yaml", "# nothing yet\n");
  expect_one_line_error(run("train " + comments.string() + " --set steps=2"),
                        comments.string() + ": the file is empty (no keys); write the config's keys, starting from "
                                            "samples/charlm/train.yaml");
}

// Item 10: --dim naming no symbolic dim of the model's inputs is an error listing those it has.
TEST(FirstHour, ADimTheModelDoesNotHaveIsAnError) {
  expect_one_line_error(run("inspect samples/mlp/mlp.onnx --dim foo=3"),
                        "--dim foo=3: the model's inputs have no symbolic dimension 'foo'; name one of batch");
  expect_one_line_error(run("partition " + kFixtures + "static_empty.onnx -s 1 --dim foo=3"),
                        "--dim foo=3: the model's inputs have no symbolic dimension 'foo'; they have none, so "
                        "leave --dim out");
  const fs::path d = scratch("dim_run");
  expect_one_line_error(run("run " + kFixtures + "graph_order.onnx --dim batch=2 --input z=" +
                            npy(d / "z.npy", {2, 3}, 0).string() + " --input a=" + npy(d / "a.npy", {1, 3}, 0).string() +
                            " -o " + d.string()),
                        "--dim batch=2: the model's inputs have no symbolic dimension 'batch'; name one of N");
  EXPECT_EQ(run("inspect samples/mlp/mlp.onnx --dim batch=3").code, 0);
}

// Item 10: --recompute only means something with --backward.
TEST(FirstHour, RecomputeWithoutBackwardIsAnError) {
  expect_one_line_error(run("partition samples/mlp/mlp.onnx -s 2 --recompute full"),
                        "--recompute full: applies to the backward graphs, which only --backward builds; add "
                        "--backward, or leave --recompute out");
  EXPECT_EQ(run("partition samples/mlp/mlp.onnx -s 2 --recompute full --backward").code, 0);
}

// Item 10: `partition --backward --json` prints one JSON object, the backward figures inside it.
TEST(FirstHour, PartitionBackwardJsonHoldsTheBackwardTable) {
  const Result r = run("partition samples/mlp/mlp.onnx -s 2 --backward --json --recompute full");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("stages"));
  const nlohmann::json& b = j.at("backward");
  EXPECT_EQ(b.at("recompute"), "full");
  ASSERT_EQ(b.at("chunks").size(), 2u);
  for (const auto& c : b.at("chunks")) {
    // full recompute keeps what the chunk's input alone needs: no more than keeping everything.
    EXPECT_EQ(c.at("kept_bytes"), c.at("by_policy").at("full").at("kept_bytes"));
    EXPECT_LE(c.at("kept_bytes").get<int64_t>(), c.at("by_policy").at("none").at("kept_bytes").get<int64_t>());
    EXPECT_GT(c.at("recompute_flops").get<int64_t>(), 0);
  }
  // The text form has the same kept bytes for the chosen policy.
  const Result text = run("partition samples/mlp/mlp.onnx -s 2 --backward --recompute full");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("backward (recompute full), per micro-batch:"), std::string::npos) << text.out;
}

// Item 10: byte figures in human units (run's arena, a schedule's peak over --memory-limit), and
// --memory-limit takes units; a bare number is bytes, said as such.
TEST(FirstHour, BytesInHumanUnits) {
  const fs::path d = scratch("bytes");
  const Result r = run("run " + kFixtures + "graph_order.onnx --input z=" + npy(d / "z.npy", {2, 3}, 0).string() +
                       " --input a=" + npy(d / "a.npy", {1, 3}, 0).string() + " -o " + d.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\narena 64 B planned\n"), std::string::npos) << r.out;
  expect_one_line_error(run("schedule -k 1f1b -s 2 -m 4 --model samples/mlp/mlp.onnx --memory-limit 4"),
                        "--kind 1f1b: device 0 keeps 1.50 KiB at its peak, over --memory-limit 4; choose a kind "
                        "with less memory, or --kind auto");
  EXPECT_EQ(run("partition samples/mlp/mlp.onnx -s 2 --memory-limit 1MiB").code, 0);
  expect_one_line_error_starting(run("partition samples/mlp/mlp.onnx -s 2 --memory-limit 4"),
                                 "partition: no split into 2 stages fits the memory limit of 4 B per stage");
}

// Item 10: -q hides progress, not the result: the final evaluation line is printed.
TEST(FirstHour, QuietStillPrintsTheFinalEval) {
  const fs::path d = scratch("quiet");
  const fs::path cfg = write(d / "c.yaml", "model: samples/mlp/mlp.onnx\n"
                                           "dims: {batch: 4}\n"
                                           "data: {kind: synthetic, samples: 64, eval_fraction: 0.25}\n"
                                           "pipeline: {stages: 2, micro_batches: 4, schedule: 1f1b}\n"
                                           "steps: 4\n"
                                           "eval_every: 2\n"
                                           "output: {model: " + (d / "m.onnx").string() + "}\n");
  const Result r = run("train -q " + cfg.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("eval after step 4: loss ", 0), 0u) << r.out;  // the first line
  EXPECT_EQ(r.out.find("eval after step 2"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("] step "), std::string::npos) << r.out;
}

}  // namespace
