// tests/exec/cuda/cuda_model_test.cc: whole models on the CUDA backend against the CPU backend.
// Every sample model in its training form (BatchNormTraining, SeededDropout) with the
// cross-entropy loss, as one chunk: F, B and W run through StageProgram on each backend with the
// same feeds (two micro-batches, gradients accumulated as ReferenceStep does), then
//   the loss within 1e-4 relative, every parameter gradient within 1e-3 of its largest element
//   (a model's gradient passes through tens of kernels, each within 1e-4, whose sums run in
//   different orders on the two backends), and a second CUDA step bit-identical to the first.
// SKIPPED without a GPU. The harness itself (feeds, F/B/W through copies) is checked on the CPU
// against ReferenceStep, bit for bit, and that check runs everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "autodiff/chunk_backward.h"
#include "autodiff/loss.h"
#include "autodiff/training_mode.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/cuda/cuda_backend.h"
#include "train/reference_step.h"
#include "exec/stage_program.h"
#include "tests/autodiff/sample_chunks.h"
#include "tests/exec/cuda/gradient_compare.h"
#include "tests/exec/test_tensors.h"

namespace pt {
namespace {

using Store = std::map<std::string, Tensor>;
constexpr int kMicroBatch = 2, kMicroBatches = 2;

using testing::random_tensor;

std::vector<BackwardGraphs> one_chunk(const std::string& name) {
  Graph g = testing::load_sample(name, kMicroBatch);
  to_training_mode(g, TrainingModeOptions{true});
  return testing::sample_chunks(g, 1);
}

// Per micro-batch: every graph input of F (model inputs, a dropout key), the target and the
// loss scale.
std::vector<Store> feeds(const BackwardGraphs& c) {
  const Graph& f = c.forward;
  int64_t classes = 1;
  for (const Node& n : f.nodes)
    if (n.op_type == "SoftmaxCrossEntropy") classes = f.value(n.inputs[0]).type.shape.back();
  std::mt19937 rng(11);
  std::vector<Store> out(kMicroBatches);
  for (int m = 0; m < kMicroBatches; ++m) {
    for (ValueId v : f.inputs) {
      const Value& val = f.value(v);
      if (val.name == kLossScale) {
        Tensor s = random_tensor(val.type, rng, 1);
        *s.as<float>() = 1.0f / (kMicroBatches * kMicroBatch);
        out[m][val.name] = std::move(s);
      } else if (val.name == kDropoutKey) {
        Tensor k = random_tensor(val.type, rng, 1);
        *k.as<int64_t>() = dropout_key_for(0, 0, m);
        out[m][val.name] = std::move(k);
      } else {
        out[m][val.name] = random_tensor(val.type, rng, val.name == kLossTarget ? classes : 16);
      }
    }
  }
  return out;
}

// One step (every micro-batch) of F, B, W on `backend`: the loss sum and the gradients.
struct Step {
  double loss = 0;
  Store grads;
};

void run(StageProgram& p, const Graph& g, Backend& b, Store& store) {
  std::vector<void*> mem;
  std::vector<Buffer> in;
  for (ValueId v : g.inputs) {
    const Tensor& t = store.at(g.value(v).name);
    void* d = b.allocate(std::max<size_t>(t.data.size(), 1));
    b.copy(d, t.data.data(), t.data.size());
    mem.push_back(d);
    in.push_back({d, &g.value(v).type});
  }
  p.run(in);
  for (size_t k = 0; k < g.outputs.size(); ++k)
    store[g.value(g.outputs[k]).name] = testing::download(b, p.output(k));
  for (void* d : mem) b.release(d);
}

Step step(const BackwardGraphs& c, const std::vector<Store>& micro_batches, Backend& b) {
  StageProgram f(c.forward, b), bi(c.backward_input, b), w(c.backward_weight, b);
  Step s;
  for (const std::string& p : c.params) {
    const Value& acc = c.backward_weight.value(c.backward_weight.find(grad_acc_name(p)));
    Tensor zero;
    zero.type = acc.type;
    zero.data.assign(static_cast<size_t>(zero.type.bytes()), std::byte{0});
    s.grads[p] = std::move(zero);
  }
  for (const Store& feed : micro_batches) {
    Store store = feed;
    run(f, c.forward, b, store);
    s.loss += *store.at(kLossOutput).as<float>();
    run(bi, c.backward_input, b, store);
    for (const std::string& p : c.params) store[grad_acc_name(p)] = s.grads.at(p);
    run(w, c.backward_weight, b, store);
    for (const std::string& p : c.params) s.grads[p] = std::move(store.at(grad_name(p)));
  }
  return s;
}

class CudaModel : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModel, OneStepMatchesCpu) {
  const std::string why = cuda::no_device_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::vector<BackwardGraphs> chunks = one_chunk(GetParam());
  ASSERT_EQ(chunks.size(), 1u);
  const std::vector<Store> in = feeds(chunks[0]);
  CpuBackend cpu(2);
  const Step want = step(chunks[0], in, cpu);
  cuda::CudaBackend gpu;
  const Step have = step(chunks[0], in, gpu);
  EXPECT_NEAR(have.loss, want.loss, 1e-4 * std::fabs(want.loss)) << "loss";
  const double largest = cuda_test::largest_gradient(want.grads);
  for (const auto& [p, w] : want.grads) {
    const Tensor& h = have.grads.at(p);
    ASSERT_EQ(h.type, w.type) << p;
    EXPECT_LE(cuda_test::gradient_error(p, w, h, largest), 1.0) << "gradient of " << p;
  }
  const Step again = step(chunks[0], in, gpu);
  EXPECT_EQ(again.loss, have.loss);
  for (const auto& [p, g] : have.grads) EXPECT_EQ(again.grads.at(p).data, g.data) << p;
}

// The step above, on the CPU, is ReferenceStep's: the GPU comparison rests on it.
TEST_P(CudaModel, HarnessIsReferenceStepOnCpu) {
  const std::vector<BackwardGraphs> chunks = one_chunk(GetParam());
  const std::vector<Store> in = feeds(chunks[0]);
  CpuBackend cpu(2);
  const Step mine = step(chunks[0], in, cpu);
  ReferenceStep ref(chunks, cpu);
  for (const Store& f : in) ref.run_micro_batch(f);
  EXPECT_EQ(mine.loss, ref.loss());
  ASSERT_EQ(mine.grads.size(), ref.grads().size());
  for (const auto& [p, g] : ref.grads()) EXPECT_EQ(mine.grads.at(p).data, g.data) << p;
  EXPECT_FALSE(mine.grads.empty());
}

// The premise of gradient_compare.h, on the CPU: every key bias gradient of the attention samples
// is under kNoise of the step's largest gradient, while the query bias beside it, the same shape
// and scale, is a real gradient well above that.
TEST_P(CudaModel, KeyBiasGradientIsNoise) {
  const std::vector<BackwardGraphs> chunks = one_chunk(GetParam());
  const std::vector<Store> in = feeds(chunks[0]);
  CpuBackend cpu(2);
  const Step s = step(chunks[0], in, cpu);
  const double largest = cuda_test::largest_gradient(s.grads);
  ASSERT_GT(largest, 0);
  int key_biases = 0;
  for (const auto& [p, g] : s.grads) {
    if (!cuda_test::is_key_bias(p)) continue;
    ++key_biases;
    EXPECT_LT(cuda_test::max_abs(g), cuda_test::kNoise * largest) << p << " of the step's " << largest;
    std::string q = p;
    q.replace(q.find("attn.k.bias"), 11, "attn.q.bias");
    ASSERT_TRUE(s.grads.count(q)) << q;
    EXPECT_GT(cuda_test::max_abs(s.grads.at(q)), 100 * cuda_test::kNoise * largest) << q;
  }
  const bool attention = GetParam() == "gpt" || GetParam() == "bert" || GetParam() == "vit";
  EXPECT_EQ(key_biases > 0, attention);
}

INSTANTIATE_TEST_SUITE_P(Samples, CudaModel,
                         ::testing::Values("mlp", "gpt", "bert", "vit", "resnet", "mobilenet"));

}  // namespace
}  // namespace pt
