// tests/train/evaluator_test.cc: the held-out evaluation (train/evaluator.h) runs BatchNorm on
// its running statistics, also where the file exported it in training mode (training_mode=1, the
// running statistics' outputs unread), as PyTorch's eval() does: the loss against one computed
// here from the running statistics, and different from one on each batch's own statistics. Cut
// where the pipeline is, in one process or in two (threads sharing a Comm), it gives the whole
// model's loss bit for bit.
#include "train/evaluator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "tests/autodiff/sample_chunks.h"
#include "tests/exec/test_tensors.h"

namespace pt {
namespace {

using testing::make_tensor;

constexpr int64_t kRows = 2, kChannels = 2, kWidth = 3;
constexpr float kEps = 1e-5f;

Tensor per_channel(float a, float b) {
  Tensor t = make_tensor(DType::kFloat32, {kChannels});
  t.as<float>()[0] = a;
  t.as<float>()[1] = b;
  return t;
}

// x (rows, C, 1, W) -> BatchNormalization -> y, with running mean (0.5, -1) and variance (4, 0.25).
// training: as an export in training mode writes it (training_mode=1, three outputs).
Graph batch_norm_model(bool training) {
  Graph g;
  g.opsets[""] = 17;
  const TensorType x_type{DType::kFloat32, {kRows, kChannels, 1, kWidth}};
  const ValueId x = g.add_value("x", x_type);
  g.inputs.push_back(x);
  Node n;
  n.name = "bn";
  n.op_type = "BatchNormalization";
  n.inputs = {x, g.add_initializer("bn.weight", per_channel(1.5f, 0.5f)), g.add_initializer("bn.bias", per_channel(0.25f, -2)),
              g.add_initializer("bn.running_mean", per_channel(0.5f, -1), true),
              g.add_initializer("bn.running_var", per_channel(4, 0.25f), true)};
  n.outputs = {g.add_value("y", x_type)};
  n.attrs["epsilon"] = kEps;
  if (training) {
    n.attrs["training_mode"] = int64_t{1};
    n.outputs.push_back(g.add_value("bn.mean_out", TensorType{DType::kFloat32, {kChannels}}));
    n.outputs.push_back(g.add_value("bn.var_out", TensorType{DType::kFloat32, {kChannels}}));
  }
  g.add_node(n);
  g.outputs = {n.outputs[0]};
  g.rebuild_uses();
  return g;
}

// Synthetic x and target, half of 8 samples held out.
DataLoader held_out_data() {
  DataOptions o;
  o.samples = 8;
  o.eval_fraction = 0.5;
  const TensorType t{DType::kFloat32, {kRows, kChannels, 1, kWidth}};
  return DataLoader(o, {{"x", t, 0}}, {kLossTarget, t, 0});
}

// The mean squared error over the held-out batches with y = (x - mean) * scale / sqrt(var + eps)
// + bias per channel, on the running statistics or on each batch's own (biased variance).
double expected_mse(const DataLoader& data, bool running) {
  const float scale[] = {1.5f, 0.5f}, bias[] = {0.25f, -2}, rmean[] = {0.5f, -1}, rvar[] = {4, 0.25f};
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < data.eval_batches(); ++i) {
    const FeedMap f = data.eval_batch(i);
    const float* x = f.at("x").as<float>();
    const float* t = f.at(kLossTarget).as<float>();
    for (int64_t c = 0; c < kChannels; ++c) {
      double mean = rmean[c], var = rvar[c];
      if (!running) {
        double s = 0, s2 = 0;
        for (int64_t r = 0; r < kRows; ++r)
          for (int64_t w = 0; w < kWidth; ++w) s += x[(r * kChannels + c) * kWidth + w];
        mean = s / (kRows * kWidth);
        for (int64_t r = 0; r < kRows; ++r)
          for (int64_t w = 0; w < kWidth; ++w) s2 += std::pow(x[(r * kChannels + c) * kWidth + w] - mean, 2);
        var = s2 / (kRows * kWidth);
      }
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t w = 0; w < kWidth; ++w) {
          const int64_t k = (r * kChannels + c) * kWidth + w;
          const double y = (x[k] - mean) * scale[c] / std::sqrt(var + kEps) + bias[c];
          sum += (y - t[k]) * (y - t[k]);
          ++count;
        }
    }
  }
  return sum / static_cast<double>(count);
}

TEST(Evaluator, BatchNormEvaluatesOnItsRunningStatisticsAlsoWhereExportedInTrainingMode) {
  const DataLoader data = held_out_data();
  ASSERT_EQ(data.eval_batches(), 2);
  const double running = expected_mse(data, true), own = expected_mse(data, false);
  EXPECT_GT(std::abs(running - own), 1e-2 * running);  // the test tells the two apart
  LossSpec mse;
  mse.kind = LossSpec::Kind::kMse;
  for (const bool training : {false, true}) {
    SCOPED_TRACE(training ? "exported in training mode" : "exported in eval mode");
    Evaluator eval(batch_norm_model(training), mse, 1);
    const EvalResult r = eval.run(data);
    EXPECT_NEAR(r.loss, running, 1e-5 * running);
    EXPECT_EQ(r.samples, 4);
  }
}

// Synthetic held-out data for a sample model: its input, and its output's classes as targets.
DataLoader sample_data(const Graph& g) {
  DataOptions o;
  o.samples = 24;
  o.eval_fraction = 0.5;
  std::vector<FeedSpec> inputs;
  for (ValueId v : g.inputs) inputs.push_back({g.value(v).name, g.value(v).type, is_floating(g.value(v).type.dtype) ? 0 : 16});
  const TensorType& y = g.value(g.outputs.front()).type;
  TensorType target{DType::kInt64, std::vector<int64_t>(y.shape.begin(), y.shape.end() - 1)};
  return DataLoader(o, inputs, {kLossTarget, target, y.shape.back()});
}

// Where `chunks` run: one a device, or two as a V (device d: chunks d and 2 x devices - 1 - d);
// the devices in `mine` this process's.
EvalCut cut_of(const std::vector<BackwardGraphs>& chunks, int devices, const std::vector<bool>& mine) {
  EvalCut cut;
  for (int c = 0; c < static_cast<int>(chunks.size()); ++c) {
    cut.forwards.push_back(&chunks[static_cast<size_t>(c)].forward);
    cut.placement.push_back(c < devices ? c : 2 * devices - 1 - c);
  }
  cut.local = mine;
  return cut;
}

// A Comm whose messages wait in a queue per (name, receiving device), in the order sent: the
// order MPI keeps between two ranks (the in-process mailbox holds one message per key).
class QueueComm : public Comm {
 public:
  void send(std::string_view name, int, int, int to, const void* data, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto* b = static_cast<const std::byte*>(data);
    queues_[{std::string(name), to}].emplace_back(b, b + bytes);
    arrived_.notify_all();
  }
  void recv(std::string_view name, int, int, int to, void* data, size_t bytes) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto& q = queues_[{std::string(name), to}];
    arrived_.wait(lock, [&] { return !q.empty(); });
    ASSERT_EQ(q.front().size(), bytes) << name;
    std::memcpy(data, q.front().data(), bytes);
    q.pop_front();
  }
  void abort() override {}
  void reset() override {}

 private:
  std::mutex mu_;
  std::condition_variable arrived_;
  std::map<std::pair<std::string, int>, std::deque<std::vector<std::byte>>> queues_;
};

// gpt (a residual crossing every cut, cross-entropy) and resnet (BatchNorm on its running
// statistics), cut into 2 and 4 chunks, and 4 chunks over 2 devices (a V's first and last chunks
// on device 0): the whole model's loss and accuracy, bit for bit.
TEST(Evaluator, CutWhereThePipelineIsGivesTheWholeModelsBits) {
  LossSpec ce;
  for (const char* name : {"gpt", "resnet"})
    for (const auto& [chunks, devices] : std::vector<std::pair<int, int>>{{2, 2}, {4, 4}, {4, 2}}) {
      SCOPED_TRACE(std::string(name) + ", " + std::to_string(chunks) + " chunks on " + std::to_string(devices) + " devices");
      const Graph g = testing::load_sample(name, 2);
      const std::vector<BackwardGraphs> cut = testing::sample_chunks(g, chunks);
      const DataLoader data = sample_data(g);
      ASSERT_GE(data.eval_batches(), 4);
      const EvalResult whole = Evaluator(g, ce, 1).run(data);
      Evaluator here(g, ce, cut_of(cut, devices, std::vector<bool>(static_cast<size_t>(devices), true)), nullptr, 1);
      const EvalResult r = here.run(data);
      EXPECT_EQ(r.loss, whole.loss);
      EXPECT_EQ(r.accuracy, whole.accuracy);
      EXPECT_EQ(r.samples, whole.samples);
      // Two processes: device 0 on one, the rest on the other; the last chunk's reports.
      QueueComm comm;
      std::vector<bool> first(static_cast<size_t>(devices), false), rest(static_cast<size_t>(devices), true);
      first[0] = true;
      rest[0] = false;
      Evaluator a(g, ce, cut_of(cut, devices, first), &comm, 1), b(g, ce, cut_of(cut, devices, rest), &comm, 1);
      EXPECT_EQ(a.message_names(), b.message_names());
      EXPECT_FALSE(a.message_names().empty());
      EvalResult ra, rb;
      std::thread other([&] { rb = b.run(data); });
      ra = a.run(data);
      other.join();
      const EvalResult& last = a.reports() ? ra : rb;
      EXPECT_NE(a.reports(), b.reports());
      EXPECT_EQ(last.loss, whole.loss);
      EXPECT_EQ(last.accuracy, whole.accuracy);
      EXPECT_EQ((a.reports() ? rb : ra).samples, 0);
    }
}

}  // namespace
}  // namespace pt
