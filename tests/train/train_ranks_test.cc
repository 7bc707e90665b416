// `mpirun -n N pipetrain train`: the pipeline's devices on N processes (train/train_ranks.h) give
// the very bytes of the run in one process (trained model, weights, every loss and gradient
// norm, the state in checkpoints, resumed runs), over shared memory and over TCP; what such a run cannot do
// yet is one line; a rank that dies ends the job instead of leaving the others waiting. A tied
// embedding and LM head on two ranks gives those bytes too.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "train/checkpoint.h"
#include "tests/cli/run_cli.h"
#include "tests/exec/safetensors_reader.h"

namespace {

// A trained model's bytes: the model file, then its external data file where there is one.
std::string model_bytes(const fs::path& model) {
  const fs::path data = model.string() + ".data";
  return slurp(model) + (fs::exists(data) ? "\n--- data ---\n" + slurp(data) : "");
}

// charlm (the main job's model and data), every output under `dir`; `sets` appended.
std::string charlm(const fs::path& dir, const std::string& sets) {
  return "train samples/charlm/train.yaml -q --set checkpoint.dir= --set output.trace= --set output.timeline= "
         "--set output.model=" + (dir / "charlm.onnx").string() + " --set output.metrics=" +
         (dir / "metrics.jsonl").string() + " " + sets;
}

Result mpirun(int ranks, const std::string& args, const std::string& mca = "") {
  return run_command(std::string(PT_MPIRUN) + " --oversubscribe --allow-run-as-root -n " + std::to_string(ranks) +
                     " " + mca + " " + PT_BINARY + " " + args);
}

// The metrics lines without their timings (step_s, samples_per_s, bubble differ run to run).
std::string without_timings(const std::string& metrics) {
  std::istringstream in(metrics);
  std::string out, line;
  while (std::getline(in, line)) {
    for (const char* key : {"\"bubble\":", "\"step_s\":", "\"samples_per_s\":"}) {
      const size_t at = line.find(key);
      if (at == std::string::npos) continue;
      const size_t end = line.find_first_of(",}", at);
      line.erase(at, end - at);
    }
    if (line.find("\"summary\"") == std::string::npos) out += line + "\n";
  }
  return out;
}

// The trained model and weights (`model`.onnx and .safetensors) and the metrics of two runs.
void expect_same_run(const fs::path& one, const fs::path& many, const std::string& model = "charlm") {
  EXPECT_TRUE(fs::exists(one / (model + ".onnx")) && fs::exists(one / (model + ".safetensors")));
  EXPECT_EQ(model_bytes(many / (model + ".onnx")), model_bytes(one / (model + ".onnx")));
  EXPECT_EQ(slurp(many / (model + ".safetensors")), slurp(one / (model + ".safetensors")));
  EXPECT_EQ(without_timings(slurp(many / "metrics.jsonl")), without_timings(slurp(one / "metrics.jsonl")));
  EXPECT_FALSE(without_timings(slurp(one / "metrics.jsonl")).empty());
}

TEST(TrainRanks, TwoRanksGiveTheBytesOfOneProcess) {
  const fs::path one = scratch("ranks_one"), two = scratch("ranks_two");
  const std::string sets = "--set steps=6 --set eval_every=3";
  ASSERT_EQ(run(charlm(one, sets)).code, 0);
  const Result r = mpirun(2, charlm(two, sets));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_run(one, two);
  // Rank 0 alone prints: the final eval line once.
  size_t evals = 0;
  for (size_t at = 0; (at = r.out.find("eval after step 6", at)) != std::string::npos; ++at) ++evals;
  EXPECT_EQ(evals, 1u) << r.out;
}

// Four ranks over TCP alone (no shared memory), one device each, under three schedule kinds,
// evaluating after each step (each rank its own chunks, interleaved's two a rank included).
TEST(TrainRanks, FourRanksOverTcpUnderEveryKindOfSchedule) {
  for (const char* kind : {"1f1b", "zb-h1", "interleaved"}) {
    SCOPED_TRACE(kind);
    const fs::path one = scratch("ranks4_one"), four = scratch("ranks4_four");
    const std::string sets = std::string("--set steps=2 --set eval_every=1 --set pipeline.schedule=") + kind;
    ASSERT_EQ(run(charlm(one, sets)).code, 0);
    const Result r = mpirun(4, charlm(four, sets), "--mca btl self,tcp");
    ASSERT_EQ(r.code, 0) << r.err;
    expect_same_run(one, four);
  }
}

// A config without `data:` says once, not once per rank, that it trains on synthetic samples;
// each step's progress line comes once, as a line of its own. mpirun is run on a
// pseudo-terminal (script(1)), as from a shell, so that its ranks' stdout is a terminal too: the
// line rewritten in place there put carriage returns and erase codes (ESC [K) into whatever
// mpirun's output went to, a log file included. Where no pseudo-terminal can be made (a chroot
// without /dev/pts, as CI's fresh root), mpirun runs on a pipe and the lines are checked as well.
TEST(TrainRanks, TheSyntheticDataLineAndTheProgressArePrintedOnceAsPlainLines) {
  const fs::path d = scratch("ranks_synthetic");
  const fs::path cfg = write(d / "c.yaml", "model: samples/mlp/mlp.onnx\ndims: {batch: 2}\n"
                                           "pipeline: {stages: 2, schedule: 1f1b}\nsteps: 3\n");
  const std::string mpirun_line = std::string(PT_MPIRUN) + " --oversubscribe --allow-run-as-root -n 2 " +
                                  PT_BINARY + " train " + cfg.string() + " --set output.model=";
  Result r = run_command("script -qec '" + mpirun_line + "' /dev/null < /dev/null");
  if (r.code != 0 && (r.out + r.err).find("pseudo-terminal") != std::string::npos) r = run_command(mpirun_line);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto count = [&](const std::string& text) {
    size_t n = 0;
    for (size_t at = 0; (at = r.out.find(text, at)) != std::string::npos; ++at) ++n;
    return n;
  };
  EXPECT_EQ(count("synthetic samples"), 1u) << r.out;
  for (const char* step : {"\n[########................] step 1/3  loss", "\n[########################] step 3/3  loss"})
    EXPECT_EQ(count(step), 1u) << step << "\n" << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
}

TEST(TrainRanks, StagesMustSplitOverTheRanks) {
  const fs::path d = scratch("ranks_split");
  const Result r = mpirun(2, charlm(d, "--set steps=2 --set pipeline.stages=3 --set pipeline.schedule=1f1b"));
  EXPECT_NE(r.code, 0);
  // Every rank finds it; whichever aborts first may end the other before it prints.
  EXPECT_TRUE(std::regex_search(r.err, std::regex("error: rank [01] of 2: "))) << r.err;
  EXPECT_NE(r.err.find(" of 2: --set pipeline.stages: 3 stages do not split evenly over the ranks "
                       "(running on 2 processes); use a multiple of 2 stages, or start 3 processes or fewer that "
                       "divide it\n"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(d / "charlm.onnx"));
}

// Two checkpoints hold the same state: step, data position, what must match to resume, and every
// tensor's bytes by name (the files differ: across processes the tensors are in parts).
void expect_same_checkpoint(const fs::path& have, const fs::path& want) {
  const pt::Checkpoint a = pt::read_checkpoint(have.string()), b = pt::read_checkpoint(want.string());
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.data_position, b.data_position);
  EXPECT_EQ(a.meta, b.meta);
  std::map<std::string, std::vector<std::byte>> ta, tb;
  for (const auto& [name, t] : a.tensors) EXPECT_TRUE(ta.emplace(name, t.data).second) << "twice: " << name;
  for (const auto& [name, t] : b.tensors) tb.emplace(name, t.data);
  EXPECT_EQ(ta.size(), tb.size());
  for (const auto& [name, bytes] : tb) {
    ASSERT_TRUE(ta.count(name)) << have << " lacks " << name;
    EXPECT_EQ(ta.at(name), bytes) << name;
  }
}

// Each rank writes its part, then rank 0 the file naming them: the state one process's
// checkpoint holds; resumed on 2 ranks or in 1 process, the same model. A missing part is named.
TEST(TrainRanks, CheckpointsAndResumeGiveTheBytesOfOneProcess) {
  const fs::path one = scratch("ranks_ckpt_one"), two = scratch("ranks_ckpt_two");
  const auto with = [](const fs::path& d, const std::string& sets) {
    return charlm(d, "--set checkpoint.every=2 --set checkpoint.dir=" + (d / "ckpt").string() + " " + sets);
  };
  ASSERT_EQ(run(with(one, "--set steps=4")).code, 0);
  const Result first = mpirun(2, with(two, "--set steps=4"));
  ASSERT_EQ(first.code, 0) << first.err;
  for (const char* f : {"step_00000004.ckpt", "step_00000004.rank0.part", "step_00000004.rank1.part",
                        "step_00000002.ckpt", "step_00000002.rank0.part", "step_00000002.rank1.part"})
    EXPECT_TRUE(fs::exists(two / "ckpt" / f)) << f;
  expect_same_checkpoint(two / "ckpt" / "step_00000004.ckpt", one / "ckpt" / "step_00000004.ckpt");
  expect_same_checkpoint(two / "ckpt" / "step_00000002.ckpt", one / "ckpt" / "step_00000002.ckpt");
  // Copies of the 2-rank checkpoints: resumed in one process; resumed without a part.
  const fs::path three = scratch("ranks_ckpt_three"), lost = scratch("ranks_ckpt_lost");
  fs::copy(two / "ckpt", three / "ckpt");
  fs::copy(two / "ckpt", lost / "ckpt");
  fs::remove(lost / "ckpt" / "step_00000004.rank1.part");
  ASSERT_EQ(run(with(one, "--set steps=6 --resume")).code, 0);
  const Result resumed = mpirun(2, with(two, "--set steps=6 --resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from step 4"), std::string::npos) << resumed.out;
  EXPECT_EQ(model_bytes(two / "charlm.onnx"), model_bytes(one / "charlm.onnx"));
  expect_same_checkpoint(two / "ckpt" / "step_00000006.ckpt", one / "ckpt" / "step_00000006.ckpt");
  EXPECT_FALSE(fs::exists(two / "ckpt" / "step_00000002.rank0.part"));  // retention takes the parts too
  ASSERT_EQ(run(with(three, "--set steps=6 --resume")).code, 0);
  EXPECT_EQ(model_bytes(three / "charlm.onnx"), model_bytes(one / "charlm.onnx"));
  expect_one_line_error(run(with(lost, "--set steps=6 --resume")),
                        (lost / "ckpt" / "step_00000004.rank1.part").string() +
                            ": is missing: a part of checkpoint step_00000004.ckpt; give every rank a checkpoint.dir "
                            "all of them see (a shared file system), or resume from another checkpoint");
}

// Every rank SIGKILLed once a checkpoint is on disk, then resumed: the very bytes of a run that
// was never stopped.
TEST(TrainRanks, KilledAndResumedEndsOnTheBytesOfAnUninterruptedRun) {
  const fs::path whole = scratch("ranks_whole"), cut = scratch("ranks_cut");
  const auto with = [](const fs::path& d, const std::string& sets) {
    return charlm(d, "--set steps=8 --set checkpoint.every=2 --set checkpoint.dir=" + (d / "ckpt").string() + " " + sets);
  };
  ASSERT_EQ(mpirun(2, with(whole, "")).code, 0);
  const std::string marker = (cut / "charlm.onnx").string();
  run_command("(" + std::string(PT_MPIRUN) + " --oversubscribe --allow-run-as-root -n 2 " + PT_BINARY + " " +
              with(cut, "") + " & for i in $(seq 600); do [ -e " + (cut / "ckpt" / "latest").string() +
              " ] && break; sleep 0.05; done; pkill -9 -f '" + marker + "'; wait $!)");
  ASSERT_TRUE(fs::exists(cut / "ckpt" / "latest"));
  EXPECT_FALSE(fs::exists(cut / "charlm.onnx"));  // killed before the end
  const Result resumed = mpirun(2, with(cut, "--resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(model_bytes(cut / "charlm.onnx"), model_bytes(whole / "charlm.onnx"));
}

// (loss, grad_norm) per step of a metrics file.
std::vector<std::pair<double, double>> losses_and_norms(const fs::path& metrics) {
  std::vector<std::pair<double, double>> out;
  std::istringstream in(slurp(metrics));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("grad_norm")) out.push_back({j["loss"], j["grad_norm"]});
  }
  return out;
}

// parallel.data: D replicas of the pipeline, each its own micro-batches of the global batch, the
// gradients added over the replicas in replica order. Against one process training the same
// global batch (D x M micro-batches): the losses and gradient norms within 1e-6 and the training
// updates within 1e-6 (||dA - dB|| / ||dB||: the sums are grouped otherwise, so not the same
// bits); two runs and two schedules at D = 2: the same bytes.
TEST(TrainRanks, DataParallelReplicasTrainTheGlobalBatch) {
  const fs::path one = scratch("dp_one"), d2 = scratch("dp_d2"), d2b = scratch("dp_d2b");
  const std::string common = "--set steps=4 --set pipeline.stages=2 ";
  ASSERT_EQ(run(charlm(one, common + "--set pipeline.schedule=1f1b --set pipeline.micro_batches=16")).code, 0);
  const Result r = mpirun(4, charlm(d2, common + "--set pipeline.schedule=1f1b --set parallel.data=2"));
  ASSERT_EQ(r.code, 0) << r.err;
  const Result again = mpirun(4, charlm(d2b, common + "--set pipeline.schedule=zb-h1 --set parallel.data=2"));
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(model_bytes(d2b / "charlm.onnx"), model_bytes(d2 / "charlm.onnx"));
  const auto want = losses_and_norms(one / "metrics.jsonl"), have = losses_and_norms(d2 / "metrics.jsonl");
  ASSERT_EQ(have.size(), 4u);
  ASSERT_EQ(want.size(), have.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(have[i].first, want[i].first, 1e-6 * want[i].first) << "loss of step " << i + 1;
    EXPECT_NEAR(have[i].second, want[i].second, 1e-6 * want[i].second) << "gradient norm of step " << i + 1;
  }
  const Result updates = run_command(std::string(PT_PYTHON) + " bench/gpu_compare.py " + (d2 / "charlm.onnx").string() +
                                     " " + (one / "charlm.onnx").string() +
                                     " --update-from samples/charlm/charlm.onnx --tol 1e-6");
  EXPECT_EQ(updates.code, 0) << updates.out << updates.err;
}

// parallel.zero: 1 (ZeRO-1): each replica gets the replicas' sum of its run of the gradients
// (a reduce-scatter), keeps and steps the optimizer state of that run of the parameters (1/D of
// the bytes) and takes the others' updated values (an all-gather): the same bytes as D replicas
// without it, with about 1/D of the state per rank (AdamW, charlm: 1.84 MiB whole).
TEST(TrainRanks, ZeroOneShardsTheOptimizerAndKeepsTheBytes) {
  const fs::path z0 = scratch("zero0"), z1 = scratch("zero1"), one = scratch("zero_one");
  const std::string common = "--set steps=3 --set pipeline.stages=1 --set pipeline.schedule=1f1b --set parallel.data=2 ";
  ASSERT_EQ(mpirun(2, charlm(z0, common)).code, 0);
  const Result r = mpirun(2, charlm(z1, common + "--set parallel.zero=1"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(model_bytes(z1 / "charlm.onnx"), model_bytes(z0 / "charlm.onnx"));
  EXPECT_EQ(slurp(z1 / "charlm.safetensors"), slurp(z0 / "charlm.safetensors"));
  // 2 replicas of 2 stages on 4 ranks: each stage's shards reduced and gathered on its own.
  const fs::path p0 = scratch("zero0_p2"), p1 = scratch("zero1_p2");
  const std::string two = "--set steps=3 --set pipeline.stages=2 --set pipeline.schedule=1f1b --set parallel.data=2 ";
  ASSERT_EQ(mpirun(4, charlm(p0, two)).code, 0);
  ASSERT_EQ(mpirun(4, charlm(p1, two + "--set parallel.zero=1")).code, 0);
  EXPECT_EQ(model_bytes(p1 / "charlm.onnx"), model_bytes(p0 / "charlm.onnx"));
  // The state rank 0 holds, with ZeRO-1 against the whole: about half for AdamW's two moments.
  const auto held = [&](const std::string& sets) {
    const Result v = mpirun(2, "train samples/charlm/train.yaml --set steps=1 --set checkpoint.dir= "
                               "--set output.model= --set output.trace= --set output.timeline= --set output.metrics= " +
                                   common + sets);
    const size_t at = v.out.find("ZeRO-1: ");
    return at == std::string::npos ? std::string("none: ") + v.out + v.err : v.out.substr(at, v.out.find('\n', at) - at);
  };
  EXPECT_EQ(held("--set parallel.zero=1"),
            "ZeRO-1: each replica holds the optimizer state of 1/2 of the parameters: 940 KiB on rank 0");
}

// ZeRO-1 checkpoints: each replica writes its shard of the optimizer state; resumed with or
// without ZeRO-1, the bytes of the uninterrupted run (a constant learning rate: a run of 2 steps
// then takes the first 2 steps of a run of 4).
TEST(TrainRanks, ZeroOneCheckpointsResumeToTheSameBytes) {
  const fs::path whole = scratch("zero_whole"), cut = scratch("zero_cut"), plain = scratch("zero_plain");
  const std::string common =
      "--set pipeline.stages=1 --set pipeline.schedule=1f1b --set parallel.data=2 --set optimizer.schedule=constant ";
  const auto with = [&](const fs::path& d, const std::string& sets) {
    return charlm(d, common + "--set checkpoint.every=2 --set checkpoint.dir=" + (d / "ckpt").string() + " " + sets);
  };
  ASSERT_EQ(mpirun(2, with(whole, "--set steps=4")).code, 0);
  const Result first = mpirun(2, with(cut, "--set steps=2 --set parallel.zero=1"));
  ASSERT_EQ(first.code, 0) << first.err;
  // Both replicas wrote a part: their shards of the one device's state.
  const pt::Checkpoint r0 = pt::read_checkpoint((cut / "ckpt" / "step_00000002.rank0.part").string());
  const pt::Checkpoint r1 = pt::read_checkpoint((cut / "ckpt" / "step_00000002.rank1.part").string());
  const auto optimizer_tensors = [](const pt::Checkpoint& c) {
    return std::count_if(c.tensors.begin(), c.tensors.end(), [](const auto& t) { return t.first.rfind("optimizer/", 0) == 0; });
  };
  EXPECT_GT(optimizer_tensors(r0), 0);
  EXPECT_GT(optimizer_tensors(r1), 0);
  expect_same_checkpoint(cut / "ckpt" / "step_00000002.ckpt", whole / "ckpt" / "step_00000002.ckpt");
  fs::copy(cut / "ckpt", plain / "ckpt");
  const Result resumed = mpirun(2, with(cut, "--set steps=4 --set parallel.zero=1 --resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(model_bytes(cut / "charlm.onnx"), model_bytes(whole / "charlm.onnx"));
  const Result unsharded = mpirun(2, with(plain, "--set steps=4 --resume"));
  ASSERT_EQ(unsharded.code, 0) << unsharded.err;
  EXPECT_EQ(model_bytes(plain / "charlm.onnx"), model_bytes(whole / "charlm.onnx"));
}

// A ResNet with BatchNormalization (samples/exports/resnet_legacy.onnx: 6 of them, two residual
// adds), or another BatchNorm `model`, on synthetic 16x16 images, 2 a micro-batch and 4
// micro-batches a step, a quarter held out; AdamW at a constant rate (a run cut short and resumed
// takes the steps of a longer one); every output under `dir` (trained.onnx, trained.safetensors,
// metrics.jsonl), `sets` appended.
std::string resnet(const fs::path& dir, const std::string& sets,
                   const std::string& model = "samples/exports/resnet_legacy.onnx") {
  const fs::path cfg = write(dir / "bn.yaml", "model: " + model + "\n"
                                              "dims: {batch: 2}\n"
                                              "data: {kind: synthetic, samples: 64, eval_fraction: 0.25}\n"
                                              "optimizer: {kind: adamw, lr: 1.0e-2}\n"
                                              "pipeline: {stages: 2, micro_batches: 4, schedule: 1f1b}\n"
                                              "steps: 3\n"
                                              "eval_every: 2\n");
  return "train " + cfg.string() + " -q --set output.model=" + (dir / "trained.onnx").string() +
         " --set output.metrics=" + (dir / "metrics.jsonl").string() + " " + sets;
}

// The BatchNorm running statistics (model/*.running_mean, model/*.running_var) of a checkpoint.
std::map<std::string, std::vector<std::byte>> running_statistics(const fs::path& checkpoint) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [name, t] : pt::read_checkpoint(checkpoint.string()).tensors)
    if (name.find(".running_") != std::string::npos) out[name] = t.data;
  return out;
}

// BatchNorm across ranks: a BatchNorm's running statistics live on the rank whose stage computes
// them, are updated there, read there by its chunk of the evaluation (after steps 2 and 3) and
// sent to rank 0's writer for the outputs: the trained model, its weights, every loss and held-out
// loss are the bytes of one process, on 2 and 4 ranks, under 1f1b and zb-v (its V puts the first
// and last chunks on rank 0).
TEST(TrainRanks, BatchNormTrainsAcrossRanksToTheBytesOfOneProcess) {
  for (const int ranks : {2, 4})
    for (const char* kind : {"1f1b", "zb-v"}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, " + kind);
      const std::string sets = "--set pipeline.stages=" + std::to_string(ranks) + " --set pipeline.schedule=" + kind;
      const fs::path one = scratch("bn_one"), many = scratch("bn_many");
      const Result alone = run(resnet(one, sets));
      ASSERT_EQ(alone.code, 0) << alone.err;
      const Result r = mpirun(ranks, resnet(many, sets));
      ASSERT_EQ(r.code, 0) << r.err;
      expect_same_run(one, many, "trained");
      EXPECT_NE(slurp(one / "metrics.jsonl").find("\"eval_loss\""), std::string::npos);
    }
}

// Replicas (parallel.data): every replica's running statistics take the batch statistics of every
// micro-batch of the global batch in order (gathered over the replicas, train/trainer_batch_norm.cc),
// as one process training that global batch does: after step 1 the very bytes of its running
// statistics (both from the same parameters), after step 2 its training updates within 1e-6 (the
// gradient sums are grouped by replica: not the same bits). Bit-identical across schedules, with
// ZeRO-1, and cut after step 1 and resumed (with ZeRO-1) against the run never stopped.
TEST(TrainRanks, BatchNormReplicasAverageTheGlobalBatch) {
  const std::string dp = "--set steps=2 --set pipeline.stages=2 --set parallel.data=2 ";
  const auto with_checkpoints = [](const fs::path& d, const std::string& sets) {
    return resnet(d, "--set checkpoint.every=1 --set checkpoint.dir=" + (d / "ckpt").string() + " " + sets);
  };
  const fs::path one = scratch("bn_dp_one"), d2 = scratch("bn_dp"), zbv = scratch("bn_dp_zbv"), cut = scratch("bn_dp_cut");
  ASSERT_EQ(run(with_checkpoints(one, "--set steps=2 --set pipeline.micro_batches=8")).code, 0);
  const Result r = mpirun(4, with_checkpoints(d2, dp + "--set pipeline.schedule=1f1b"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto want = running_statistics(one / "ckpt" / "step_00000001.ckpt");
  const auto have = running_statistics(d2 / "ckpt" / "step_00000001.ckpt");
  EXPECT_EQ(want.size(), 12u);
  ASSERT_EQ(have.size(), want.size());
  for (const auto& [name, bytes] : want) EXPECT_TRUE(have.count(name) && have.at(name) == bytes) << name;
  const Result updates = run_command(std::string(PT_PYTHON) + " bench/gpu_compare.py " + (d2 / "trained.onnx").string() +
                                     " " + (one / "trained.onnx").string() +
                                     " --update-from samples/exports/resnet_legacy.onnx --tol 1e-6");
  EXPECT_EQ(updates.code, 0) << updates.out << updates.err;
  ASSERT_EQ(mpirun(4, resnet(zbv, dp + "--set pipeline.schedule=zb-v")).code, 0);
  EXPECT_EQ(model_bytes(zbv / "trained.onnx"), model_bytes(d2 / "trained.onnx"));
  EXPECT_EQ(slurp(zbv / "trained.safetensors"), slurp(d2 / "trained.safetensors"));
  ASSERT_EQ(mpirun(4, with_checkpoints(cut, dp + "--set steps=1 --set parallel.zero=1")).code, 0);
  const Result resumed = mpirun(4, with_checkpoints(cut, dp + "--set parallel.zero=1 --resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(model_bytes(cut / "trained.onnx"), model_bytes(d2 / "trained.onnx"));
  EXPECT_EQ(slurp(cut / "trained.safetensors"), slurp(d2 / "trained.safetensors"));
}

// num_batches_tracked (samples/export_model/convbn.onnx carries the record that names it) counts
// the forwards the running statistics took: with 2 replicas of 4 micro-batches, 8 a step, as one
// process training that global batch writes beside the same bytes of the running statistics.
TEST(TrainRanks, BatchNormReplicasCountEveryForwardOfTheGlobalBatch) {
  const std::string convbn = "samples/export_model/convbn.onnx";
  const fs::path one = scratch("bn_count_one"), d2 = scratch("bn_count_d2");
  ASSERT_EQ(run(resnet(one, "--set steps=1 --set pipeline.stages=1 --set pipeline.micro_batches=8", convbn)).code, 0);
  const Result r = mpirun(2, resnet(d2, "--set steps=1 --set pipeline.stages=1 --set parallel.data=2", convbn));
  ASSERT_EQ(r.code, 0) << r.err;
  const pt::test::StFile want = pt::test::read_safetensors_for_test((one / "trained.safetensors").string());
  const pt::test::StFile have = pt::test::read_safetensors_for_test((d2 / "trained.safetensors").string());
  for (const char* bn : {"bn1", "bn2"}) {
    const std::string n = std::string(bn) + ".num_batches_tracked";
    ASSERT_TRUE(want.tensors.count(n) && have.tensors.count(n)) << n;
    EXPECT_EQ(have.values<int64_t>(n), std::vector<int64_t>{8}) << n;
    for (const std::string& buffer : {n, std::string(bn) + ".running_mean", std::string(bn) + ".running_var"})
      EXPECT_TRUE(have.tensors.at(buffer).bytes == want.tensors.at(buffer).bytes) << buffer;
  }
}

// Checkpoints with BatchNorm across ranks: the rank of each BatchNorm's stage writes its running
// statistics into its part, and the checkpoint holds one process's state; cut after step 2 and
// resumed on the ranks, the bytes of the uninterrupted run.
TEST(TrainRanks, BatchNormCheckpointsResumeToTheBytesOfOneProcess) {
  const auto with = [](const fs::path& d, const std::string& sets) {
    return resnet(d, "--set pipeline.schedule=zb-v --set checkpoint.every=2 --set checkpoint.dir=" +
                         (d / "ckpt").string() + " " + sets);
  };
  const fs::path whole = scratch("bn_ckpt_whole"), cut = scratch("bn_ckpt_cut");
  ASSERT_EQ(run(with(whole, "--set steps=4")).code, 0);
  const Result first = mpirun(2, with(cut, "--set steps=2"));
  ASSERT_EQ(first.code, 0) << first.err;
  expect_same_checkpoint(cut / "ckpt" / "step_00000002.ckpt", whole / "ckpt" / "step_00000002.ckpt");
  // zb-v on 2 ranks: rank 1 holds the middle chunks, so some running statistics are in its part.
  EXPECT_FALSE(running_statistics(cut / "ckpt" / "step_00000002.rank1.part").empty());
  EXPECT_FALSE(running_statistics(cut / "ckpt" / "step_00000002.rank0.part").empty());
  const Result resumed = mpirun(2, with(cut, "--set steps=4 --resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  expect_same_checkpoint(cut / "ckpt" / "step_00000004.ckpt", whole / "ckpt" / "step_00000004.ckpt");
  ASSERT_TRUE(fs::exists(whole / "trained.onnx") && fs::exists(whole / "trained.safetensors"));
  EXPECT_EQ(model_bytes(cut / "trained.onnx"), model_bytes(whole / "trained.onnx"));
  EXPECT_EQ(slurp(cut / "trained.safetensors"), slurp(whole / "trained.safetensors"));
}

// The Chrome trace of a run across processes (rank 0 writes it): every device's track names its
// rank, sends and receives between ranks are "comm" spans; with replicas, every replica's
// devices have tracks, and each rank's collectives across them are spans on a track of its own.
TEST(TrainRanks, TheTraceNamesRanksAndShowsCommunication) {
  const fs::path d = scratch("ranks_trace");
  const auto trace = [&](const std::string& sets) {
    const fs::path file = d / "trace.json";
    const Result r = mpirun(2, "train samples/charlm/train.yaml -q --set steps=2 --set checkpoint.dir= --set output.model= "
                               "--set output.timeline= --set output.metrics= --set pipeline.schedule=1f1b "
                               "--set output.trace=" + file.string() + " " + sets);
    EXPECT_EQ(r.code, 0) << r.err;
    std::map<int, std::string> tracks;
    std::multimap<int, std::pair<std::string, std::string>> spans;  // tid -> (name, cat)
    const nlohmann::json parsed = nlohmann::json::parse(slurp(file));
    for (const auto& e : parsed["traceEvents"]) {
      if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"].get<int>()] = e["args"]["name"];
      if (e["ph"] == "X") {
        spans.emplace(e["tid"].get<int>(), std::make_pair(e["name"].get<std::string>(), e["cat"].get<std::string>()));
        EXPECT_GE(e["dur"].get<double>(), 0.0);
      }
    }
    return std::make_pair(tracks, spans);
  };
  const auto [pipeline_tracks, pipeline_spans] = trace("--set pipeline.stages=2");
  EXPECT_EQ(pipeline_tracks, (std::map<int, std::string>{{0, "device 0 (rank 0)"}, {1, "device 1 (rank 1)"}}));
  const auto comm = [](const auto& spans, int tid, const std::string& name) {
    for (auto [it, end] = spans.equal_range(tid); it != end; ++it)
      if (it->second.first.find(name) != std::string::npos && it->second.second == "comm") return true;
    return false;
  };
  EXPECT_TRUE(comm(pipeline_spans, 0, "SF")) << "device 0 sends activations to rank 1 (SEND_F)";
  EXPECT_TRUE(comm(pipeline_spans, 1, "RF")) << "device 1 receives them (RECV_F)";
  const auto [replica_tracks, replica_spans] =
      trace("--set pipeline.stages=1 --set parallel.data=2 --set parallel.zero=1");
  EXPECT_EQ(replica_tracks, (std::map<int, std::string>{{0, "device 0 of replica 0 (rank 0)"},
                                                        {1, "device 0 of replica 1 (rank 1)"},
                                                        {1000, "rank 0: across replicas"},
                                                        {1001, "rank 1: across replicas"}}));
  for (int tid : {0, 1}) EXPECT_GT(replica_spans.count(tid), 0u) << "replica " << tid << "'s actions";
  for (int tid : {1000, 1001}) {
    EXPECT_TRUE(comm(replica_spans, tid, "gradients: sum over replicas")) << tid;
    EXPECT_TRUE(comm(replica_spans, tid, "ZeRO-1: parameters from the other replicas")) << tid;
  }
}

TEST(TrainRanks, ReplicasMustDivideTheProcesses) {
  const fs::path d = scratch("dp_bad");
  expect_one_line_error(run(charlm(d, "--set steps=2 --set parallel.data=2")),
                        "--set parallel.data: 2 replicas do not split 1 process(es); start them with mpirun -n 2 "
                        "(or a multiple)");
  const Result r = mpirun(3, charlm(d, "--set steps=2 --set parallel.data=2"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(" of 3: --set parallel.data: 2 replicas do not split 3 process(es); start a multiple of 2 "
                       "processes\n"),
            std::string::npos)
      << r.err;
}

// An error is one line, written by the rank that met it; the other ranks end without a word
// (mpirun -q leaves out mpirun's own box). Every rank meets a bad --set: one of them writes it.
TEST(TrainRanks, AnErrorIsOneLineFromTheRankThatMetIt) {
  const fs::path d = scratch("ranks_error_once");
  const std::string bad = "--set pipeline.stages=nonsense";
  const std::string what = ": --set pipeline.stages: expected a whole number, got 'nonsense'; give a whole number\n";
  const auto errors = [](const std::string& err) {
    size_t n = 0;
    for (size_t at = 0; (at = err.find("error:", at)) != std::string::npos; ++at) ++n;
    return n;
  };
  for (int n : {2, 4}) {
    const Result r = mpirun(n, charlm(d, bad), "-q");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(errors(r.err), 1u) << r.err;
    // The lowest of the ranks that fail at once; on a loaded machine one may fail well before the others.
    EXPECT_TRUE(std::regex_search(r.err, std::regex("error: rank [0-9] of " + std::to_string(n) + ": --set pipeline"
                                                    "\\.stages: expected a whole number, got 'nonsense'; give a "
                                                    "whole number\n")))
        << r.err;
    EXPECT_EQ(r.err.find("mpirun"), std::string::npos) << r.err;
  }
  // Rank 1 alone meets it (its own command line); rank 0 goes on into set-up and is stopped.
  const std::string ok = std::string(PT_BINARY) + " " + charlm(d, "--set steps=2");
  const Result r = run_command(std::string(PT_MPIRUN) + " --oversubscribe --allow-run-as-root -q -n 1 " + ok +
                               " : -n 1 " + ok + " " + bad);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(errors(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("error: rank 1 of 2" + what), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(d / "charlm.onnx"));
}

// A Ctrl-C at mpirun (which stops every rank with SIGTERM, then SIGKILL) is an interruption:
// one line from rank 0 with the last step every rank completed and how to go on. The SIGINT goes
// to mpirun itself, as a terminal sends it: `timeout` would pass it on to its whole process
// group, and a second SIGINT makes mpirun exit at once, leaving its ranks running.
TEST(TrainRanks, ACtrlCAtMpirunReadsAsTheInterruption) {
  const fs::path d = scratch("ranks_ctrl_c");
  const std::string metrics = (d / "metrics.jsonl").string();
  const Result r = run_command(
      "(rm -f " + metrics + "; timeout 300 " + std::string(PT_MPIRUN) + " --oversubscribe --allow-run-as-root -q -n 2 " +
      PT_BINARY + " " + charlm(d, "--set steps=100000 --set checkpoint.every=5 --set checkpoint.dir=" +
                                      (d / "ckpt").string()) +
      " & for i in $(seq 600); do [ -s " + metrics + " ] && break; sleep 0.2; done; kill -INT $(pgrep -P $!); wait $!)");
  EXPECT_NE(r.code, 0);
  const std::regex line("(^|\n)interrupted: mpirun stopped every rank after step [0-9]+, the last every rank "
                        "completed \\([^)]*\\); continue from the last checkpoint in " + (d / "ckpt").string() +
                        " with --resume\n");
  EXPECT_TRUE(std::regex_search(r.err, line)) << r.err;
  EXPECT_EQ(r.err.find("error"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("interrupted"), r.err.rfind("interrupted")) << r.err;
}

// GPT-2 as today's PyTorch exports it (samples/exports/gpt2.onnx: 2 layers, d 32, its LM head
// reads the token embedding, a tie), 3 AdamW steps of 4 micro-batches of 2 on synthetic tokens;
// every output under `dir`, `sets` appended.
std::string tied_gpt(const fs::path& dir, const std::string& sets) {
  const fs::path cfg = write(dir / "gpt2.yaml",
                             "model: samples/exports/gpt2.onnx\ndims: {batch: 2}\nloss: {kind: cross_entropy}\n"
                             "data: {kind: synthetic, samples: 64, shuffle: false}\n"
                             "optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01, clip_grad_norm: 1.0, schedule: constant}\n"
                             "pipeline: {stages: 2, micro_batches: 4, schedule: 1f1b}\nsteps: 3\n"
                             "checkpoint: {dir: \"\", every: 0}\noutput: {trace: \"\", timeline: \"\"}\n");
  return "train " + cfg.string() + " -q --set output.model=" + (dir / "gpt2.onnx").string() +
         " --set output.metrics=" + (dir / "metrics.jsonl").string() + " " + sets;
}

// A tied embedding and LM head on the first and last stage, so on two ranks (train/ties.h): each
// holds the weight, the two sites' gradients are exchanged and summed in one process's order,
// and each steps the same update. The bytes of one process, at 2 and 4 ranks under 1f1b and zb-v
// (there both ends of the V are on device 0), with the final evaluation.
TEST(TrainRanks, ATiedEmbeddingAcrossRanksGivesTheBytesOfOneProcess) {
  for (const auto& [ranks, sets] : std::vector<std::pair<int, std::string>>{
           {2, "--set eval_every=3"},
           {4, "--set pipeline.stages=4 --set eval_every=2"},
           {2, "--set pipeline.schedule=zb-v --set pipeline.chunks=2"},
           {4, "--set pipeline.stages=4 --set pipeline.schedule=zb-v --set pipeline.chunks=2"}}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks " + sets);
    const fs::path one = scratch("tied_one"), many = scratch("tied_many");
    ASSERT_EQ(run(tied_gpt(one, sets)).code, 0);
    const Result r = mpirun(ranks, tied_gpt(many, sets));
    ASSERT_EQ(r.code, 0) << r.err;
    expect_same_run(one, many, "gpt2");
  }
}

// Its checkpoints: the tied weight and its optimizer state once (the owner, the first stage's
// rank, writes them), the state of one process's checkpoint; resumed on 2 ranks (every holder
// reads them back) or in one process, the bytes of the uninterrupted run.
TEST(TrainRanks, ATiedEmbeddingAcrossRanksCheckpointsAndResumes) {
  const fs::path one = scratch("tied_ckpt_one"), two = scratch("tied_ckpt_two"), whole = scratch("tied_ckpt_whole");
  const auto with = [](const fs::path& d, const std::string& sets) {
    return tied_gpt(d, "--set checkpoint.every=2 --set checkpoint.dir=" + (d / "ckpt").string() + " " + sets);
  };
  ASSERT_EQ(run(with(one, "--set steps=2")).code, 0);
  const Result first = mpirun(2, with(two, "--set steps=2"));
  ASSERT_EQ(first.code, 0) << first.err;
  expect_same_checkpoint(two / "ckpt" / "step_00000002.ckpt", one / "ckpt" / "step_00000002.ckpt");
  ASSERT_EQ(run(with(whole, "--set steps=4")).code, 0);
  const Result resumed = mpirun(2, with(two, "--set steps=4 --resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from step 2"), std::string::npos) << resumed.out;
  EXPECT_TRUE(fs::exists(whole / "gpt2.onnx.data"));  // the source keeps its weights in external data
  EXPECT_EQ(model_bytes(two / "gpt2.onnx"), model_bytes(whole / "gpt2.onnx"));
  ASSERT_EQ(run(with(one, "--set steps=4 --resume")).code, 0);
  EXPECT_EQ(model_bytes(one / "gpt2.onnx"), model_bytes(whole / "gpt2.onnx"));
}

// With replicas (2 x 2 stages on 4 ranks), with ZeRO-1 too (the tied weight's state sharded on
// each holder's device, checkpointed at step 2 and resumed): the bytes of 2 replicas of one
// stage each, where the tie stays on one rank.
TEST(TrainRanks, ATiedEmbeddingAcrossRanksWithReplicasAndZeroOne) {
  const fs::path flat = scratch("tied_dp_flat"), dp = scratch("tied_dp"), zero = scratch("tied_dp_zero");
  const std::string common = "--set parallel.data=2 ";
  ASSERT_EQ(mpirun(2, tied_gpt(flat, common + "--set steps=4 --set pipeline.stages=1")).code, 0);
  const Result r = mpirun(4, tied_gpt(dp, common + "--set steps=4"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(model_bytes(dp / "gpt2.onnx"), model_bytes(flat / "gpt2.onnx"));
  EXPECT_EQ(slurp(dp / "gpt2.safetensors"), slurp(flat / "gpt2.safetensors"));
  const std::string ckpt = "--set parallel.zero=1 --set checkpoint.every=2 --set checkpoint.dir=" + (zero / "ckpt").string();
  const Result cut = mpirun(4, tied_gpt(zero, common + ckpt + " --set steps=2"));
  ASSERT_EQ(cut.code, 0) << cut.err;
  const Result resumed = mpirun(4, tied_gpt(zero, common + ckpt + " --set steps=4 --resume"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(model_bytes(zero / "gpt2.onnx"), model_bytes(flat / "gpt2.onnx"));
}

// A rank killed mid-run: mpirun ends the others; the survivor names the lost rank and the last step every
// rank completed; nothing hangs.
TEST(TrainRanks, ALostRankEndsTheJob) {
  const fs::path d = scratch("ranks_kill");
  // In the command lines of both ranks, which start with the binary (mpirun's starts with
  // mpirun): the newest of them is the last rank started.
  const std::string marker = (d / "marker.onnx").string();
  // The kill waits until a step is done (rank 0's first metrics line: a loaded machine starts
  // the ranks late); `timeout` bounds the whole job, so a kill that misses fails the test, never
  // hangs it. The job must end within 120 s of the kill, however long the set-up took: the
  // shell prints the milliseconds from the kill to the job's end.
  const std::string find = "pgrep -f '^" + std::string(PT_BINARY) + " train .*" + marker + "' | tail -1";
  const std::string metrics = (d / "metrics.jsonl").string();
  const Result r = run_command(
      "(rm -f " + metrics + "; timeout 300 " + std::string(PT_MPIRUN) + " --oversubscribe --allow-run-as-root -n 2 " +
      PT_BINARY + " " + charlm(d, "--set steps=100000 --set output.model=" + marker) +
      " & for i in $(seq 600); do [ -s " + metrics + " ] && break; sleep 0.2; done; " + find +
      " | xargs -r kill -9; k=$(date +%s%N); wait $!; rc=$?; "
      "echo ended_after_kill_ms=$(( ($(date +%s%N) - k) / 1000000 )); exit $rc)");
  EXPECT_NE(r.code, 0);
  std::smatch ended;
  ASSERT_TRUE(std::regex_search(r.out, ended, std::regex("ended_after_kill_ms=([0-9]+)"))) << r.out;
  EXPECT_LT(std::stol(ended[1].str()), 120000) << r.out;
  EXPECT_NE(r.err.find("exited on signal 9"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("process rank 1"), std::string::npos) << r.err;
  // The survivor's own line: the lost rank and the last step every rank completed.
  const std::regex line("error: rank 1 of 2 was lost \\(its process is gone\\) after step [0-9]+, the last every "
                        "rank completed; every rank stops");
  EXPECT_TRUE(std::regex_search(r.err, line)) << r.err;
}

// Issue 42: a step that is not finite is hunted on the ranks as the pipeline cuts it, each its
// own chunks (no rank takes the whole model); the line names the node one process names, once.
TEST(TrainRanks, ANonFiniteStepNamesTheNodeOneProcessNames) {
  const fs::path d = scratch("ranks_nonfinite");
  const std::string args = charlm(d, "--set optimizer.kind=sgd --set optimizer.lr=1.0e+30 --set optimizer.warmup_steps=0 "
                                     "--set optimizer.schedule=constant --set steps=3");
  const Result one = run(args);
  ASSERT_EQ(one.code, 2) << one.err;
  ASSERT_EQ(one.err.rfind("error: step 2: ", 0), 0u) << one.err;
  ASSERT_NE(one.err.find("; the first "), std::string::npos) << one.err;
  for (int ranks : {2, 4}) {
    const Result r = mpirun(ranks, args);
    EXPECT_NE(r.code, 0);
    const std::regex line("error: rank [0-9] of " + std::to_string(ranks) + ": (.*\n)");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m, line)) << r.err;
    EXPECT_EQ(m[1].str(), one.err.substr(7)) << r.err;
    EXPECT_EQ(r.err.find("error:", m.position(0) + 1), std::string::npos) << "said twice: " << r.err;
  }
}

// Issue 42: the ranks of one host need their memory together; short of it, rank 0 alone says so
// (one line, with both figures) and the job stops before loading. A run's summary gives each
// rank's peak RSS beside its planned host memory.
TEST(TrainRanks, TheRanksOfAHostAreCheckedTogetherAndEachReportsItsPeak) {
  const fs::path d = scratch("ranks_memory");
  const Result refused = run_command("PT_MEMAVAILABLE=400MiB " + std::string(PT_MPIRUN) +
                                     " --oversubscribe --allow-run-as-root -x PT_MEMAVAILABLE -n 2 " + PT_BINARY + " " +
                                     charlm(d, "--set steps=2"));
  EXPECT_NE(refused.code, 0);
  const std::regex line("error: rank 0 of 2: host memory: ranks 0, 1 on this host need [0-9.]+ MiB \\(parameters [^)]*, "
                        "300 MiB per process\\), more than the 400 MiB it has available \\(PT_MEMAVAILABLE\\); [^\n]*"
                        "--set memory.check=off runs it anyway\n");
  EXPECT_TRUE(std::regex_search(refused.err, line)) << refused.err;
  EXPECT_EQ(refused.err.find("error: rank 1 of 2: host memory"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(d / "charlm.onnx"));

  const Result r = mpirun(2, charlm(d, "--set steps=2"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::regex peaks("\n  rank 0: [0-9.]+ MiB / [0-9.]+ MiB \\([0-9.]+x\\)\n  rank 1: [0-9.]+ MiB / [0-9.]+ MiB \\([0-9.]+x\\)\n");
  EXPECT_TRUE(std::regex_search(r.out, peaks)) << r.out;
}

}  // namespace
