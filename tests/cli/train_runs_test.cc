// A newcomer's first hour with `pipetrain train` (issue 21): no run destroys another run's work,
// and what a new user types next gets one line, never an abort. Each test pins the exit code and
// the message, and what is on disk afterwards.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "train/checkpoint.h"
#include "tests/cli/run_cli.h"

namespace {

std::string latest(const fs::path& ckpt) {
  std::string name;
  std::getline(std::ifstream(ckpt / "latest"), name);
  return name;
}

// The mlp sample on 2 stages (zb-v, 2 chunks), every output under `dir`.
fs::path mlp_config(const fs::path& dir, int steps, int every) {
  std::ostringstream c;
  c << "model: samples/mlp/mlp.onnx\n"
    << "dims: {batch: 4}\n"
    << "data: {kind: synthetic, samples: 64, eval_fraction: 0.25}\n"
    << "optimizer: {kind: adamw, lr: 3.0e-3, warmup_steps: 2, schedule: cosine}\n"
    << "pipeline: {stages: 2, chunks: 2, micro_batches: 4, schedule: zb-v}\n"
    << "steps: " << steps << "\n"
    << "checkpoint: {dir: " << (dir / "ckpt").string() << ", every: " << every << "}\n"
    << "output: {model: " << (dir / "trained.onnx").string() << ", metrics: " << (dir / "metrics.jsonl").string()
    << ", trace: " << (dir / "trace.json").string() << ", timeline: " << (dir / "timeline.svg").string() << "}\n";
  return write(dir / "c.yaml", c.str());
}

// Item 1: a short fresh run into the folder of a longer finished one used to keep the old
// run's step_30/step_40, delete its own and leave `latest` naming a file that was gone. Now it
// refuses, touching nothing; with --overwrite it starts over and its own newest checkpoint stays.
TEST(TrainRuns, AFreshRunDoesNotTakeOverAnotherRunsCheckpoints) {
  const fs::path d = scratch("fresh");
  const fs::path cfg = mlp_config(d, 40, 10);
  ASSERT_EQ(run("train -q " + cfg.string()).code, 0);
  EXPECT_EQ(pt::checkpoint_steps((d / "ckpt").string()), (std::vector<int64_t>{30, 40}));
  const std::string model = slurp(d / "trained.onnx");

  const Result refused = run("train " + cfg.string() + " --set steps=4 --set checkpoint.every=2");
  expect_one_line_error(refused, cfg.string() + ":7: checkpoint.dir: '" + (d / "ckpt").string() +
                                     "' holds another run's checkpoints (up to step 40); continue that run with "
                                     "--resume, start over with --overwrite (deletes them), or --set "
                                     "checkpoint.dir=ANOTHER");
  EXPECT_EQ(refused.out, "");
  EXPECT_EQ(pt::checkpoint_steps((d / "ckpt").string()), (std::vector<int64_t>{30, 40}));
  EXPECT_EQ(latest(d / "ckpt"), "step_00000040.ckpt");
  EXPECT_EQ(slurp(d / "trained.onnx"), model);

  const Result over = run("train " + cfg.string() + " --set steps=4 --set checkpoint.every=2 --overwrite");
  ASSERT_EQ(over.code, 0) << over.err;
  EXPECT_NE(over.out.find("--overwrite: removed the checkpoints in " + (d / "ckpt").string() + "\n"), std::string::npos)
      << over.out;
  EXPECT_EQ(pt::checkpoint_steps((d / "ckpt").string()), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(latest(d / "ckpt"), "step_00000004.ckpt");
  EXPECT_EQ(pt::read_latest_checkpoint((d / "ckpt").string())->step, 4);

  // --overwrite and --resume contradict each other.
  expect_one_line_error(run("train " + cfg.string() + " --resume --overwrite"),
                        "--resume and --overwrite cannot be given together; give one of them; see `pipetrain train --help`");
}

// Retention keeps the checkpoint just written and the one before it, whatever else the folder
// holds: `latest` always names a file that exists.
TEST(TrainRuns, RetentionNeverRemovesTheCheckpointJustWritten) {
  const fs::path d = scratch("retention");
  pt::Checkpoint c;
  for (int64_t step : {30, 40, 2, 4}) {
    c.step = step;
    pt::write_checkpoint((d / "ckpt").string(), c);
  }
  EXPECT_EQ(pt::checkpoint_steps((d / "ckpt").string()), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(pt::read_latest_checkpoint((d / "ckpt").string())->step, 4);
  write(d / "ckpt" / "notes.txt", "mine");
  pt::clear_checkpoints((d / "ckpt").string());
  EXPECT_TRUE(pt::checkpoint_steps((d / "ckpt").string()).empty());
  EXPECT_FALSE(fs::exists(d / "ckpt" / "latest"));
  EXPECT_TRUE(fs::exists(d / "ckpt" / "notes.txt"));  // only checkpoints are removed
}

// Across processes: the parts each rank wrote (tensors of their own or borrowed) and the file
// naming them read as one checkpoint; retention and clearing take the parts with their checkpoint; a part of another step is named.
TEST(TrainRuns, CheckpointPartsReadAsOneAndGoWithTheirCheckpoint) {
  const fs::path d = scratch("parts");
  const std::string dir = (d / "ckpt").string();
  const auto tensor = [](float v) {
    pt::Tensor t;
    t.type.dtype = pt::DType::kFloat32;
    t.type.shape = {1};
    t.data.resize(4);
    std::memcpy(t.data.data(), &v, 4);
    return t;
  };
  for (int64_t step : {2, 4, 6}) {
    pt::Checkpoint a, b, c;
    a.step = b.step = c.step = step;
    a.tensors.emplace_back("model/a", tensor(1.0f * step));
    const pt::Tensor held = tensor(2.0f * step);
    b.borrowed.emplace_back("model/b", &held);  // written from where it is held, as a trainer writes its state
    pt::write_checkpoint_part(dir, a, 0);
    pt::write_checkpoint_part(dir, b, 3);
    c.meta["stages"] = "2";
    pt::write_checkpoint(dir, c, {pt::checkpoint_part_name(step, 0), pt::checkpoint_part_name(step, 3)});
  }
  const pt::Checkpoint got = *pt::read_latest_checkpoint(dir);
  EXPECT_EQ(got.step, 6);
  EXPECT_EQ(got.meta.at("stages"), "2");
  ASSERT_TRUE(got.find("model/a") && got.find("model/b"));
  EXPECT_EQ(got.find("model/b")->data, tensor(12.0f).data);
  // Read in place: model/a's bytes straight into its home (as a resume reads its parameters).
  pt::Tensor home = tensor(0.0f);
  const pt::Checkpoint placed = *pt::read_latest_checkpoint(dir, {}, [&](const std::string& name, const pt::TensorType& type) {
    return name == "model/a" && type == home.type ? home.data.data() : nullptr;
  });
  EXPECT_TRUE(placed.find("model/a")->data.empty());
  EXPECT_EQ(placed.find("model/a")->type, home.type);
  EXPECT_EQ(home.data, tensor(6.0f).data);
  EXPECT_EQ(placed.find("model/b")->data, tensor(12.0f).data);
  EXPECT_EQ(pt::checkpoint_steps(dir), (std::vector<int64_t>{4, 6}));
  EXPECT_FALSE(fs::exists(d / "ckpt" / "step_00000002.rank0.part"));
  EXPECT_TRUE(fs::exists(d / "ckpt" / "step_00000004.rank3.part"));
  // A part of step 4 under step 6's name: named, not read as step 6's.
  fs::copy_file(d / "ckpt" / "step_00000004.rank3.part", d / "ckpt" / "step_00000006.rank3.part",
                fs::copy_options::overwrite_existing);
  try {
    pt::read_latest_checkpoint(dir);
    ADD_FAILURE() << "no error";
  } catch (const pt::UserError& e) {
    EXPECT_EQ(std::string(e.what()), (d / "ckpt" / "step_00000006.rank3.part").string() +
                                         ": belongs to step 4, not 6; resume from another checkpoint");
  }
  pt::clear_checkpoints(dir);
  EXPECT_TRUE(fs::is_empty(d / "ckpt"));
}

// A step whose loss or gradient is not finite (here an SGD step of lr 1e30 overflows the
// weights, and the next forward makes an Inf): the run stops before updating, with one line
// naming the step and the first node whose output is not finite (its chunk, stage and
// micro-batch); exit 2, the last checkpoint kept and nothing else written.
TEST(TrainRuns, ANonFiniteStepStopsAndNamesTheNodeThatMadeIt) {
  const fs::path d = scratch("nonfinite");
  const fs::path cfg = mlp_config(d, 6, 1);
  const Result r = run("train -q " + cfg.string() + " --set optimizer.kind=sgd --set optimizer.lr=1.0e+30 "
                       "--set optimizer.warmup_steps=0 --set optimizer.schedule=constant");
  EXPECT_EQ(r.code, 2) << r.err;
  const std::regex line(
      "error: step 2: the (loss|gradient norm) is (nan|inf|-inf); the first (nan|inf): output '[^']+' of node '[^']+' \\([A-Za-z]+\\) in the "
      "(forward|input gradient|weight gradient) of chunk [0-3] \\(stage [01]\\), micro-batch [0-3]; the run stopped before "
      "updating the parameters; the last checkpoint is kept: lower optimizer.lr, set optimizer.clip_grad_norm, or look "
      "at that node's inputs\n");
  EXPECT_TRUE(std::regex_match(r.err, line)) << r.err;
  EXPECT_EQ(latest(d / "ckpt"), "step_00000001.ckpt");
  EXPECT_EQ(pt::checkpoint_steps((d / "ckpt").string()), std::vector<int64_t>{1});
  EXPECT_FALSE(fs::exists(d / "trained.onnx"));
}

// Item 2: --resume of a finished run (or one whose checkpoint is past --set steps) used to
// rewrite the trace with 0 events, the timeline and the metrics summary with zeros. Now it says
// so in one line and every file stays byte for byte.
TEST(TrainRuns, ResumingAFinishedRunChangesNoFile) {
  const fs::path d = scratch("finished");
  const fs::path cfg = mlp_config(d, 6, 3);
  ASSERT_EQ(run("train -q " + cfg.string()).code, 0);
  std::map<fs::path, std::string> before;
  for (const auto& e : fs::recursive_directory_iterator(d))
    if (e.is_regular_file()) before[e.path()] = slurp(e.path());
  ASSERT_GE(before.size(), 8u);  // config, model, weights, metrics, trace, timeline, 2 checkpoints, latest

  const Result r = run("train " + cfg.string() + " --resume");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "nothing to do: step 6 of 6 (" + (d / "ckpt").string() +
                       "); raise steps (--set steps=N) to train on\n");
  const Result past = run("train " + cfg.string() + " --resume --set steps=4");
  EXPECT_EQ(past.code, 0) << past.err;
  EXPECT_EQ(past.out, "nothing to do: step 6 of 4 (" + (d / "ckpt").string() +
                          "); raise steps (--set steps=N) to train on\n");
  std::map<fs::path, std::string> after;
  for (const auto& e : fs::recursive_directory_iterator(d))
    if (e.is_regular_file()) after[e.path()] = slurp(e.path());
  EXPECT_TRUE(after == before);
}

// Item 6: resuming with another pipeline.stages (or optimizer) names what wrote the checkpoint,
// instead of "no optimizer state for device 2".
TEST(TrainRuns, ResumingWithAnotherConfigSaysWhatWroteTheCheckpoint) {
  const fs::path d = scratch("other");
  const fs::path cfg = mlp_config(d, 4, 2);
  ASSERT_EQ(run("train -q " + cfg.string() + " --set steps=2").code, 0);
  const std::string at = cfg.string() + ":7: checkpoint.dir: ";
  expect_one_line_error(run("train " + cfg.string() + " --resume --set pipeline.stages=1"),
                        at + "the checkpoint was written with pipeline.stages: 2, this run has 1; resume with "
                             "--set pipeline.stages=2, or start over with --overwrite");
  expect_one_line_error(run("train " + cfg.string() + " --resume --set optimizer.kind=sgd"),
                        at + "the checkpoint was written with optimizer.kind: adamw, this run has sgd; resume "
                             "with --set optimizer.kind=adamw, or start over with --overwrite");
}

// Item 6: docs/training.md's `--set pipeline.stages=2 --set pipeline.schedule=1f1b` on the charlm
// sample (chunks: 2 for its zb-v) runs, with one line on the chunks; chunks given with --set
// too are the user's and checked against the kind.
TEST(TrainRuns, ASchedulePickedWithSetTakesItsOwnChunks) {
  const fs::path d = scratch("readme");
  const std::string outs = " --set steps=1 --set checkpoint.dir=" + (d / "ckpt").string() +
                           " --set output.model=" + (d / "m.onnx").string() + " --set output.metrics=" +
                           (d / "m.jsonl").string() + " --set output.trace= --set output.timeline=";
  const std::string readme = "train samples/charlm/train.yaml --set pipeline.stages=2 --set pipeline.schedule=1f1b";
  const Result r = run(readme + outs);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("pipeline.schedule: 1f1b takes 1 chunk(s) per device, not the 2 of "
                        "samples/charlm/train.yaml:25: pipeline.chunks; running 1 (--set pipeline.chunks=N to choose)\n",
                        0),
            0u)
      << r.out;
  EXPECT_NE(r.out.find("schedule 1f1b: 2 stages x 1 chunk(s), 8 micro-batches"), std::string::npos) << r.out;
  expect_one_line_error(run(readme + " --set pipeline.chunks=2 --overwrite" + outs),
                        "--set pipeline.chunks: schedule 1f1b takes 1 chunk(s) per device, not 2; set "
                        "pipeline.chunks to 1, or leave it out");
}

// Item 8: kind names in any case, in `schedule` and in the config.
TEST(TrainRuns, KindNamesAreCaseInsensitive) {
  const fs::path d = scratch("case");
  const fs::path cfg = mlp_config(d, 2, 0);
  const Result r = run("train " + cfg.string() + " --set pipeline.schedule=ZB-H1 --set pipeline.chunks=1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("schedule zb-h1: 2 stages x 1 chunk(s)"), std::string::npos) << r.out;
  const Result s = run("schedule -k 1F1B -s 2 -m 4");
  EXPECT_EQ(s.code, 0) << s.err;
}

// Item 5: a schedule written by `schedule --lowered --csv` (sends, receives and STEP in it) runs
// as `schedule --from-csv` reads it, instead of stopping at an internal check in lower.cc.
TEST(TrainRuns, ALoweredCsvScheduleTrains) {
  const fs::path d = scratch("lowered");
  const fs::path cfg = mlp_config(d, 3, 0);
  const fs::path csv = d / "low.csv";
  ASSERT_EQ(run("schedule -k zb-h1 -s 2 -m 4 --lowered --csv " + csv.string()).code, 0);
  ASSERT_NE(slurp(csv).find("STEP"), std::string::npos);
  ASSERT_EQ(run("schedule --from-csv " + csv.string()).code, 0);
  const Result r = run("train " + cfg.string() + " --set pipeline.schedule=" + csv.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 stages x 1 chunk(s), 4 micro-batches"), std::string::npos) << r.out;
  // The same schedule compute-only trains to the same bits.
  const fs::path plain = d / "plain.csv";
  ASSERT_EQ(run("schedule -k zb-h1 -s 2 -m 4 --csv " + plain.string()).code, 0);
  const std::string lowered_model = slurp(d / "trained.onnx");
  ASSERT_EQ(run("train -q " + cfg.string() + " --set pipeline.schedule=" + plain.string()).code, 0);
  EXPECT_EQ(slurp(d / "trained.onnx"), lowered_model);
}

// Item 4: a folder where a config or a model file belongs gets one line, not an abort.
TEST(TrainRuns, AFolderWhereAFileBelongsGetsOneLine) {
  const fs::path d = scratch("folder");
  expect_one_line_error(run("train " + d.string()),
                        d.string() + ": is a folder, not a config file; give the YAML file, e.g. "
                                     "samples/charlm/train.yaml");
  const fs::path cfg = write(d / "c.yaml", "model: " + d.string() + "\n");
  expect_one_line_error_starting(run("train " + cfg.string()), cfg.string() + ":1: model: " + d.string() + ": is a folder");
}

// --profile: the kernel time per step from the second step on, per pass and op type, every row
// of a small model shown (shares adding up to the whole); profiling changes no result.
TEST(TrainRuns, ProfileSaysWhereTheStepsTimeGoes) {
  const fs::path d = scratch("profile");
  const fs::path cfg = mlp_config(d, 3, 0);
  const std::string plain_args = " -q --set checkpoint.dir= --set output.trace= --set output.timeline=";
  ASSERT_EQ(run("train " + cfg.string() + plain_args).code, 0);
  const std::string plain = slurp(d / "trained.onnx");
  const Result r = run("train " + cfg.string() + plain_args + " --profile");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(d / "trained.onnx"), plain);
  const size_t at = r.out.find("kernel time per step, steps 2 to 3 (each kernel timed alone, all devices): ");
  // ... " ms; model ms at R GFLOP-equivalents/s": the cost model's figure for each row beside it
  ASSERT_NE(at, std::string::npos) << r.out;
  std::istringstream rows(r.out.substr(at));
  std::string line;
  std::getline(rows, line);
  std::getline(rows, line);
  EXPECT_EQ(line, "  pass  op                          nodes        ms  share  model ms  ratio");
  double share = 0;
  std::set<std::string> passes, ops;
  while (std::getline(rows, line) && line.rfind("  ", 0) == 0) {
    std::istringstream f(line);
    std::string pass, op;
    int nodes = 0;
    double ms = 0, pct = 0;
    f >> pass >> op >> nodes >> ms >> pct;
    passes.insert(pass);
    ops.insert(op);
    EXPECT_GT(nodes, 0) << line;
    EXPECT_GE(ms, 0) << line;
    share += pct;
  }
  EXPECT_NEAR(share, 100, 1.0) << r.out;
  EXPECT_EQ(passes, (std::set<std::string>{"F", "B", "W"})) << r.out;
  EXPECT_TRUE(ops.count("Gemm") || ops.count("MatMul")) << r.out;
  // Then the ten slowest nodes, slowest first, each named with its chunk, pass, op and shape.
  EXPECT_EQ(line, "slowest nodes, ms per step:") << r.out;
  std::getline(rows, line);
  EXPECT_EQ(line, "  chunk  pass  op                              ms  model ms  ratio  node [output shape]");
  int shown = 0;
  double last = 1e30;
  while (std::getline(rows, line) && line.rfind("  ", 0) == 0) {
    std::istringstream f(line);
    int chunk = -1;
    std::string pass, op, ratio, node, shape;
    double ms = -1, model = -1;
    f >> chunk >> pass >> op >> ms >> model >> ratio >> node >> shape;
    EXPECT_TRUE(chunk >= 0 && chunk < 4) << line;  // 2 stages x 2 chunks
    EXPECT_TRUE(pass == "F" || pass == "B" || pass == "W") << line;
    EXPECT_TRUE(ops.count(op)) << line;
    EXPECT_LE(ms, last) << line;
    EXPECT_FALSE(node.empty()) << line;
    EXPECT_EQ(shape.front(), '[') << line;
    last = ms;
    ++shown;
  }
  EXPECT_EQ(shown, 10) << r.out;
  // The metrics file's summary has every node's row (bench/fit_costs.py fits the cost model's
  // constants to them): its time per run and what the model counts for it. Per step (4
  // micro-batches), the rows add up to the total printed above.
  std::ifstream in(d / "metrics.jsonl");
  std::string json, last_line;
  while (std::getline(in, json)) last_line = json;
  const nlohmann::json summary = nlohmann::json::parse(last_line)["summary"];
  // Each chunk's device beside its costs: zb-v's V, 2 devices x 2 chunks.
  EXPECT_EQ(summary["chunk_devices"], nlohmann::json({0, 1, 1, 0})) << last_line;
  const nlohmann::json& profile = summary["profile"];
  ASSERT_GT(profile.size(), 10u) << last_line;
  double per_step_ms = 0;
  std::set<std::string> profiled_ops;
  for (const nlohmann::json& n : profile) {
    EXPECT_TRUE(n["chunk"].get<int>() >= 0 && n["chunk"].get<int>() < 4) << n;
    EXPECT_GE(n["seconds"].get<double>(), 0) << n;
    EXPECT_GE(n["flops"].get<int64_t>(), 0) << n;
    EXPECT_LE(n["cached_bytes"].get<int64_t>(), n["bytes_read"].get<int64_t>() + n["bytes_written"].get<int64_t>()) << n;
    EXPECT_FALSE(n["node"].get<std::string>().empty()) << n;
    profiled_ops.insert(n["op"].get<std::string>());
    per_step_ms += n["seconds"].get<double>() * 4 * 1e3;
  }
  for (const std::string& op : ops) EXPECT_TRUE(profiled_ops.count(op)) << op;
  const double printed_ms = std::stod(r.out.substr(at + std::strlen("kernel time per step, steps 2 to 3 (each kernel timed alone, all devices): ")));
  EXPECT_NEAR(per_step_ms, printed_ms, 0.006) << r.out;
}

// fuse_attention_from: the keys from which train runs an attention as one kernel. The gpt sample's
// attention over 32 keys stays the unfused products by default and is one FusedAttention per layer
// at 1; both train to the same losses (the fused program's gradients are within 1.1e-6 of the
// unfused one's). A bound below 1 is refused in one line naming the key.
TEST(TrainRuns, FuseAttentionFromChoosesWhichAttentionRunsAsOneKernel) {
  const fs::path d = scratch("fuse_attention");
  const fs::path cfg = write(d / "c.yaml",
                             "model: samples/gpt/gpt.onnx\ndims: {batch: 2}\n"
                             "loss: {kind: cross_entropy, output: output}\ndata: {kind: synthetic, samples: 16}\n"
                             "optimizer: {kind: sgd, lr: 0.1}\nparameters: {frozen: [mask]}\n"
                             "pipeline: {stages: 2, micro_batches: 2, schedule: 1f1b}\nsteps: 3\n");
  const auto losses = [](const std::string& out) {
    std::vector<double> l;
    const std::regex loss("loss ([0-9.]+)");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), loss); it != std::sregex_iterator(); ++it)
      l.push_back(std::stod((*it)[1]));
    return l;
  };
  const Result unfused = run("train " + cfg.string() + " --profile");
  const Result fused = run("train " + cfg.string() + " --profile --set fuse_attention_from=1");
  ASSERT_EQ(unfused.code, 0) << unfused.err;
  ASSERT_EQ(fused.code, 0) << fused.err;
  EXPECT_EQ(unfused.out.find("FusedAttention"), std::string::npos);
  EXPECT_NE(fused.out.find("FusedAttention"), std::string::npos) << fused.out;
  const std::vector<double> a = losses(unfused.out), b = losses(fused.out);
  ASSERT_EQ(a.size(), 3u) << unfused.out;
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-4) << "step " << i + 1;
  expect_one_line_error_starting(run("train " + cfg.string() + " --set fuse_attention_from=0"),
                                 "--set fuse_attention_from: must be at least 1, got 0");
}

// Issue 42: a plan needing more host memory than the machine has stops before loading, with one
// line giving both figures and what would fit, and writes nothing; memory.check: off runs it
// anyway. PT_MEMAVAILABLE pretends the small machine (tests only). A run prints its plan per
// device and its peak RSS beside the planned host memory.
TEST(TrainRuns, APlanLargerThanTheHostStopsBeforeLoading) {
  const fs::path d = scratch("memory");
  const fs::path cfg = mlp_config(d, 2, 1);
  const Result refused = run_command("PT_MEMAVAILABLE=1MiB " + std::string(PT_BINARY) + " train " + cfg.string());
  expect_one_line_error_starting(refused, "host memory: this run needs ");
  for (const char* part : {" (parameters ", ", gradients ", ", optimizer state ", ", activations ",
                           ", 300 MiB per process), more than the 1.00 MiB it has available (PT_MEMAVAILABLE); to fit: ",
                           "pipeline.recompute: full", "; --set memory.check=off runs it anyway\n"})
    EXPECT_NE(refused.err.find(part), std::string::npos) << part << "\n" << refused.err;
  EXPECT_EQ(refused.out, "");
  EXPECT_FALSE(fs::exists(d / "ckpt"));
  EXPECT_FALSE(fs::exists(d / "metrics.jsonl"));

  const Result off = run_command("PT_MEMAVAILABLE=1MiB " + std::string(PT_BINARY) + " train -q " + cfg.string() +
                                 " --set memory.check=off");
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_TRUE(fs::exists(d / "trained.onnx"));

  const Result bad = run_command("PT_MEMAVAILABLE=lots " + std::string(PT_BINARY) + " train " + cfg.string() + " --overwrite");
  expect_one_line_error_starting(bad, "PT_MEMAVAILABLE: cannot read 'lots' as a size");

  const Result ok = run("train " + cfg.string() + " --overwrite");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("memory: this run plans "), std::string::npos) << ok.out;
  const std::string size = "[0-9.]+ [KM]?i?B";
  const std::regex device("\n  device 0: " + size + " \\+ " + size + " \\+ " + size + " \\+ " + size + " \\+ " + size + " = " + size + "\n");
  EXPECT_NE(ok.out.find("memory per device, planned: parameters + gradients + optimizer state + peak activations + programs' arena\n"),
            std::string::npos)
      << ok.out;
  EXPECT_TRUE(std::regex_search(ok.out, device)) << ok.out;
  const std::regex arena("\nprograms' arena per device, allocated / planned \\(the kernels' scratch is not planned\\): " +
                         size + " / " + size + "(, " + size + " / " + size + ")*\n");
  EXPECT_TRUE(std::regex_search(ok.out, arena)) << ok.out;
  const std::regex rss("\npeak RSS, measured / planned host memory \\(its devices, 300 MiB "
                       "per process\\):\n  process: [0-9.]+ MiB / [0-9.]+ MiB \\(0\\.[0-9]+x\\)\n");
  EXPECT_TRUE(std::regex_search(ok.out, rss)) << ok.out;
}

}  // namespace
