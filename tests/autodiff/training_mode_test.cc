// tests/autodiff/training_mode_test.cc: to_training_mode (autodiff/training_mode.h) on resnet
// (BatchNormalization) and on a small MLP with Dropout: the rewritten structure and its errors;
// the batch statistics against mean and unbiased variance of the BatchNorm input computed here
// in double; the statistics staying in the F graph of the chunk that makes them; resnet's
// gradients bit-identical to those of its BatchNormalization(training_mode=1) at 1, 2 and 3
// stages; SeededDropout's gradients bit-identical across stages and recompute policies for
// one key (another key drops other elements); and a stochastic-depth block (Bernoulli): seeded on
// the same key in training, its expected value (the branch the identity) with dropout off and in
// evaluation, its gradients bit-identical across stages and recompute.
#include "autodiff/training_mode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "autodiff/chunk_backward.h"
#include "autodiff/loss.h"
#include "core/error.h"
#include "core/pipetrain_ops.h"
#include "exec/cpu/cpu_backend.h"
#include "train/reference_step.h"
#include "exec/stage_program.h"
#include "tests/autodiff/sample_chunks.h"
#include "tests/exec/test_tensors.h"

namespace pt {
namespace {

using Store = std::map<std::string, Tensor>;

using testing::load_sample;
using testing::make_tensor;

// The chunks of g at `stages` stages (the partitioner makes as many as asked).
std::vector<BackwardGraphs> chunks_of(const Graph& g, int stages, const std::string& policy) {
  std::vector<BackwardGraphs> chunks = testing::sample_chunks(g, stages, policy);
  EXPECT_EQ(static_cast<int>(chunks.size()), stages);
  return chunks;
}

// Normal floats for every float input of g, the key for kDropoutKey, and a target and
// loss_scale for the last chunk's cross-entropy.
Store random_feeds(const Graph& g, const BackwardGraphs& last, unsigned seed, int64_t key = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Store feeds;
  for (ValueId v : g.inputs) {
    Tensor t = make_tensor(g.value(v).type.dtype, g.value(v).type.shape);
    if (g.value(v).name == kDropoutKey) *t.as<int64_t>() = key;
    else
      for (int64_t i = 0; i < t.type.numel(); ++i) t.as<float>()[i] = normal(rng);
    feeds[g.value(v).name] = std::move(t);
  }
  const Graph& f = last.forward;
  int64_t classes = 1;
  for (const Node& n : f.nodes)
    if (n.op_type == "SoftmaxCrossEntropy") classes = f.value(n.inputs[0]).type.shape.back();
  Tensor target = make_tensor(DType::kInt64, f.value(f.find(kLossTarget)).type.shape);
  for (int64_t i = 0; i < target.type.numel(); ++i)
    target.as<int64_t>()[i] = static_cast<int64_t>(rng() % static_cast<unsigned>(classes));
  feeds[kLossTarget] = std::move(target);
  Tensor scale = make_tensor(DType::kFloat32, {});
  *scale.as<float>() = 0.25f;
  feeds[kLossScale] = std::move(scale);
  return feeds;
}

// ReferenceStep over two micro-batches: the accumulated gradients and the loss.
std::pair<Store, double> step_grads(const Graph& g, int stages, const std::string& policy,
                                    int64_t key = 0) {
  const std::vector<BackwardGraphs> chunks = chunks_of(g, stages, policy);
  CpuBackend backend(2);
  ReferenceStep step(chunks, backend);
  for (unsigned mb = 0; mb < 2; ++mb)
    step.run_micro_batch(random_feeds(g, chunks.back(), mb, key + mb));
  return {step.grads(), step.loss()};
}

void expect_bit_identical(const Store& have, const Store& want) {
  ASSERT_EQ(have.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(have.count(name)) << name;
    ASSERT_EQ(have.at(name).type, t.type) << name;
    EXPECT_EQ(0, std::memcmp(have.at(name).data.data(), t.data.data(), t.data.size())) << name;
  }
}

std::vector<std::string> names(const Graph& g, const std::vector<ValueId>& ids) {
  std::vector<std::string> out;
  for (ValueId v : ids) out.push_back(g.value(v).name);
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// ---- BatchNormalization ---------------------------------------------------------------------

TEST(TrainingMode, ResnetBatchNormsBecomeBatchNormTraining) {
  const Graph before = load_sample("resnet", 2);
  Graph g = before;
  const TrainingForm form = to_training_mode(g, {});
  int bns = 0;
  int64_t running_count = 0;
  for (const Node& n : before.nodes)
    if (n.op_type == "BatchNormalization") {
      ++bns;
      running_count += 2 * before.value(n.inputs[0]).type.shape[1];
    }
  ASSERT_GT(bns, 0);
  ASSERT_EQ(static_cast<int>(form.batch_norms.size()), bns);
  EXPECT_FALSE(form.dropout_key);
  EXPECT_EQ(g.opsets.at(kPipetrainDomain), 1);
  ASSERT_EQ(g.nodes.size(), before.nodes.size());
  size_t k = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    EXPECT_EQ(n.name, before.nodes[i].name);
    EXPECT_NE(n.op_type, "BatchNormalization");
    if (n.op_type != "BatchNormTraining") continue;
    const BatchNormStats& s = form.batch_norms[k++];
    EXPECT_EQ(n.domain, kPipetrainDomain);
    EXPECT_EQ(s.node, n.name);
    ASSERT_EQ(n.inputs.size(), 3u);
    EXPECT_EQ(std::vector<ValueId>(n.inputs.begin(), n.inputs.end()),
              std::vector<ValueId>(before.nodes[i].inputs.begin(), before.nodes[i].inputs.begin() + 3));
    EXPECT_EQ(s.running_mean, before.value(before.nodes[i].inputs[3]).name);
    EXPECT_EQ(s.running_var, before.value(before.nodes[i].inputs[4]).name);
    EXPECT_EQ(names(g, {n.outputs[1], n.outputs[2]}),
              (std::vector<std::string>{n.name + ".batch_mean", n.name + ".batch_var"}));
    EXPECT_EQ(s.batch_mean, n.name + ".batch_mean");
    EXPECT_EQ(s.batch_var, n.name + ".batch_var");
    EXPECT_NEAR(s.momentum, 0.9f, 1e-6f);  // torch's momentum 0.1
    EXPECT_EQ(n.attr_float("epsilon", 0), before.nodes[i].attr_float("epsilon", 1));
    // The running statistics are buffers: read by no node, no parameter.
    for (const std::string& r : {s.running_mean, s.running_var}) {
      const Value& v = g.value(g.find(r));
      EXPECT_TRUE(v.is_initializer()) << r;
      EXPECT_FALSE(v.is_parameter()) << r;
      EXPECT_TRUE(v.consumers.empty()) << r;
    }
  }
  // Outputs: the model's own first, then each BatchNorm's two statistics in node order.
  const std::vector<std::string> outs = names(g, g.outputs);
  ASSERT_EQ(outs.size(), before.outputs.size() + 2 * form.batch_norms.size());
  EXPECT_EQ(outs[0], before.value(before.outputs[0]).name);
  for (size_t b = 0; b < form.batch_norms.size(); ++b) {
    EXPECT_EQ(outs[1 + 2 * b], form.batch_norms[b].batch_mean);
    EXPECT_EQ(outs[2 + 2 * b], form.batch_norms[b].batch_var);
  }
  EXPECT_EQ(g.parameter_count(), before.parameter_count() - running_count);
  for (const std::string& p : frozen_parameters(g, {"*"}))
    EXPECT_EQ(p.find("running_"), std::string::npos) << p;
}

// Every statistic is an output of the F graph of the chunk that computes it and of no other
// chunk; it takes no gradient; the loss reads the model's output.
TEST(TrainingMode, StatisticsStayInTheChunkThatMakesThem) {
  Graph g = load_sample("resnet", 2);
  const TrainingForm form = to_training_mode(g, {});
  for (int stages : {2, 3}) {
    SCOPED_TRACE(stages);
    const std::vector<BackwardGraphs> chunks = chunks_of(g, stages, "selective");
    std::set<std::string> seen;
    for (const BackwardGraphs& c : chunks) {
      std::set<std::string> made;
      for (const Node& n : c.forward.nodes)
        if (n.op_type == "BatchNormTraining")
          for (size_t k = 1; k < 3; ++k) made.insert(c.forward.value(n.outputs[k]).name);
      const std::vector<std::string> outs = names(c.forward, c.forward.outputs);
      for (const std::string& s : made) EXPECT_TRUE(contains(outs, s)) << s;
      for (const std::string& o : outs) {
        if (o.find(".batch_") != std::string::npos) {
          EXPECT_TRUE(made.count(o)) << o;
        }
      }
      for (const std::string& in : names(c.forward, c.forward.inputs))
        EXPECT_EQ(in.find(".batch_"), std::string::npos) << in;
      for (const std::string& gi : c.output_grads)
        EXPECT_EQ(gi.find(".batch_"), std::string::npos) << gi;
      seen.insert(made.begin(), made.end());
    }
    EXPECT_EQ(seen.size(), 2 * form.batch_norms.size());
    const Graph& last = chunks.back().forward;
    EXPECT_EQ(last.value(last.outputs[0]).name, kLossOutput);
    for (const Node& n : last.nodes) {
      if (n.op_type == "SoftmaxCrossEntropy") {
        EXPECT_EQ(last.value(n.inputs[0]).name, g.value(g.outputs[0]).name);
      }
    }
  }
}

// resnet is exported with BatchNormalization(training_mode=1), whose gradient pipetrain already
// takes from the batch statistics (and which the PyTorch oracle checks): the training form gives
// the very same bits, whole and cut into 2 and 3 stages.
TEST(TrainingMode, ResnetGradientsBitIdenticalToTrainingModeBatchNormAtEveryStageCount) {
  const Graph model = load_sample("resnet", 2);
  const auto [want, want_loss] = step_grads(model, 1, "none");
  Graph g = model;
  to_training_mode(g, {});
  for (int stages : {1, 2, 3}) {
    SCOPED_TRACE(stages);
    const auto [have, loss] = step_grads(g, stages, stages == 3 ? "selective" : "none");
    EXPECT_EQ(loss, want_loss);
    expect_bit_identical(have, want);
  }
}

// batch_mean and batch_var are the mean and the unbiased variance of each BatchNorm's input
// (double precision here, 1e-5 relative), and the chunked F graphs give the same bits as the
// whole graph.
TEST(TrainingMode, BatchStatisticsAreMeanAndUnbiasedVarianceOfTheInput) {
  Graph g = load_sample("resnet", 4);
  const TrainingForm form = to_training_mode(g, {});
  Graph whole = g;
  std::vector<std::string> bn_inputs;
  for (const Node& n : whole.nodes)
    if (n.op_type == "BatchNormTraining") {
      whole.outputs.push_back(n.inputs[0]);
      bn_inputs.push_back(whole.value(n.inputs[0]).name);
    }
  whole.rebuild_uses();
  CpuBackend backend(2);
  StageProgram program(whole, backend);
  const std::vector<BackwardGraphs> chunks = chunks_of(g, 2, "none");
  Store store = random_feeds(g, chunks.back(), 7);
  std::vector<Buffer> in;
  for (ValueId v : whole.inputs) in.push_back({store.at(whole.value(v).name).data.data(), &whole.value(v).type});
  program.run(in);
  Store out;
  for (size_t k = 0; k < whole.outputs.size(); ++k) {
    const Buffer b = program.output(k);
    Tensor t = make_tensor(b.type->dtype, b.type->shape);
    std::memcpy(t.data.data(), b.data, t.data.size());
    out[whole.value(whole.outputs[k]).name] = std::move(t);
  }
  ASSERT_EQ(bn_inputs.size(), form.batch_norms.size());
  for (size_t b = 0; b < bn_inputs.size(); ++b) {
    const Tensor& x = out.at(bn_inputs[b]);
    const int64_t n = x.type.shape[0], c = x.type.shape[1], s = x.type.numel() / (n * c);
    const float* mean = out.at(form.batch_norms[b].batch_mean).as<float>();
    const float* var = out.at(form.batch_norms[b].batch_var).as<float>();
    for (int64_t ch = 0; ch < c; ++ch) {
      double sum = 0, dev = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < s; ++j) sum += x.as<float>()[(i * c + ch) * s + j];
      const double m = sum / double(n * s);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < s; ++j) dev += std::pow(x.as<float>()[(i * c + ch) * s + j] - m, 2);
      const double v = dev / double(n * s - 1);
      ASSERT_NEAR(mean[ch], m, 1e-5 * (std::sqrt(v) + std::fabs(m))) << bn_inputs[b] << " " << ch;
      ASSERT_NEAR(var[ch], v, 1e-5 * v) << bn_inputs[b] << " " << ch;
    }
  }
  // The chunks' F graphs, run in order, make the same statistics.
  for (const BackwardGraphs& ch : chunks) {
    StageProgram f(ch.forward, backend);
    std::vector<Buffer> fin;
    for (ValueId v : ch.forward.inputs)
      fin.push_back({store.at(ch.forward.value(v).name).data.data(), &ch.forward.value(v).type});
    f.run(fin);
    for (size_t k = 0; k < ch.forward.outputs.size(); ++k) {
      const Buffer b = f.output(k);
      Tensor t = make_tensor(b.type->dtype, b.type->shape);
      std::memcpy(t.data.data(), b.data, t.data.size());
      store[ch.forward.value(ch.forward.outputs[k]).name] = std::move(t);
    }
  }
  for (const BatchNormStats& s : form.batch_norms)
    for (const std::string& name : {s.batch_mean, s.batch_var}) {
      ASSERT_TRUE(store.count(name)) << name;
      EXPECT_EQ(0, std::memcmp(store.at(name).data.data(), out.at(name).data.data(),
                               out.at(name).data.size())) << name;
    }
}

TEST(TrainingMode, MobilenetHasNothingToRewriteAndStillTrains) {
  const Graph model = load_sample("mobilenet", 2);
  Graph g = model;
  const TrainingForm form = to_training_mode(g, {});
  EXPECT_TRUE(form.batch_norms.empty());
  EXPECT_EQ(g.outputs.size(), model.outputs.size());
  expect_bit_identical(step_grads(g, 2, "none").first, step_grads(model, 2, "none").first);
}

TEST(TrainingMode, UpdateRunningStatisticsUsesOnnxMomentum) {
  Tensor rm = make_tensor(DType::kFloat32, {2}), rv = rm, bm = rm, bv = rm;
  rm.as<float>()[0] = 1, rm.as<float>()[1] = 2, rv.as<float>()[0] = 3, rv.as<float>()[1] = 4;
  bm.as<float>()[0] = 11, bm.as<float>()[1] = 12, bv.as<float>()[0] = 13, bv.as<float>()[1] = 14;
  update_running_statistics(rm, rv, bm, bv, 0.9f);
  EXPECT_FLOAT_EQ(rm.as<float>()[0], 1 * 0.9f + 11 * 0.1f);
  EXPECT_FLOAT_EQ(rm.as<float>()[1], 2 * 0.9f + 12 * 0.1f);
  EXPECT_FLOAT_EQ(rv.as<float>()[0], 3 * 0.9f + 13 * 0.1f);
  EXPECT_FLOAT_EQ(rv.as<float>()[1], 4 * 0.9f + 14 * 0.1f);
}

// ---- a small graph with BatchNormalization or Dropout ---------------------------------------

Tensor bool_tensor(bool v) {
  Tensor t = make_tensor(DType::kBool, {});
  *t.as<bool>() = v;
  return t;
}

Tensor random_tensor(const std::vector<int64_t>& shape, unsigned seed) {
  Tensor t = make_tensor(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 0.5f);
  for (int64_t i = 0; i < t.type.numel(); ++i) t.as<float>()[i] = normal(rng);
  return t;
}

ValueId add_op(Graph& g, const std::string& name, const std::string& op,
               std::vector<ValueId> inputs, const TensorType& out) {
  const ValueId y = g.add_value(name + ".out", out);
  g.add_node(Node{name, op, "", std::move(inputs), {y}, {}});
  return y;
}

// x [4, 16] -> MatMul w1 -> Relu -> Dropout(0.5, training) -> MatMul w2 -> Dropout(0.2) [4, 8]
Graph dropout_mlp() {
  Graph g;
  g.name = "mlp";
  g.opsets = {{"", 17}};
  const TensorType h{DType::kFloat32, {4, 32}}, o{DType::kFloat32, {4, 8}};
  const ValueId x = g.add_value("x", TensorType{DType::kFloat32, {4, 16}});
  g.inputs = {x};
  const ValueId w1 = g.add_initializer("w1", random_tensor({16, 32}, 1));
  const ValueId w2 = g.add_initializer("w2", random_tensor({32, 8}, 2));
  const ValueId a = add_op(g, "mm1", "MatMul", {x, w1}, h);
  const ValueId r = add_op(g, "relu", "Relu", {a}, h);
  const ValueId d = add_op(g, "drop1", "Dropout",
                           {r, g.add_initializer("ratio", scalar_tensor(0.5f), true),
                            g.add_initializer("training", bool_tensor(true), true)},
                           h);
  const ValueId m = add_op(g, "mm2", "MatMul", {d, w2}, o);
  const ValueId ratio2 = g.add_initializer("ratio2", scalar_tensor(0.2f), true);
  g.outputs = {add_op(g, "drop2", "Dropout", {m, ratio2}, o)};
  g.rebuild_uses();
  return g;
}

TEST(TrainingMode, DropoutOnBecomesSeededDropoutWithOneKey) {
  Graph g = dropout_mlp();
  const TrainingForm form = to_training_mode(g, {.dropout = true});
  EXPECT_TRUE(form.dropout_key);
  EXPECT_EQ(form.dropouts, 2);
  const ValueId key = g.find(kDropoutKey);
  ASSERT_NE(key, kNoValue);
  EXPECT_EQ(g.value(key).type, (TensorType{DType::kInt64, {}}));
  EXPECT_EQ(std::count(g.inputs.begin(), g.inputs.end(), key), 1);
  std::set<int64_t> streams;
  for (const Node& n : g.nodes) {
    if (n.name != "drop1" && n.name != "drop2") continue;
    EXPECT_EQ(n.op_type, "SeededDropout");
    EXPECT_EQ(n.domain, kPipetrainDomain);
    ASSERT_EQ(n.inputs.size(), 2u);
    EXPECT_EQ(n.inputs[1], key);
    EXPECT_EQ(n.outputs.size(), 1u);  // the mask is made when the gradient asks for it
    EXPECT_FLOAT_EQ(n.attr_float("ratio", 0), n.name == "drop1" ? 0.5f : 0.2f);
    EXPECT_EQ(n.attr_int("stream", 0), dropout_stream(n.name));
    streams.insert(n.attr_int("stream", 0));
  }
  EXPECT_EQ(streams.size(), 2u);
  EXPECT_EQ(g.value(g.outputs[0]).name, "drop2.out");
}

TEST(TrainingMode, DropoutOffIsTheIdentity) {
  Graph g = dropout_mlp();
  const TrainingForm form = to_training_mode(g, {});
  EXPECT_FALSE(form.dropout_key);
  EXPECT_EQ(form.dropouts, 0);
  EXPECT_EQ(g.find(kDropoutKey), kNoValue);
  for (const Node& n : g.nodes) {
    if (n.op_type == "Dropout") {
      EXPECT_EQ(n.inputs.size(), 1u) << n.name;
    }
  }
  // Runs on the CPU (training Dropout would not) and trains.
  const auto [grads, loss] = step_grads(g, 2, "none");
  EXPECT_EQ(grads.size(), 2u);
  EXPECT_TRUE(std::isfinite(loss));
}

// One key: the same gradients whole, cut in two, and with full recompute (B re-draws the very
// mask F drew). Another key: other elements dropped, other gradients.
TEST(TrainingMode, SeededDropoutGradientsAreTheSameForEveryStageCountAndRecompute) {
  Graph g = dropout_mlp();
  to_training_mode(g, {.dropout = true});
  const auto [want, want_loss] = step_grads(g, 1, "none", 1234);
  for (int stages : {1, 2})
    for (const char* policy : {"none", "full"}) {
      SCOPED_TRACE(std::to_string(stages) + " " + policy);
      const auto [have, loss] = step_grads(g, stages, policy, 1234);
      EXPECT_EQ(loss, want_loss);
      expect_bit_identical(have, want);
    }
  const Store other = step_grads(g, 2, "none", 999).first;
  EXPECT_NE(0, std::memcmp(other.at("w1").data.data(), want.at("w1").data.data(),
                           want.at("w1").data.size()));
}

TEST(TrainingMode, KeysDifferPerStepAndMicroBatch) {
  std::set<int64_t> keys;
  for (int64_t step = 0; step < 10; ++step)
    for (int64_t mb = 0; mb < 10; ++mb) keys.insert(dropout_key_for(42, step, mb));
  EXPECT_EQ(keys.size(), 100u);
  EXPECT_EQ(dropout_key_for(42, 3, 4), dropout_key_for(42, 3, 4));
  EXPECT_NE(dropout_key_for(42, 3, 4), dropout_key_for(43, 3, 4));
}

// ---- stochastic depth: Bernoulli ------------------------------------------------------------

// x [4, 16] -> MatMul w1 -> h [4, 32]; h + (h MatMul w2) * Bernoulli(P) / 0.75, P [4, 1] filled
// with 0.75 (torchvision's StochasticDepth in row mode, as onnx_import/random_rewrite.h reads
// it) -> MatMul w3 [4, 8].
Graph stochastic_depth_mlp() {
  Graph g;
  g.name = "sd";
  g.opsets = {{"", 17}};
  const TensorType h{DType::kFloat32, {4, 32}}, m{DType::kFloat32, {4, 1}};
  const ValueId x = g.add_value("x", TensorType{DType::kFloat32, {4, 16}});
  g.inputs = {x};
  const ValueId w1 = g.add_initializer("w1", random_tensor({16, 32}, 1));
  const ValueId w2 = g.add_initializer("w2", random_tensor({32, 32}, 2));
  const ValueId w3 = g.add_initializer("w3", random_tensor({32, 8}, 3));
  Tensor p = make_tensor(DType::kFloat32, {4, 1});
  for (int i = 0; i < 4; ++i) p.as<float>()[i] = 0.75f;
  const ValueId a = add_op(g, "mm1", "MatMul", {x, w1}, h);
  const ValueId b = add_op(g, "mm2", "MatMul", {a, w2}, h);
  const ValueId draw = add_op(g, "draw", "Bernoulli", {g.add_initializer("p", p, true)}, m);
  g.nodes.back().attrs["dtype"] = int64_t{1};
  const ValueId survival = g.add_initializer("survival", scalar_tensor(0.75f), true);
  const ValueId scaled = add_op(g, "div", "Div", {draw, survival}, m);
  const ValueId kept = add_op(g, "mul", "Mul", {b, scaled}, h);
  const ValueId sum = add_op(g, "add", "Add", {a, kept}, h);
  g.outputs = {add_op(g, "mm3", "MatMul", {sum, w3}, TensorType{DType::kFloat32, {4, 8}})};
  g.rebuild_uses();
  return g;
}

TEST(TrainingMode, BernoulliBecomesSeededBernoulliOnTheDropoutKey) {
  Graph g = stochastic_depth_mlp();
  const TrainingForm form = to_training_mode(g, {.dropout = true});
  EXPECT_TRUE(form.dropout_key);
  EXPECT_EQ(form.draws, 1);
  EXPECT_EQ(form.dropouts, 0);
  const Node& n = g.nodes[2];
  EXPECT_EQ(n.op_type, "SeededBernoulli");
  EXPECT_EQ(n.domain, kPipetrainDomain);
  ASSERT_EQ(n.inputs.size(), 2u);
  EXPECT_EQ(g.value(n.inputs[0]).name, "p");
  EXPECT_EQ(n.inputs[1], g.find(kDropoutKey));
  EXPECT_EQ(n.attr_int("stream", 0), dropout_stream("draw"));
  // With Dropout in the same graph, one key serves both.
  Graph both = dropout_mlp();
  const ValueId p = both.add_initializer("p", random_tensor({4, 8}, 9), true);
  const ValueId y = both.add_value("draw.out", TensorType{DType::kFloat32, {4, 8}});
  both.add_node(Node{"draw", "Bernoulli", "", {p}, {y}, {}});
  both.outputs.push_back(y);
  both.rebuild_uses();
  const TrainingForm f2 = to_training_mode(both, {.dropout = true});
  EXPECT_EQ(f2.dropouts, 2);
  EXPECT_EQ(f2.draws, 1);
  EXPECT_EQ(std::count_if(both.inputs.begin(), both.inputs.end(),
                          [&](ValueId v) { return both.value(v).name == kDropoutKey; }),
            1);
}

// A Bernoulli the file holds (torch.bernoulli) draws in every form: run and evaluation
// (dropout_as_identity) and training with dropout off, as PyTorch's eval() does.
TEST(TrainingMode, FileBernoulliDrawsInEveryForm) {
  for (int form = 0; form < 3; ++form) {
    Graph g = stochastic_depth_mlp();
    g.file_draws.insert(g.nodes[2].name);
    if (form == 0) dropout_as_identity(g);
    else EXPECT_EQ(to_training_mode(g, {.dropout = form == 2}).draws, 1);
    EXPECT_NE(g.find(kDropoutKey), kNoValue);
    EXPECT_EQ(g.nodes[2].op_type, "SeededBernoulli");
    EXPECT_EQ(g.nodes[2].domain, kPipetrainDomain);
  }
}

// Dropout off and run/evaluation: the draw is its expected value, P itself (Cast where the dtype
// differs), so the branch is h * (0.75 / 0.75) = h exactly.
TEST(TrainingMode, BernoulliOffIsItsExpectedValue) {
  for (bool evaluation : {false, true}) {
    Graph g = stochastic_depth_mlp();
    if (evaluation) {
      dropout_as_identity(g);
    } else {
      EXPECT_EQ(to_training_mode(g, {}).draws, 0);
    }
    EXPECT_EQ(g.find(kDropoutKey), kNoValue);
    EXPECT_EQ(g.nodes[2].op_type, "Identity");
    EXPECT_EQ(g.nodes[2].domain, "");
    EXPECT_TRUE(g.nodes[2].attrs.empty());
  }
  Graph as_double = stochastic_depth_mlp();
  as_double.nodes[2].attrs["dtype"] = int64_t{11};
  as_double.value(as_double.nodes[2].outputs[0]).type.dtype = DType::kFloat64;
  dropout_as_identity(as_double);
  EXPECT_EQ(as_double.nodes[2].op_type, "Cast");
  EXPECT_EQ(as_double.nodes[2].attr_int("to", 0), 11);
  // Trains (no key, no draw) to finite gradients.
  Graph off = stochastic_depth_mlp();
  to_training_mode(off, {});
  const auto [grads, loss] = step_grads(off, 2, "none");
  EXPECT_EQ(grads.size(), 3u);
  EXPECT_TRUE(std::isfinite(loss));
}

// One key: the same gradients whole, cut in two and three, and under full recompute (B draws
// again the mask F drew). Another key: another mask, other gradients of w2 (dropped rows give it
// nothing).
TEST(TrainingMode, SeededBernoulliGradientsAreTheSameForEveryStageCountAndRecompute) {
  Graph g = stochastic_depth_mlp();
  to_training_mode(g, {.dropout = true});
  const auto [want, want_loss] = step_grads(g, 1, "none", 4321);
  for (int stages : {1, 2, 3})
    for (const char* policy : {"none", "full"}) {
      SCOPED_TRACE(std::to_string(stages) + " " + policy);
      const auto [have, loss] = step_grads(g, stages, policy, 4321);
      EXPECT_EQ(loss, want_loss);
      expect_bit_identical(have, want);
    }
  const Store other = step_grads(g, 1, "none", 5).first;
  EXPECT_NE(0, std::memcmp(other.at("w2").data.data(), want.at("w2").data.data(),
                           want.at("w2").data.size()));
}

// ---- errors ---------------------------------------------------------------------------------

void expect_user_error(Graph g, const TrainingModeOptions& o, const std::string& node,
                       const std::string& says) {
  try {
    to_training_mode(g, o);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("node '" + node + "'"), std::string::npos) << m;
    EXPECT_NE(m.find(says), std::string::npos) << m;
  }
}

// X [n, 3] -> BatchNormalization with running statistics as initializers (or, when `fed`, the
// mean as a graph input).
Graph batch_norm_graph(int64_t n, bool fed_mean = false) {
  Graph g;
  g.opsets = {{"", 17}};
  const TensorType xt{DType::kFloat32, {n, 3}};
  const ValueId x = g.add_value("x", xt);
  g.inputs = {x};
  std::vector<ValueId> in = {x};
  for (const char* p : {"scale", "bias", "bn.running_mean", "bn.running_var"}) {
    if (fed_mean && std::string(p) == "bn.running_mean") {
      in.push_back(g.add_value(p, TensorType{DType::kFloat32, {3}}));
      g.inputs.push_back(in.back());
    } else {
      in.push_back(g.add_initializer(p, random_tensor({3}, 3)));
    }
  }
  g.outputs = {add_op(g, "bn", "BatchNormalization", in, xt)};
  g.rebuild_uses();
  return g;
}

TEST(TrainingMode, ErrorsNameTheNode) {
  Graph ok = batch_norm_graph(2);
  EXPECT_EQ(to_training_mode(ok, {}).batch_norms.size(), 1u);
  expect_user_error(batch_norm_graph(1), {}, "bn", "fewer than two values per channel");
  expect_user_error(batch_norm_graph(2, true), {}, "bn", "not an initializer");
  Graph taken = batch_norm_graph(2);
  taken.add_value("bn.batch_mean", TensorType{DType::kFloat32, {3}});
  expect_user_error(taken, {}, "bn", "already has a value named 'bn.batch_mean'");

  Graph fed_ratio = dropout_mlp();
  const ValueId ratio = fed_ratio.add_value("fed_ratio", TensorType{DType::kFloat32, {}});
  fed_ratio.inputs.push_back(ratio);
  fed_ratio.nodes[2].inputs[1] = ratio;
  expect_user_error(fed_ratio, {.dropout = true}, "drop1", "ratio is not a constant");
  Graph key_taken = dropout_mlp();
  key_taken.add_value(kDropoutKey, TensorType{DType::kInt64, {}});
  expect_user_error(key_taken, {.dropout = true}, "drop1", "already has a value named");

  Graph double_draw = stochastic_depth_mlp();
  double_draw.nodes[2].attrs["dtype"] = int64_t{11};
  double_draw.value(double_draw.nodes[2].outputs[0]).type.dtype = DType::kFloat64;
  expect_user_error(double_draw, {.dropout = true}, "draw", "training draws take float32");
}

}  // namespace
}  // namespace pt
