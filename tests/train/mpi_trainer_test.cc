// The Trainer across processes (train/trainer.h), run by ctest under mpirun on 2 ranks, one stage
// each, on a model whose every float initializer is external data (samples/synthetic/tiny_ext):
// nothing gathers the whole model (issue 42). Evaluating every step, each rank runs its own chunks
// and rank 0 (as every rank) takes no other rank's parameter; writing the outputs, rank 0 holds
// one other rank's tensor at a time, the one the writer asked for last (Trainer::
// foreign_tensor_bytes, the bytes of other ranks' tensors a process has read or received, as
// tests/train/resident_params_test.cc counts the bytes read from the file).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "tests/train/trainer_plan.h"
#include "train/trainer.h"

namespace pt {
namespace {

TrainRanks* ranks = nullptr;
constexpr const char* kModel = "samples/synthetic/tiny_ext.onnx";

// tiny_ext at batch 2, MSE, a stage per rank.
TrainerPlan tiny_plan() {
  LossSpec mse;
  mse.kind = LossSpec::Kind::kMse;
  PipelineConfig c;
  c.stages = ranks->size();
  c.micro_batches = 2;
  c.schedule = "1f1b";
  return testing::trainer_plan(kModel, 2, mse, c);
}

TrainerOptions tiny_options() {
  TrainerOptions o;
  o.model_file = kModel;
  o.steps = 2;
  o.eval_every = 1;
  o.optimizer.kind = OptimizerConfig::Kind::kAdamW;
  o.optimizer.lr = 1e-3;
  o.optimizer.total_steps = o.steps;
  o.optimizer_kind = "adamw";
  o.data.samples = 16;
  o.data.eval_fraction = 0.25;
  return o;
}

struct Evaluations : TrainObserver {
  const Trainer* trainer = nullptr;
  std::vector<double> losses;
  std::vector<int64_t> foreign;  // rank 0's other ranks' bytes at each evaluation
  void evaluated(int64_t, const EvalResult& r, bool) override {
    losses.push_back(r.loss);
    foreign.push_back(trainer->foreign_tensor_bytes());
  }
};

TEST(MpiTrainer, RankZeroHoldsNoOtherRanksParametersWhileEvaluatingOrWriting) {
  ASSERT_GE(ranks->size(), 2);
  Trainer t(tiny_plan(), tiny_options(), *ranks);
  Evaluations seen;
  seen.trainer = &t;
  ASSERT_EQ(t.run(seen), 0);
  EXPECT_EQ(t.foreign_tensor_bytes(), 0) << "rank " << ranks->rank();
  if (ranks->rank() == 0) {
    ASSERT_EQ(seen.losses.size(), 2u);
    for (size_t i = 0; i < seen.losses.size(); ++i) {
      EXPECT_TRUE(std::isfinite(seen.losses[i]) && seen.losses[i] > 0) << seen.losses[i];
      EXPECT_EQ(seen.foreign[i], 0) << "evaluation " << i + 1;
    }
  }
  t.finish();
  const std::map<std::string, const Tensor*> tensors = t.trained_tensors();
  int64_t brought = 0, largest = 0;
  bool wrote = false;
  t.write_trained([&](const TensorFetch& fetch) {
    wrote = true;
    for (const auto& [name, tensor] : tensors) {
      const Tensor& got = fetch(name);
      ASSERT_TRUE(got.type == tensor->type) << name;
      ASSERT_EQ(static_cast<int64_t>(got.data.size()), got.type.bytes()) << name;
      const int64_t foreign = t.foreign_tensor_bytes();
      EXPECT_TRUE(foreign == 0 || foreign == got.type.bytes()) << name << ": " << foreign;  // this one alone
      brought += foreign > 0;
      largest = std::max(largest, foreign);
    }
  });
  EXPECT_EQ(wrote, ranks->rank() == 0);
  if (ranks->rank() == 0) {
    EXPECT_GT(brought, 0);  // rank 1's parameters came, one at a time
    EXPECT_GT(largest, 0);
  }
  EXPECT_EQ(t.foreign_tensor_bytes(), 0);
}

}  // namespace
}  // namespace pt

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  pt::TrainRanks r;
  pt::ranks = &r;
  const int failed = RUN_ALL_TESTS();
  std::vector<int64_t> any = {failed};
  r.max(any);
  if (any[0] && !failed) std::fprintf(stderr, "rank %d passed; another rank failed\n", r.rank());
  return any[0] ? 1 : 0;
}
