// PipelineExecutor: every schedule kind gives the very bits of ReferenceStep (loss and every
// parameter gradient) and sends each link's messages in the order it plans (Comm::plan_order),
// a failing action stops every device with one named error, and the kept
// bytes measured per device are what the simulator predicts from the schedule's order.
#include "train/executor.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <regex>
#include <thread>
#include <tuple>

#include "autodiff/chunk_backward.h"
#include "autodiff/loss.h"
#include "train/comm.h"
#include "exec/cpu/cpu_backend.h"
#include "train/reference_step.h"
#include "train/timeline.h"
#include "onnx_import/import.h"
#include "partition/cost_model.h"
#include "plan/chunk_costs.h"
#include "plan/memory.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"
#include "tests/autodiff/sample_chunks.h"
#include "tests/exec/test_tensors.h"
#include "tests/exec/counting_backend.h"

namespace pt {
namespace {

constexpr int kMicroBatch = 2;
constexpr int kMicroBatches = 4;
using Feeds = std::vector<std::map<std::string, Tensor>>;

Graph load(const std::string& name) { return testing::load_sample(name, kMicroBatch); }

std::vector<BackwardGraphs> chunks_of(const Graph& g, int stages, int chunks_per_stage,
                                      const std::string& recompute = "none") {
  return testing::sample_chunks(g, stages, recompute, chunks_per_stage);
}

using testing::random_tensor;

Feeds random_feeds(const Graph& g, const std::vector<BackwardGraphs>& chunks) {
  return testing::step_feeds(g, chunks, kMicroBatches, kMicroBatch);
}

struct Reference {
  double loss = 0;
  std::map<std::string, Tensor> grads;
};

Reference run_reference(const std::vector<BackwardGraphs>& chunks, const Feeds& feeds) {
  CpuBackend backend(1);
  ReferenceStep step(chunks, backend);
  for (const auto& f : feeds) step.run_micro_batch(f);
  return {step.loss(), step.grads()};
}

// The executor's devices: one CpuBackend each (one thread: the test machine has two cores).
struct Devices {
  std::vector<std::unique_ptr<CpuBackend>> owned;
  std::vector<Backend*> backends;
  explicit Devices(int n) {
    for (int d = 0; d < n; ++d) {
      owned.push_back(std::make_unique<CpuBackend>(1));
      backends.push_back(owned.back().get());
    }
  }
};

std::vector<int> placement(const Schedule& s) {
  std::vector<int> out;
  for (int c = 0; c < s.total_chunks(); ++c) out.push_back(s.device_of(c));
  return out;
}

void expect_same_bits(const Reference& ref, const PipelineExecutor& ex) {
  EXPECT_EQ(ref.loss, ex.loss());
  ASSERT_EQ(ref.grads.size(), ex.grads().size());
  for (const auto& [p, t] : ref.grads) {
    const Tensor& got = ex.grads().at(p);
    ASSERT_EQ(t.type, got.type) << p;
    EXPECT_EQ(0, std::memcmp(t.data.data(), got.data.data(), t.data.size())) << p;
  }
}

// An InProcessComm that holds the executor to its plan (Comm::plan_order), which NCCL between
// ranks receives by: every link's sends come in the planned order with the planned sizes, and a
// step sends every planned message.
class PlanCheckingComm : public InProcessComm {
 public:
  void plan_order(const std::vector<PlannedMessage>& sends) override {
    for (const PlannedMessage& m : sends) planned_[{m.from, m.to}].push_back(m);
  }
  void send(std::string_view name, int micro_batch, int from, int to, const void* data, size_t bytes) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const std::vector<PlannedMessage>& plan = planned_[{from, to}];
      size_t& k = next_[{from, to}];
      EXPECT_LT(k, plan.size()) << "an unplanned send from device " << from << " to " << to;
      if (k < plan.size()) {
        EXPECT_EQ(plan[k].name, name);
        EXPECT_EQ(plan[k].micro_batch, micro_batch);
        EXPECT_EQ(plan[k].bytes, bytes);
      }
      ++k;
    }
    InProcessComm::send(name, micro_batch, from, to, data, bytes);
  }
  // Every planned message of the step was sent.
  void expect_step_complete() {
    for (const auto& [link, plan] : planned_) EXPECT_EQ(next_[link], plan.size()) << link.first << " -> " << link.second;
    next_.clear();
  }
  size_t links() const { return planned_.size(); }

 private:
  std::mutex mu_;
  std::map<std::pair<int, int>, std::vector<PlannedMessage>> planned_;
  std::map<std::pair<int, int>, size_t> next_;
};

// Runs `s` (compute-only) on the chunks and checks bits, the planned order of every link's sends,
// kept bytes and the timing record.
void check_schedule(const std::vector<BackwardGraphs>& chunks, const Schedule& compute_only,
                    const Feeds& feeds, const Reference& ref) {
  const Schedule s = add_send_recv(compute_only);
  Devices devices(s.stages);
  PlanCheckingComm comm;
  PipelineExecutor ex(chunks, placement(s), devices.backends, comm, s);
  if (s.stages > 1) {
    EXPECT_GT(comm.links(), 0u);
  }
  for (int step = 0; step < 2; ++step) {  // a second step reuses every slot and message
    SCOPED_TRACE("step " + std::to_string(step));
    ex.time_cpu(step == 0);
    ex.run_step(feeds);
    expect_same_bits(ref, ex);
    comm.expect_step_complete();
    if (step == 1) {  // not asked for: none read
      for (const auto& times : ex.action_times())
        for (const ActionTime& t : times) EXPECT_EQ(t.cpu, -1);
      continue;
    }
    // Thread CPU time for the compute actions alone, none of it outside the action's span (the
    // slack: the two wall-clock reads inside the CPU clock's, and a read's own cost varying).
    double cpu = 0, wall = 0;
    for (int d = 0; d < s.stages; ++d) {
      const auto& times = ex.action_times()[static_cast<size_t>(d)];
      for (size_t i = 0; i < times.size(); ++i) {
        const bool compute = is_compute(s.devices[static_cast<size_t>(d)][i].op);
        if (!compute) {
          EXPECT_EQ(times[i].cpu, -1);
          continue;
        }
        EXPECT_GE(times[i].cpu, 0);
        EXPECT_LE(times[i].cpu, times[i].end - times[i].start + 100e-6);
        cpu += times[i].cpu;
        wall += times[i].end - times[i].start;
      }
    }
    EXPECT_GT(cpu, 0);
    EXPECT_LE(cpu, wall + 1e-3);
  }
  const std::vector<double> predicted = peak_memory(s, chunk_costs(chunks));
  for (int d = 0; d < s.stages; ++d) {
    EXPECT_EQ(static_cast<int64_t>(predicted[static_cast<size_t>(d)]),
              ex.peak_kept_bytes()[static_cast<size_t>(d)]) << "device " << d;
    const auto& times = ex.action_times()[static_cast<size_t>(d)];
    ASSERT_EQ(times.size(), s.devices[static_cast<size_t>(d)].size());
    for (size_t i = 0; i < times.size(); ++i) {
      EXPECT_LE(times[i].start, times[i].end);
      if (i > 0) {
        EXPECT_LE(times[i - 1].end, times[i].start);
      }
    }
  }
}

class EverySchedule : public ::testing::TestWithParam<const char*> {};

// Every kind x stages {1, 2, 4} (chunks per stage as the kind wants): loss and every gradient
// bit-identical to ReferenceStep, measured peak kept bytes equal to the simulator's.
TEST_P(EverySchedule, BitIdenticalToReference) {
  const std::string sample = GetParam();
  const Graph g = load(sample);
  int ran = 0;
  std::vector<std::string> skipped;
  for (int stages : {1, 2, 4}) {
    for (int v : {1, 2}) {
      std::vector<BackwardGraphs> chunks;
      try {
        chunks = chunks_of(g, stages, v);
      } catch (const UserError& e) {
        skipped.push_back("P=" + std::to_string(stages) + " V=" + std::to_string(v) +
                          " partition: " + e.what());
        continue;
      }
      const Feeds feeds = random_feeds(g, chunks);
      const Reference ref = run_reference(chunks, feeds);
      for (const KindInfo& kind : schedule_kinds()) {
        if (v < kind.min_chunks || v > kind.max_chunks) continue;
        SCOPED_TRACE(sample + " " + kind.name + " P=" + std::to_string(stages));
        Schedule s;
        try {
          s = generate(kind.name, stages, kMicroBatches, v);
        } catch (const UserError& e) {
          skipped.push_back(kind.name + " P=" + std::to_string(stages) + ": " + e.what());
          continue;
        }
        check_schedule(chunks, s, feeds, ref);
        ++ran;
      }
    }
  }
  for (const std::string& s : skipped) std::cout << "[ skipped  ] " << sample << " " << s << "\n";
  std::cout << "[ ran      ] " << sample << ": " << ran << " schedules\n";
  EXPECT_GE(ran, 18);  // at least every kind at 2 and 4 stages
}

INSTANTIATE_TEST_SUITE_P(Samples, EverySchedule, ::testing::Values("mlp", "gpt", "resnet"));

// W of a later micro-batch first (every W moved to the end of its device, newest first): its
// gradient is held and added in micro-batch order, still the reference's bits.
// Under every recompute policy the executor still gives the reference's bits, and keeps exactly
// the bytes the simulator predicts for the policy's kept and passed tensors.
TEST(Executor, RecomputePoliciesKeepWhatTheSimulatorPredicts) {
  const Graph g = load("gpt");
  for (const char* policy : {"selective", "full", "every:2"}) {
    SCOPED_TRACE(policy);
    const std::vector<BackwardGraphs> chunks = chunks_of(g, 2, 2, policy);
    const Feeds feeds = random_feeds(g, chunks);
    const Reference ref = run_reference(chunks, feeds);
    for (const char* kind : {"zb-v", "interleaved"}) {
      SCOPED_TRACE(kind);
      check_schedule(chunks, generate(kind, 2, kMicroBatches, 2), feeds, ref);
    }
  }
}

TEST(Executor, WeightGradientsOutOfOrderAreAddedInOrder) {
  const Graph g = load("gpt");
  for (int stages : {1, 2}) {
    SCOPED_TRACE(stages);
    const std::vector<BackwardGraphs> chunks = chunks_of(g, stages, 1);
    const Feeds feeds = random_feeds(g, chunks);
    Schedule s = generate("zb-h1", stages, kMicroBatches);
    for (auto& list : s.devices) {
      std::vector<Action> ws;
      std::erase_if(list, [&](const Action& a) {
        if (a.op == Op::kW) ws.push_back(a);
        return a.op == Op::kW;
      });
      list.insert(list.end(), ws.rbegin(), ws.rend());
    }
    check_schedule(chunks, s, feeds, run_reference(chunks, feeds));
  }
}

using testing::CountingBackend;

// Each device allocates one arena for its chunks' F, B and W programs, and its tensors are what
// the plan counts for the device (plan/memory.h: no room for the outputs placed on every run,
// the largest program's), to the byte on a backend that fuses nothing; the kernels' scratch
// (oneDNN's scratchpads) is placed around them, which the plan does not see. The step still
// gives the reference's bits.
TEST(Executor, EachDeviceAllocatesTheArenaThePlanCounts) {
  const Graph g = load("gpt");
  for (int stages : {1, 2, 4}) {
    SCOPED_TRACE(stages);
    const std::vector<BackwardGraphs> chunks = chunks_of(g, stages, 1);
    const Feeds feeds = random_feeds(g, chunks);
    const Schedule s = add_send_recv(generate("1f1b", stages, kMicroBatches));
    std::vector<std::unique_ptr<CountingBackend>> owned;
    std::vector<Backend*> backends;
    for (int d = 0; d < stages; ++d) {
      owned.push_back(std::make_unique<CountingBackend>());
      backends.push_back(owned.back().get());
    }
    InProcessComm comm;
    PipelineExecutor ex(chunks, placement(s), backends, comm, s);
    const std::vector<DeviceLoad> plan = device_loads(chunks, s, chunk_costs(chunks));
    for (int d = 0; d < stages; ++d) {
      SCOPED_TRACE("device " + std::to_string(d));
      const int64_t arena = ex.arena_bytes()[static_cast<size_t>(d)];
      const std::vector<size_t>& allocated = owned[static_cast<size_t>(d)]->allocated;
      EXPECT_EQ(std::count(allocated.begin(), allocated.end(), static_cast<size_t>(arena)), 1);
      EXPECT_EQ(ex.arena_tensor_bytes()[static_cast<size_t>(d)], plan[static_cast<size_t>(d)].arena_bytes);
      EXPECT_GE(arena, ex.arena_tensor_bytes()[static_cast<size_t>(d)]);
    }
    ex.run_step(feeds);
    expect_same_bits(run_reference(chunks, feeds), ex);
  }
}

// A target out of range on micro-batch 2 fails F of the last chunk there: every device stops
// (none hangs in a receive), the one-line error names the step, device, action and cause, and
// the grid marks the action. The next step runs normally.
TEST(Executor, FailingActionStopsEveryDeviceWithOneNamedError) {
  const Graph g = load("mlp");
  const std::vector<BackwardGraphs> chunks = chunks_of(g, 2, 1);
  Feeds feeds = random_feeds(g, chunks);
  const Feeds good = feeds;
  Tensor& target = feeds[2][kLossTarget];
  target.as<int64_t>()[0] = 1000000;
  const Schedule s = add_send_recv(generate("1f1b", 2, kMicroBatches));
  Devices devices(2);
  InProcessComm comm;
  PipelineExecutor ex(chunks, placement(s), devices.backends, comm, s);
  auto run = std::async(std::launch::async, [&] {
    try {
      ex.run_step(feeds);
    } catch (const ExecutionError& e) {
      return std::pair<std::string, std::string>(e.what(), e.grid());
    }
    return std::pair<std::string, std::string>("no error", "");
  });
  if (run.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "run_step hangs after a failing action";
    std::abort();  // the workers cannot be joined
  }
  const auto [what, grid] = run.get();
  EXPECT_TRUE(std::regex_search(what, std::regex(
                  R"(^training step 0, device 1, step \d+ \(1F2\): .*target 1000000)")))
      << what;
  EXPECT_EQ(what.find('\n'), std::string::npos);
  EXPECT_NE(grid.find("[1F2]"), std::string::npos) << grid;
  ex.run_step(good);
  expect_same_bits(run_reference(chunks, good), ex);
}

TEST(Executor, PlacementMustMatchTheSchedule) {
  const Graph g = load("mlp");
  const std::vector<BackwardGraphs> chunks = chunks_of(g, 2, 1);
  const Schedule s = add_send_recv(generate("1f1b", 2, kMicroBatches));
  Devices devices(2);
  InProcessComm comm;
  EXPECT_THROW(PipelineExecutor(chunks, {1, 0}, devices.backends, comm, s), UserError);
  EXPECT_THROW(PipelineExecutor(chunks, placement(s), devices.backends, comm,
                                generate("1f1b", 2, kMicroBatches)),
               UserError);  // not lowered
}

// Seconds-free: the voluntary context switches of the calling thread (each time it blocked).
long blocked_times() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_nvcsw;
}

// A send wakes only its receiving device: device 2 waits through 200 messages to device 1 and
// blocks a handful of times, not once per message (with one wake-up for every device it was
// woken by each, and on shared cores those wake-ups preempted the device at work).
TEST(InProcessComm, ASendWakesOnlyItsReceiver) {
  InProcessComm comm;
  std::promise<long> blocked;
  std::thread waiter([&] {
    const long before = blocked_times();
    float x = 0;
    comm.recv("x", 0, 0, 2, &x, sizeof x);
    blocked.set_value(blocked_times() - before);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the waiter is asleep in recv
  for (int m = 0; m < 200; ++m) {
    const float v = static_cast<float>(m);
    float got = -1;
    comm.send("y", m, 0, 1, &v, sizeof v);
    comm.recv("y", m, 0, 1, &got, sizeof got);
    EXPECT_EQ(got, v);
    std::this_thread::sleep_for(std::chrono::microseconds(100));  // time to fall asleep again
  }
  const float one = 1;
  comm.send("x", 0, 0, 2, &one, sizeof one);
  waiter.join();
  EXPECT_LT(blocked.get_future().get(), 20);
}

}  // namespace
}  // namespace pt

namespace pt {
namespace {

// Issue 43: the gpt, charlm, bert and vit samples imported with their attention fused (FusedAttention,
// onnx_import/attention_fusion.h) train as the unfused program does within float rounding (loss
// and every parameter gradient within 1e-5 of the largest), and every schedule of the fused
// program gives the reference's very bits, at 1, 2 and 4 stages and under selective recompute.
TEST(Executor, FusedAttentionTrainsAsTheUnfusedAndBitIdenticallyAcrossSchedules) {
  for (const char* sample : {"gpt", "charlm", "bert", "vit"}) {
    SCOPED_TRACE(sample);
    ImportOptions o;
    o.batch = kMicroBatch;
    const Graph plain = load(sample);
    o.fuse_attention = true;
    o.fuse_attention_from = 1;  // the samples' contexts are short
    const Graph fused = import_model(std::string("samples/") + sample + "/" + sample + ".onnx", o);
    const std::vector<BackwardGraphs> plain_chunks = chunks_of(plain, 1, 1);
    const Feeds feeds = random_feeds(plain, plain_chunks);
    const Reference want = run_reference(plain_chunks, feeds);
    for (const auto& [stages, v, policy] : {std::tuple{1, 1, "none"}, std::tuple{2, 1, "selective"},
                                            std::tuple{4, 2, "none"}}) {
      SCOPED_TRACE("P=" + std::to_string(stages) + " " + policy);
      const std::vector<BackwardGraphs> chunks = chunks_of(fused, stages, v, policy);
      int attention = 0;
      for (const BackwardGraphs& c : chunks)
        for (const Node& n : c.forward.nodes) attention += n.op_type == "FusedAttention";
      EXPECT_GT(attention, 0);
      const Reference ref = run_reference(chunks, feeds);
      EXPECT_NEAR(ref.loss, want.loss, 1e-5 * std::fabs(want.loss));
      ASSERT_EQ(ref.grads.size(), want.grads.size());
      // Relative to the largest gradient of the model: an attention key bias has a zero gradient in
      // exact arithmetic (softmax ignores a shift shared by every key), so both programs give it
      // rounding noise of their own, which no scale of its own can hold.
      double top = 1e-30, worst = 0;
      std::string where;
      for (const auto& [p, t] : want.grads)
        for (int64_t i = 0; i < t.type.numel(); ++i) top = std::max(top, std::fabs(double(t.as<float>()[i])));
      for (const auto& [p, t] : want.grads) {
        const Tensor& got = ref.grads.at(p);
        for (int64_t i = 0; i < t.type.numel(); ++i) {
          const double e = std::fabs(double(got.as<float>()[i]) - t.as<float>()[i]);
          if (e > worst) worst = e, where = p;
        }
      }
      EXPECT_LE(worst / top, 1e-5) << where;
      std::cout << "[ fused    ] " << sample << " P=" << stages << ": loss " << want.loss << " vs " << ref.loss
                << ", worst gradient difference " << worst / top << " of the largest (" << where << ")\n";
      for (const char* kind : {"1f1b", "zb-h1", "zb-v"}) {
        const int chunks_per = std::string(kind) == "zb-v" ? 2 : 1;
        if (chunks_per != v) continue;
        SCOPED_TRACE(kind);
        check_schedule(chunks, generate(kind, stages, kMicroBatches, v), feeds, ref);
      }
    }
  }
}

}  // namespace
}  // namespace pt
