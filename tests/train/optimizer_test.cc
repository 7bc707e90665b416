// Optimizer against closed forms worked by hand: one SGD step, two momentum and Nesterov steps,
// the first AdamW step, clipping across two stages, the LR schedule at chosen steps, state round
// trips and the pinned UserErrors. torch.optim itself is the oracle in oracle/optimizer_torch.py.
#include "train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "core/error.h"

namespace pt {
namespace {

Tensor make(std::vector<float> v) {
  Tensor t;
  t.type = {DType::kFloat32, {static_cast<int64_t>(v.size())}};
  t.data.resize(v.size() * sizeof(float));
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

std::vector<float> values(const Tensor& t) {
  return {t.as<float>(), t.as<float>() + t.type.numel()};
}

std::vector<const float*> ptrs(const std::vector<Tensor>& grads) {
  std::vector<const float*> out;
  for (const Tensor& g : grads) out.push_back(g.as<float>());
  return out;
}

void expect_near(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

OptimizerConfig sgd(double lr, double momentum = 0, bool nesterov = false, double wd = 0) {
  OptimizerConfig c;
  c.lr = lr;
  c.momentum = momentum;
  c.nesterov = nesterov;
  c.weight_decay = wd;
  return c;
}

// p1 = p0 - lr * (g + wd * p0)
TEST(Optimizer, SgdOneStepClosedForm) {
  Tensor p = make({1.0f, -2.0f, 0.5f});
  Optimizer opt(sgd(0.1, 0, false, 0.01), {{"w", &p}});
  std::vector<Tensor> g = {make({0.5f, 0.25f, -1.0f})};
  opt.step(ptrs(g));
  expect_near(values(p), {1 - 0.1 * (0.5 + 0.01), -2 - 0.1 * (0.25 - 0.02),
                          0.5 - 0.1 * (-1 + 0.005)}, 1e-7);
  EXPECT_EQ(opt.steps(), 1);
}

// b1 = g1; p1 = p0 - lr*b1; b2 = mu*b1 + g2; p2 = p1 - lr*b2
TEST(Optimizer, MomentumTwoSteps) {
  Tensor p = make({1.0f, -1.0f});
  Optimizer opt(sgd(0.1, 0.9), {{"w", &p}});
  std::map<std::string, Tensor> g1, g2;
  g1["w"] = make({1.0f, 2.0f});
  g2["w"] = make({-0.5f, 1.0f});
  opt.step(g1);
  expect_near(values(p), {1 - 0.1 * 1, -1 - 0.1 * 2}, 1e-7);
  opt.step(g2);
  expect_near(values(p), {0.9 - 0.1 * (0.9 * 1 - 0.5), -1.2 - 0.1 * (0.9 * 2 + 1)}, 1e-6);
  EXPECT_EQ(opt.state().tensors[0].first, "w.momentum_buffer");
  expect_near(values(opt.state().tensors[0].second), {0.4, 2.8}, 1e-6);
}

// Nesterov: d = g + mu*b. Step 1: b = g1, d = 1.9*g1. Step 2: b = 0.9*g1 + g2, d = g2 + 0.9*b.
TEST(Optimizer, NesterovTwoSteps) {
  Tensor p = make({1.0f, -1.0f});
  Optimizer opt(sgd(0.1, 0.9, true), {{"w", &p}});
  std::vector<Tensor> g1 = {make({1.0f, 2.0f})}, g2 = {make({-0.5f, 1.0f})};
  opt.step(ptrs(g1));
  expect_near(values(p), {1 - 0.1 * 1.9, -1 - 0.1 * 3.8}, 1e-7);
  opt.step(ptrs(g2));
  const double b0 = 0.9 * 1 - 0.5, b1 = 0.9 * 2 + 1;
  expect_near(values(p), {0.81 - 0.1 * (-0.5 + 0.9 * b0), -1.38 - 0.1 * (1 + 0.9 * b1)}, 1e-6);
}

// Step 1: m = (1-b1) g, v = (1-b2) g^2, so m/(1-b1) = g and sqrt(v/(1-b2)) = |g|:
//   p1 = p0 * (1 - lr*wd) - lr * g / (|g| + eps)   (about lr * sign(g); 0 where g = 0)
TEST(Optimizer, AdamWFirstStepClosedForm) {
  OptimizerConfig c;
  c.kind = OptimizerConfig::Kind::kAdamW;
  c.lr = 0.01;
  c.weight_decay = 0.1;
  c.eps = 1e-3;  // large enough to show in the result
  Tensor p = make({1.0f, -2.0f, 0.5f, 3.0f});
  Optimizer opt(c, {{"w", &p}});
  std::vector<float> g = {0.5f, -2.0f, 0.0f, 1e-3f};
  std::vector<Tensor> grads = {make(g)};
  opt.step(ptrs(grads));
  const double decay = 1 - 0.01 * 0.1;
  std::vector<double> want;
  for (size_t i = 0; i < g.size(); ++i) {
    const double p0 = values(make({1.0f, -2.0f, 0.5f, 3.0f}))[i];
    want.push_back(p0 * decay - 0.01 * g[i] / (std::fabs(g[i]) + 1e-3));
  }
  expect_near(values(p), want, 1e-6);
  auto st = opt.state();
  ASSERT_EQ(st.tensors.size(), 2u);
  EXPECT_EQ(st.tensors[0].first, "w.exp_avg");
  EXPECT_EQ(st.tensors[1].first, "w.exp_avg_sq");
  EXPECT_NEAR(values(st.tensors[1].second)[1], 0.001 * 4, 1e-9);
}

// Two stages, norm over both: over the limit every gradient is scaled by
// max_norm / (norm + 1e-6); under it they are used as given. SGD with lr 1 shows g*c directly.
TEST(Optimizer, ClipScalesEveryStageByOneFactor) {
  for (double limit_over_norm : {0.5, 2.0}) {
    Tensor a = make({0, 0}), b = make({0, 0, 0});
    std::vector<Tensor> ga = {make({3.0f, -4.0f})}, gb = {make({12.0f, 0.0f, 0.0f})};
    const double norm = 13;  // sqrt(9 + 16 + 144)
    OptimizerConfig c = sgd(1.0);
    c.clip_grad_norm = limit_over_norm * norm;
    Optimizer sa(c, {{"a", &a}}), sb(c, {{"b", &b}});
    const std::vector<double> sq = {sa.squared_norm(ptrs(ga)), sb.squared_norm(ptrs(gb))};
    EXPECT_DOUBLE_EQ(sq[0], 25);
    const double global = Optimizer::global_norm(sq);
    EXPECT_DOUBLE_EQ(global, norm);
    sa.step(ptrs(ga), global);
    sb.step(ptrs(gb), global);
    const double scale = limit_over_norm < 1 ? c.clip_grad_norm / (norm + 1e-6) : 1.0;
    EXPECT_FLOAT_EQ(sa.clip_coefficient(global), static_cast<float>(scale));
    expect_near(values(a), {-3 * scale, 4 * scale}, 1e-6);
    expect_near(values(b), {-12 * scale, 0, 0}, 1e-6);
    EXPECT_EQ(values(ga[0])[0], 3.0f) << "gradients are read, not changed";
  }
}

// Warm-up W = 4 (lr / 4 at step 0, lr at step 3), cosine over T = 13 steps (span T - 1 - W = 8),
// lr 1, min_lr 0.1.
TEST(Optimizer, ScheduleValues) {
  OptimizerConfig c = sgd(1.0);
  c.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 1), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 3), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 4), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 100), 1.0);
  c.schedule = OptimizerConfig::Schedule::kCosine;
  c.total_steps = 13;
  c.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 2), 0.75);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 3), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 4), 1.0);
  EXPECT_NEAR(learning_rate_at(c, 6), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_NEAR(learning_rate_at(c, 8), 0.55, 1e-15);
  EXPECT_NEAR(learning_rate_at(c, 12), 0.1, 1e-15);
  EXPECT_NEAR(learning_rate_at(c, 50), 0.1, 1e-15);
  // The optimizer steps with the schedule's rate: a quarter of lr at step 0 (the first step
  // moves the parameter), half at step 1.
  c.lr = 0.4;
  c.min_lr = 0;
  Tensor p = make({1.0f});
  Optimizer opt(c, {{"w", &p}});
  std::vector<Tensor> g = {make({1.0f})};
  EXPECT_DOUBLE_EQ(opt.current_lr(), 0.1);
  opt.step(ptrs(g));
  EXPECT_FLOAT_EQ(values(p)[0], 0.9f);
  EXPECT_DOUBLE_EQ(opt.current_lr(), 0.2);
  opt.step(ptrs(g));
  EXPECT_FLOAT_EQ(values(p)[0], 0.7f);
}

// Save after two steps, load into a fresh optimizer over copied parameters: the next steps give
// bit-identical parameters.
TEST(Optimizer, StateRoundTripContinuesIdentically) {
  OptimizerConfig adamw;
  adamw.kind = OptimizerConfig::Kind::kAdamW;
  adamw.lr = 0.01;
  adamw.weight_decay = 0.1;
  adamw.warmup_steps = 1;
  for (const OptimizerConfig& c : {adamw, sgd(0.1, 0.9, true, 0.01)}) {
    Tensor w = make({1.0f, -2.0f, 0.5f}), v = make({0.25f});
    Optimizer first(c, {{"w", &w}, {"v", &v}});
    std::vector<std::vector<Tensor>> grads;
    for (int s = 0; s < 4; ++s)
      grads.push_back({make({0.1f * s, -0.3f, 1.0f / (s + 1)}), make({0.2f - s})});
    first.step(ptrs(grads[0]));
    first.step(ptrs(grads[1]));
    Tensor w2 = w, v2 = v;
    Optimizer second(c, {{"w", &w2}, {"v", &v2}});
    second.load_state(first.state());
    EXPECT_EQ(second.steps(), 2);
    for (int s = 2; s < 4; ++s) {
      first.step(ptrs(grads[s]));
      second.step(ptrs(grads[s]));
    }
    EXPECT_EQ(w.data, w2.data);
    EXPECT_EQ(v.data, v2.data);
  }
}

// Above the parallel threshold: the threaded loops give the scalar formula element for element
// and the norm equals a serial double sum.
TEST(Optimizer, LargeTensorMatchesElementwiseFormula) {
  const size_t n = 300000;
  std::vector<float> p0(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p0[i] = std::sin(static_cast<float>(i));
    g[i] = std::cos(static_cast<float>(i) * 0.5f);
  }
  Tensor p = make(p0);
  std::vector<Tensor> grads = {make(g)};
  Optimizer opt(sgd(0.1, 0, false, 0.01), {{"w", &p}});
  double serial = 0;
  for (float x : g) serial += static_cast<double>(x) * x;
  EXPECT_NEAR(opt.squared_norm(ptrs(grads)), serial, serial * 1e-12);
  EXPECT_EQ(opt.squared_norm(ptrs(grads)), opt.squared_norm(ptrs(grads)));
  opt.step(ptrs(grads));
  const float neg_lr = -0.1f, wd = 0.01f;
  for (size_t i = 0; i < n; i += 997) {
    const float want = p0[i] + neg_lr * (g[i] + wd * p0[i]);
    ASSERT_EQ(values(p)[i], want) << "element " << i;
  }
}

TEST(Optimizer, ErrorsNameTheKey) {
  EXPECT_EQ(error_of([] { validate(sgd(-0.1)); }),
            "optimizer.lr: got -0.1, must be >= 0; set a learning rate such as 0.001");
  OptimizerConfig c;
  c.beta2 = 1.0;
  EXPECT_EQ(error_of([&] { validate(c); }),
            "optimizer.betas: 1 is outside [0, 1); use values such as 0.9 and 0.999");
  EXPECT_EQ(error_of([] { validate(sgd(0.1, 0, true)); }),
            "optimizer.nesterov: needs a momentum > 0; set optimizer.momentum (e.g. 0.9) or "
            "turn nesterov off");
  EXPECT_EQ(error_of([] { parse_optimizer_kind("adam"); }),
            "optimizer.kind: unknown optimizer 'adam'; use sgd or adamw");
  EXPECT_EQ(error_of([] { parse_lr_schedule("linear"); }),
            "optimizer.schedule: unknown schedule 'linear'; use constant or cosine");
  c = sgd(0.1);
  c.schedule = OptimizerConfig::Schedule::kCosine;
  c.warmup_steps = 10;
  c.total_steps = 10;
  EXPECT_EQ(error_of([&] { validate(c); }),
            "optimizer.total_steps: got 10, must exceed the 10 warm-up steps; set the number of "
            "training steps the cosine schedule spans");
  c.total_steps = 100;
  c.min_lr = 0.5;
  EXPECT_EQ(error_of([&] { validate(c); }),
            "optimizer.min_lr: got 0.5, must lie in [0, optimizer.lr = 0.1]; lower it, or raise "
            "optimizer.lr");
  EXPECT_EQ(error_of([] { Tensor p = make({1.0f}); Optimizer o(sgd(std::nan("")), {{"w", &p}}); }),
            "optimizer.lr: got nan, must be >= 0; set a learning rate such as 0.001");
}

TEST(Optimizer, LoadStateRejectsAnotherOptimizer) {
  Tensor p = make({1.0f, 2.0f});
  Optimizer momentum(sgd(0.1, 0.9), {{"w", &p}});
  OptimizerConfig c;
  c.kind = OptimizerConfig::Kind::kAdamW;
  Optimizer adamw(c, {{"w", &p}});
  EXPECT_EQ(error_of([&] { adamw.load_state(momentum.state()); }),
            "optimizer state: has 1 tensors, adamw here needs 2; load a checkpoint written with "
            "the same optimizer and model");
  Tensor q = make({1.0f, 2.0f, 3.0f});
  Optimizer other(sgd(0.1, 0.9), {{"w", &q}});
  EXPECT_EQ(error_of([&] { other.load_state(momentum.state()); }),
            "optimizer state: 'w.momentum_buffer' is float32[2], expected float32[3]; load a "
            "checkpoint written with the same optimizer and model");
  Optimizer renamed(sgd(0.1, 0.9), {{"u", &p}});
  EXPECT_EQ(error_of([&] { renamed.load_state(momentum.state()); }),
            "optimizer state: tensor 0 is 'w.momentum_buffer', expected 'u.momentum_buffer'; "
            "load a checkpoint written with the same optimizer and model");
}

}  // namespace
}  // namespace pt
