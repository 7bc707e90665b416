// F, B and W graphs of the samples: what crosses between them, what needs no gradient, and what
// each recompute policy keeps; every policy's gradients are bit-identical to `none`'s.
#include "autodiff/backward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include "autodiff/chunk_backward.h"
#include "core/error.h"
#include "exec/cpu/cpu_backend.h"
#include "train/reference_step.h"
#include "tests/autodiff/sample_chunks.h"

namespace pt {
namespace {

const char* const kSamples[] = {"mlp", "gpt", "bert", "vit", "resnet", "mobilenet"};

using testing::load_sample;
using testing::sample_chunks;

std::set<std::string> input_names(const Graph& g) {
  std::set<std::string> s;
  for (ValueId v : g.inputs) s.insert(g.value(v).name);
  return s;
}

std::set<std::string> output_names(const Graph& g) {
  std::set<std::string> s;
  for (ValueId v : g.outputs) s.insert(g.value(v).name);
  return s;
}

// B reads only output gradients and what F kept; W only what B passed, what F kept and its
// accumulators; so B never waits for W, and the sets named in BackwardGraphs are exact.
TEST(Backward, GraphsReadOnlyWhatIsHandedToThem) {
  for (const char* name : kSamples) {
    SCOPED_TRACE(name);
    const Graph g = load_sample(name, 2);
    for (const BackwardGraphs& b : sample_chunks(g, 3, "selective")) {
      const std::set<std::string> f_out = output_names(b.forward), f_in = input_names(b.forward);
      const std::set<std::string> b_out = output_names(b.backward_input);
      for (const std::string& k : b.kept) EXPECT_TRUE(f_out.count(k) || f_in.count(k)) << k;
      for (const std::string& in : input_names(b.backward_input)) {
        const bool grad_in = std::count(b.output_grads.begin(), b.output_grads.end(), in) > 0;
        const bool kept = std::count(b.kept.begin(), b.kept.end(), in) > 0;
        EXPECT_TRUE(grad_in || kept) << "B reads " << in;
      }
      for (const std::string& in : input_names(b.backward_weight)) {
        const bool passed = std::count(b.passed.begin(), b.passed.end(), in) > 0;
        const bool kept = std::count(b.kept_for_weight.begin(), b.kept_for_weight.end(), in) > 0;
        EXPECT_TRUE(passed || kept || in.rfind("grad_acc.", 0) == 0) << "W reads " << in;
      }
      for (const std::string& p : b.passed) EXPECT_TRUE(b_out.count(p)) << p;
      for (const std::string& p : b.params)
        EXPECT_TRUE(output_names(b.backward_weight).count(grad_name(p))) << p;
    }
  }
}

// Token ids and images need no gradient: the first chunk's B returns none for them.
TEST(Backward, ModelInputsGetNoGradient) {
  for (const char* name : kSamples) {
    const Graph g = load_sample(name, 2);
    const std::vector<BackwardGraphs> chunks = sample_chunks(g, 2, "none");
    EXPECT_TRUE(chunks.front().input_grads.empty()) << name;
    EXPECT_FALSE(chunks.back().input_grads.empty()) << name;
  }
}

// Weight gradients of MatMul/Gemm/Conv are W's work, not B's.
TEST(Backward, WeightGradientsOfMatMulsLiveInW) {
  const Graph g = load_sample("gpt", 2);
  for (const BackwardGraphs& b : sample_chunks(g, 2, "none")) {
    int gemms = 0;
    for (const Node& n : b.backward_weight.nodes) gemms += n.op_type == "Gemm";
    EXPECT_GT(gemms, 0);
  }
}

std::map<std::string, Tensor> random_feeds(const Graph& g, const BackwardGraphs& first,
                                           const BackwardGraphs& last, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::map<std::string, Tensor> feeds;
  const auto fill = [&](const Graph& graph, const std::string& name, int64_t classes) {
    Tensor t;
    t.type = graph.value(graph.find(name)).type;
    t.data.resize(static_cast<size_t>(t.type.bytes()));
    for (int64_t i = 0; i < t.type.numel(); ++i) {
      if (t.type.dtype == DType::kFloat32) t.as<float>()[i] = normal(rng);
      if (t.type.dtype == DType::kInt64) t.as<int64_t>()[i] = static_cast<int64_t>(rng() % classes);
    }
    feeds[name] = std::move(t);
  };
  for (ValueId v : g.inputs) fill(first.forward, g.value(v).name, 16);
  int64_t classes = 1;
  for (const Node& n : last.forward.nodes)
    if (n.op_type == "SoftmaxCrossEntropy") classes = last.forward.value(n.inputs[0]).type.shape.back();
  fill(last.forward, kLossTarget, classes);
  Tensor scale;
  scale.type = TensorType{DType::kFloat32, {}};
  scale.data.resize(4);
  const float s = 0.125f;
  std::memcpy(scale.data.data(), &s, 4);
  feeds[kLossScale] = std::move(scale);
  return feeds;
}

// Every policy gives the very same bits as `none` (recompute re-runs the same kernels on the
// same inputs), and kept bytes fall as the policy promises: none >= selective >= full.
TEST(Backward, EveryRecomputePolicyIsBitIdenticalAndKeepsLess) {
  for (const char* name : kSamples) {
    SCOPED_TRACE(name);
    const Graph g = load_sample(name, 2);
    std::map<std::string, Tensor> reference;
    std::map<std::string, int64_t> kept;
    for (const char* policy : {"none", "selective", "every:1", "every:2", "full", "budget:200KiB"}) {
      SCOPED_TRACE(policy);
      const std::vector<BackwardGraphs> chunks = sample_chunks(g, 2, policy);
      CpuBackend backend(2);
      ReferenceStep step(chunks, backend);
      for (unsigned mb = 0; mb < 2; ++mb)
        step.run_micro_batch(random_feeds(g, chunks.front(), chunks.back(), mb));
      int64_t planned = 0, measured = 0;
      for (size_t c = 0; c < chunks.size(); ++c) {
        planned += chunks[c].kept_bytes;
        measured += step.kept_bytes()[c];
      }
      EXPECT_EQ(planned, measured);
      kept[policy] = planned;
      if (reference.empty()) {
        reference = step.grads();
        continue;
      }
      ASSERT_EQ(step.grads().size(), reference.size());
      for (const auto& [p, t] : step.grads())
        EXPECT_EQ(0, std::memcmp(t.data.data(), reference.at(p).data.data(), t.data.size())) << p;
    }
    // The MLP's ReLU outputs and the Gemm outputs selective keeps instead are the same size.
    if (std::string(name) == "mlp")
      EXPECT_LE(kept["selective"], kept["none"]);
    else
      EXPECT_LT(kept["selective"], kept["none"]);
    EXPECT_LE(kept["every:2"], kept["every:1"]);
    EXPECT_LE(kept["full"], kept["every:2"]);
    EXPECT_LT(kept["full"], kept["selective"]);
  }
}

TEST(Backward, BudgetFitsAndPrefersFewerFlops) {
  const Graph g = load_sample("gpt", 4);
  const std::vector<BackwardGraphs> none = sample_chunks(g, 1, "none");
  const std::vector<BackwardGraphs> full = sample_chunks(g, 1, "full");
  const int64_t budget = (none[0].kept_bytes + full[0].kept_bytes) / 2;
  const std::vector<BackwardGraphs> mid = sample_chunks(g, 1, "budget:" + std::to_string(budget));
  EXPECT_LE(mid[0].kept_bytes, budget);
  EXPECT_LT(mid[0].recompute_flops, full[0].recompute_flops);
  EXPECT_EQ(sample_chunks(g, 1, "budget:" + std::to_string(none[0].kept_bytes))[0].recompute_flops, 0);
  EXPECT_THROW(sample_chunks(g, 1, "budget:" + std::to_string(full[0].kept_bytes - 1)), UserError);
}

TEST(Backward, PolicyTextIsCheckedAndRoundTrips) {
  for (const char* p : {"none", "full", "selective", "every:3", "budget:1024"})
    EXPECT_EQ(RecomputePolicy::parse(p, "x").str(), p);
  EXPECT_EQ(RecomputePolicy::parse("budget:1KiB", "x").budget_bytes, 1024);
  for (const char* bad : {"every:0", "every:x", "some", "budget:lots"})
    EXPECT_THROW(RecomputePolicy::parse(bad, "--recompute"), UserError) << bad;
}

}  // namespace
}  // namespace pt
