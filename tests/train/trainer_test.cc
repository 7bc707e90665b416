// The Trainer (train/trainer.h) in-process: built on samples/mlp from the library calls alone
// (import, training form, plan/pipeline.h, the Trainer), it learns; its losses are those
// `pipetrain train` writes for the same config, bit for bit; every schedule trains the same bits;
// a resumed run ends where an uninterrupted one does; a stop ends the loop at a step boundary.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/cli/run_cli.h"
#include "tests/train/trainer_plan.h"
#include "train/trainer.h"

namespace pt {
namespace {

constexpr const char* kModel = "samples/mlp/mlp.onnx";

struct MlpRun {
  int stages = 2;
  std::string schedule = "1f1b";
  int micro_batches = 4;
  int64_t steps = 8;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
};

// The chain `train` runs (cli/train_plan.h), on the mlp with batch 4 and synthetic data.
TrainerPlan mlp_plan(const MlpRun& s) {
  PipelineConfig c;
  c.stages = s.stages;
  c.micro_batches = s.micro_batches;
  c.schedule = s.schedule;
  return testing::trainer_plan(kModel, 4, LossSpec{}, c);
}

TrainerOptions mlp_options(const MlpRun& s) {
  TrainerOptions o;
  o.model_file = kModel;
  o.steps = s.steps;
  o.optimizer.kind = OptimizerConfig::Kind::kAdamW;
  o.optimizer.lr = 3e-3;
  o.optimizer.total_steps = s.steps;
  o.optimizer_kind = "adamw";
  o.data.samples = 64;
  o.checkpoint_dir = s.checkpoint_dir;
  o.checkpoint_every = s.checkpoint_every;
  return o;
}

struct Losses : TrainObserver {
  std::vector<double> loss;
  void step(const StepRecord& r) override { loss.push_back(r.loss); }
};

// The trained parameters' bytes, by name.
std::map<std::string, std::vector<std::byte>> trained_bytes(const Trainer& t) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [name, tensor] : t.trained_tensors()) out[name] = tensor->data;
  return out;
}

TEST(Trainer, LossFalls) {
  const MlpRun s;
  TrainRanks ranks;
  Trainer t(mlp_plan(s), mlp_options(s), ranks);
  Losses seen;
  EXPECT_EQ(t.run(seen), 0);
  ASSERT_EQ(seen.loss.size(), 8u);
  EXPECT_LT(seen.loss.back(), seen.loss.front());
  EXPECT_EQ(t.steps_done(), 8);
}

// The same config through the binary: the metrics' losses are the Trainer's, bit for bit.
TEST(Trainer, EqualsTheCommandLine) {
  const MlpRun s;
  TrainRanks ranks;
  Trainer t(mlp_plan(s), mlp_options(s), ranks);
  Losses seen;
  t.run(seen);

  const fs::path d = scratch("trainer_cli");
  std::ofstream(d / "c.yaml") << "model: " << kModel << "\ndims: {batch: 4}\ndata: {kind: synthetic, samples: 64}\n"
                              << "optimizer: {kind: adamw, lr: 3.0e-3}\n"
                              << "pipeline: {stages: 2, micro_batches: 4, schedule: 1f1b}\nsteps: 8\n"
                              << "output: {metrics: " << (d / "metrics.jsonl").string() << "}\n";
  const Result r = run("train -q " + (d / "c.yaml").string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<double> cli;
  std::ifstream in(d / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) cli.push_back(j["loss"].get<double>());
  }
  EXPECT_EQ(cli, seen.loss);
}

// Determinism (shared/DESIGN.md): one stage, and two under 1F1B and ZB-H1, train the same bits.
TEST(Trainer, EverySchedule) {
  std::map<std::string, std::vector<std::byte>> first;
  for (const auto& [stages, kind] : std::vector<std::pair<int, std::string>>{{1, "1f1b"}, {2, "1f1b"}, {2, "zb-h1"}}) {
    MlpRun s;
    s.stages = stages;
    s.schedule = kind;
    s.steps = 3;
    TrainRanks ranks;
    Trainer t(mlp_plan(s), mlp_options(s), ranks);
    Losses seen;
    t.run(seen);
    t.finish();
    if (first.empty()) first = trained_bytes(t);
    else EXPECT_TRUE(trained_bytes(t) == first) << stages << " stages, " << kind;
  }
}

// Six steps in one go, and three, a checkpoint, and three more from it: the same parameters.
TEST(Trainer, ResumesWhereItStopped) {
  const fs::path d = scratch("trainer_resume");
  MlpRun whole;
  whole.steps = 6;
  TrainRanks ranks;
  Trainer a(mlp_plan(whole), mlp_options(whole), ranks);
  Losses ignored;
  a.run(ignored);

  MlpRun first = whole;
  first.checkpoint_dir = d.string();
  first.checkpoint_every = 3;
  {
    TrainerOptions o = mlp_options(first);
    o.steps = 3;
    o.optimizer.total_steps = 6;  // the same learning-rate schedule as the whole run
    Trainer b(mlp_plan(first), o, ranks);
    b.run(ignored);
  }
  Trainer c(mlp_plan(first), mlp_options(first), ranks);
  ASSERT_EQ(c.resume(), std::optional<int64_t>(3));
  c.run(ignored);
  EXPECT_TRUE(trained_bytes(c) == trained_bytes(a));
}

// A signal seen at a step boundary ends the loop there; the completed count follows every step.
TEST(Trainer, StopsAtAStepBoundary) {
  const MlpRun s;
  TrainRanks ranks;
  Trainer t(mlp_plan(s), mlp_options(s), ranks);
  Losses seen;
  int64_t completed = -1;
  const int signal = t.run(seen, {[&] { return completed >= 2 ? 15 : 0; }, [&](int64_t n) { completed = n; }});
  EXPECT_EQ(signal, 15);
  EXPECT_EQ(t.steps_done(), 3);  // raised once two steps were complete, read at the next boundary
  EXPECT_EQ(completed, 3);
  EXPECT_EQ(seen.loss.size(), 3u);
}

}  // namespace
}  // namespace pt
