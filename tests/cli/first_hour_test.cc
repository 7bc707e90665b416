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

}  // namespace
