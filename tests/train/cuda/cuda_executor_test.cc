// tests/train/cuda/cuda_executor_test.cc: the pipeline executor (train/executor.h) on the CUDA
// backend. mlp, gpt and resnet in their training form (BatchNorm batch statistics as side
// outputs, seeded Dropout), every schedule kind at 1 and 2 stages (1 or 2 chunks per stage, as
// the kind takes), every stage a CudaBackend of its own on GPU 0 with PeerComm between them:
//   the loss, every parameter gradient and every side output bit-identical to the 1-stage CUDA
//   run (the determinism contract holds on the GPU), and the same bits again in a second step;
//   the 1-stage CUDA run against the CPU executor: loss within 1e-4 relative, each gradient and
//   side output within 1e-3 of its largest element (as tests/exec/cuda/cuda_model_test.cc).
// SKIPPED without a GPU. The harness (feeds, partitions, the bit comparison) runs everywhere on
// CPU backends with InProcessComm, where every schedule must give the 1-stage CPU run's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>

#include "autodiff/chunk_backward.h"
#include "autodiff/loss.h"
#include "autodiff/training_mode.h"
#include "train/comm.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/cuda/cuda_backend.h"
#include "train/cuda/gpu_comm.h"
#include "train/executor.h"
#include "onnx_import/import.h"
#include "partition/cost_model.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "tests/autodiff/sample_chunks.h"
#include "tests/exec/cuda/gradient_compare.h"
#include "tests/exec/test_tensors.h"

namespace pt {
namespace {

constexpr int kMicroBatch = 2, kMicroBatches = 4;
using Feeds = std::vector<std::map<std::string, Tensor>>;

struct Model {
  Graph g;
  std::vector<std::string> side;  // batch mean, batch var per BatchNorm
};

Model load(const std::string& name) {
  Model m{testing::load_sample(name, kMicroBatch), {}};
  for (const BatchNormStats& bn : to_training_mode(m.g, TrainingModeOptions{true}).batch_norms) {
    m.side.push_back(bn.batch_mean);
    m.side.push_back(bn.batch_var);
  }
  return m;
}

std::vector<BackwardGraphs> chunks_of(const Graph& g, int stages, int chunks_per_stage) {
  return testing::sample_chunks(g, stages, "none", chunks_per_stage);
}

using testing::random_tensor;

// Per micro-batch: the model's inputs (the dropout key as the trainer makes it), a target in
// range, loss_scale = 1 / (M x micro-batch).
Feeds feeds_of(const Graph& g, const std::vector<BackwardGraphs>& chunks) {
  const Graph& last = chunks.back().forward;
  int64_t classes = 1;
  for (const Node& n : last.nodes)
    if (n.op_type == "SoftmaxCrossEntropy") classes = last.value(n.inputs[0]).type.shape.back();
  Feeds feeds(kMicroBatches);
  std::mt19937 rng(5);
  for (int m = 0; m < kMicroBatches; ++m) {
    auto& f = feeds[static_cast<size_t>(m)];
    for (ValueId v : g.inputs) {
      const Value& val = g.value(v);
      f[val.name] = random_tensor(val.type, rng, 16);
      if (val.name == kDropoutKey) *f[val.name].as<int64_t>() = dropout_key_for(0, 0, m);
    }
    f[kLossTarget] = random_tensor(last.value(last.find(kLossTarget)).type, rng, classes);
    Tensor scale = random_tensor(TensorType{DType::kFloat32, {}}, rng, 1);
    *scale.as<float>() = 1.0f / (kMicroBatches * kMicroBatch);
    f[kLossScale] = std::move(scale);
  }
  return feeds;
}

// The executor's devices; the comm goes before the backends it uses.
struct Devices {
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> list;
  std::unique_ptr<Comm> comm;
};
using MakeDevices = std::function<Devices(int)>;

Devices cpu_devices(int n) {
  Devices d;
  for (int i = 0; i < n; ++i) {
    d.owned.push_back(std::make_unique<CpuBackend>(1));
    d.list.push_back(d.owned.back().get());
  }
  d.comm = std::make_unique<InProcessComm>();
  return d;
}

// n pipeline devices on GPU 0, a stream each.
Devices cuda_devices(int n) {
  Devices d;
  std::vector<cuda::CudaBackend*> gpus;
  for (int i = 0; i < n; ++i) {
    auto b = std::make_unique<cuda::CudaBackend>(cuda::CudaOptions{0, cuda::Precision::kFloat32});
    gpus.push_back(b.get());
    d.list.push_back(b.get());
    d.owned.push_back(std::move(b));
  }
  d.comm = std::make_unique<cuda::PeerComm>(gpus);
  return d;
}

struct Result {
  double loss = 0;
  std::map<std::string, Tensor> grads;
  std::vector<std::vector<Tensor>> side;  // [micro-batch]
};

Result result_of(const PipelineExecutor& ex) {
  Result r{ex.loss(), ex.grads(), {}};
  for (int m = 0; m < kMicroBatches; ++m) r.side.push_back(ex.side_outputs(m));
  return r;
}

void expect_same_bits(const Result& want, const Result& have) {
  EXPECT_EQ(want.loss, have.loss);
  ASSERT_EQ(want.grads.size(), have.grads.size());
  for (const auto& [p, t] : want.grads) {
    const Tensor& got = have.grads.at(p);
    ASSERT_EQ(t.type, got.type) << p;
    EXPECT_EQ(0, std::memcmp(t.data.data(), got.data.data(), t.data.size())) << "gradient of " << p;
  }
  ASSERT_EQ(want.side.size(), have.side.size());
  for (size_t m = 0; m < want.side.size(); ++m)
    for (size_t i = 0; i < want.side[m].size(); ++i)
      EXPECT_EQ(want.side[m][i].data, have.side[m][i].data) << "side output " << i << " of micro-batch " << m;
}

// Largest |have - want| over the largest |want|, of float32 tensors of one type.
double relative_error(const Tensor& want, const Tensor& have) {
  double scale = 1e-30, worst = 0;
  for (int64_t i = 0; i < want.type.numel(); ++i) scale = std::max(scale, double(std::fabs(want.as<float>()[i])));
  for (int64_t i = 0; i < want.type.numel(); ++i)
    worst = std::max(worst, std::fabs(double(have.as<float>()[i]) - want.as<float>()[i]) / scale);
  return worst;
}

void expect_close(const Result& cpu, const Result& gpu) {
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-4 * std::fabs(cpu.loss)) << "loss";
  ASSERT_EQ(cpu.grads.size(), gpu.grads.size());
  const double largest = cuda_test::largest_gradient(cpu.grads);
  for (const auto& [p, t] : cpu.grads) {
    ASSERT_EQ(t.type, gpu.grads.at(p).type) << p;
    EXPECT_LE(cuda_test::gradient_error(p, t, gpu.grads.at(p), largest), 1.0) << "gradient of " << p;
  }
  for (size_t m = 0; m < cpu.side.size(); ++m)
    for (size_t i = 0; i < cpu.side[m].size(); ++i)
      EXPECT_LE(relative_error(cpu.side[m][i], gpu.side[m][i]), 1e-3) << "side output " << i;
}

// Two steps of a compute-only schedule; the second (every slot and message reused) must
// repeat the first's bits.
Result run(const std::vector<BackwardGraphs>& chunks, const Schedule& compute_only,
           const MakeDevices& make, const Feeds& feeds, const std::vector<std::string>& side) {
  const Schedule s = add_send_recv(compute_only);
  Devices d = make(s.stages);
  std::vector<int> placement;
  for (int c = 0; c < s.total_chunks(); ++c) placement.push_back(s.device_of(c));
  PipelineExecutor ex(chunks, placement, d.list, *d.comm, s, side);
  ex.run_step(feeds);
  const Result first = result_of(ex);
  ex.run_step(feeds);
  {
    SCOPED_TRACE("second step");
    expect_same_bits(first, result_of(ex));
  }
  return first;
}

// Every kind at 1 and 2 stages against the 1-stage 1F1B run on the same devices; returns that.
Result check_every_schedule(const std::string& sample, const MakeDevices& make) {
  const Model model = load(sample);
  const std::vector<BackwardGraphs> one = chunks_of(model.g, 1, 1);
  const Feeds feeds = feeds_of(model.g, one);
  const Result want = run(one, generate("1f1b", 1, kMicroBatches), make, feeds, model.side);
  EXPECT_FALSE(want.grads.empty());
  int ran = 0;
  for (int stages : {1, 2})
    for (int v : {1, 2}) {
      std::vector<BackwardGraphs> chunks;
      try {
        chunks = chunks_of(model.g, stages, v);
      } catch (const UserError& e) {
        std::cout << "[ skipped  ] " << sample << " P=" << stages << " V=" << v << ": " << e.what() << "\n";
        continue;
      }
      for (const KindInfo& kind : schedule_kinds()) {
        if (v < kind.min_chunks || v > kind.max_chunks) continue;
        Schedule s;
        try {
          s = generate(kind.name, stages, kMicroBatches, v);
        } catch (const UserError&) {
          continue;  // the kind does not exist at this size
        }
        SCOPED_TRACE(sample + " " + kind.name + " P=" + std::to_string(stages) + " V=" + std::to_string(v));
        expect_same_bits(want, run(chunks, s, make, feeds, model.side));
        ++ran;
      }
    }
  std::cout << "[ ran      ] " << sample << ": " << ran << " schedules\n";
  EXPECT_GE(ran, static_cast<int>(schedule_kinds().size()));  // every kind at 2 stages at least
  return want;
}

class CudaExecutor : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaExecutor, EveryScheduleBitIdenticalToOneStageAndCloseToCpu) {
  const std::string why = cuda::no_device_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const Result gpu = check_every_schedule(GetParam(), cuda_devices);
  const Model model = load(GetParam());
  const std::vector<BackwardGraphs> one = chunks_of(model.g, 1, 1);
  const Result cpu = run(one, generate("1f1b", 1, kMicroBatches), cpu_devices,
                         feeds_of(model.g, one), model.side);
  expect_close(cpu, gpu);
}

INSTANTIATE_TEST_SUITE_P(Samples, CudaExecutor, ::testing::Values("mlp", "gpt", "resnet"));

// The same harness on the CPU backend, where the executor's bits are ReferenceStep's
// (tests/train/executor_test.cc): every schedule must reproduce the 1-stage run.
class CudaExecutorHarness : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaExecutorHarness, EveryScheduleBitIdenticalToOneStageOnCpu) {
  check_every_schedule(GetParam(), cpu_devices);
}

INSTANTIATE_TEST_SUITE_P(Samples, CudaExecutorHarness, ::testing::Values("mlp", "resnet"));

}  // namespace
}  // namespace pt
