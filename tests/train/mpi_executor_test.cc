// The pipeline across processes (train/mpi_comm.h), run by ctest under mpirun: every schedule kind
// at 2, 4 and 8 stages (those the rank count divides) on this process's devices (rank_of_devices) gives the loss and the
// parameter gradients of the devices it runs bit for bit as the single-process executor does
// (every rank computes that reference itself). A second step reuses every message tag; a tie
// across processes and a plan that differs between ranks are one-line errors.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "autodiff/chunk_backward.h"
#include "autodiff/loss.h"
#include "train/comm.h"
#include "exec/cpu/cpu_backend.h"
#include "train/executor.h"
#include "train/mpi_comm.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "tests/autodiff/sample_chunks.h"
#include "tests/exec/test_tensors.h"

namespace pt {
namespace {

MpiWorld* world = nullptr;

constexpr int kMicroBatch = 2;
constexpr int kMicroBatches = 4;
using Feeds = std::vector<std::map<std::string, Tensor>>;

Feeds random_feeds(const Graph& g, const std::vector<BackwardGraphs>& chunks) {
  return testing::step_feeds(g, chunks, kMicroBatches, kMicroBatch);
}

std::vector<int> placement(const Schedule& s) {
  std::vector<int> out;
  for (int c = 0; c < s.total_chunks(); ++c) out.push_back(s.device_of(c));
  return out;
}

struct StepResult {
  double loss = 0;
  std::map<std::string, Tensor> grads;
};

// A CPU backend that counts its copies, standing in for a device whose tensors MpiComm stages
// through host memory (a GPU's).
class CountingBackend : public CpuBackend {
 public:
  CountingBackend() : CpuBackend(1) {}
  void copy(void* dst, const void* src, size_t bytes) override {
    ++copies;
    CpuBackend::copy(dst, src, bytes);
  }
  int copies = 0;
};

// One process, every device here (InProcessComm), or this rank's devices (MpiComm); staged:
// MpiComm copies every message to or from another process through the device's backend, and
// this rank's own messages go through an InProcessComm given to it. copies: how many copies
// the backends made in all.
StepResult run(const std::vector<BackwardGraphs>& chunks, const Schedule& s, const Feeds& feeds, bool across,
               bool staged = false, int* copies = nullptr) {
  std::vector<std::unique_ptr<CountingBackend>> owned;
  std::vector<Backend*> backends;
  const std::vector<int> rank_of = rank_of_devices(s.stages, world->size());
  for (int d = 0; d < s.stages; ++d) {
    const bool here = !across || rank_of[static_cast<size_t>(d)] == world->rank();
    owned.push_back(here ? std::make_unique<CountingBackend>() : nullptr);
    backends.push_back(owned.back().get());
  }
  std::unique_ptr<Comm> comm;
  if (across && staged) comm = std::make_unique<MpiComm>(rank_of, world->rank(), std::make_unique<InProcessComm>(), backends);
  else if (across) comm = std::make_unique<MpiComm>(rank_of, world->rank());
  else comm = std::make_unique<InProcessComm>();
  struct Count {
    const std::vector<std::unique_ptr<CountingBackend>>& owned;
    int* out;
    ~Count() {
      if (!out) return;
      *out = 0;
      for (const auto& b : owned)
        if (b) *out += b->copies;
    }
  } count{owned, copies};
  PipelineExecutor ex(chunks, placement(s), backends, *comm, s);
  StepResult r;
  for (int step = 0; step < 2; ++step) {  // the second step reuses every tag and slot
    ex.run_step(feeds);
    r = {ex.loss(), ex.grads()};
  }
  return r;
}

class AcrossProcesses : public ::testing::TestWithParam<const char*> {};

TEST_P(AcrossProcesses, EveryScheduleBitIdenticalToOneProcess) {
  const std::string sample = GetParam();
  const Graph g = testing::load_sample(sample, kMicroBatch);
  int ran = 0;
  for (int stages : {2, 4, 8}) {
    if (stages % world->size() != 0) continue;
    for (int v : {1, 2}) {
      std::vector<BackwardGraphs> chunks;
      try {
        chunks = testing::sample_chunks(g, stages, "none", v);
      } catch (const UserError&) {
        continue;  // a model too small for that many chunks
      }
      const Feeds feeds = random_feeds(g, chunks);
      for (const KindInfo& kind : schedule_kinds()) {
        if (v < kind.min_chunks || v > kind.max_chunks) continue;
        SCOPED_TRACE(sample + " " + kind.name + " P=" + std::to_string(stages) + " rank " +
                     std::to_string(world->rank()));
        const Schedule s = add_send_recv(generate(kind.name, stages, kMicroBatches, v));
        const StepResult one = run(chunks, s, feeds, false);
        const StepResult many = run(chunks, s, feeds, true);
        // The loss is where the last chunk runs.
        const int last_device = s.device_of(s.total_chunks() - 1);
        if (rank_of_devices(stages, world->size())[static_cast<size_t>(last_device)] == world->rank())
          EXPECT_EQ(many.loss, one.loss);
        else
          EXPECT_EQ(many.loss, 0.0);
        ASSERT_FALSE(many.grads.empty());
        for (const auto& [p, t] : many.grads) {
          ASSERT_TRUE(one.grads.count(p)) << p;
          EXPECT_EQ(t.data, one.grads.at(p).data) << p;
        }
        ++ran;
      }
    }
  }
  EXPECT_GE(ran, sample == "gpt" ? 9 : 4);  // gpt: every kind; mlp (7 nodes): what it can be cut into
}

INSTANTIATE_TEST_SUITE_P(Samples, AcrossProcesses, ::testing::Values("mlp", "gpt"));

// Every parameter is computed on exactly one rank: summed over ranks, the gradient sets cover
// the model's parameters once.
TEST(AcrossProcesses, EachParameterOnOneRank) {
  const Graph g = testing::load_sample("gpt", kMicroBatch);
  const int stages = 2 * world->size();
  const std::vector<BackwardGraphs> chunks = testing::sample_chunks(g, stages, "none", 1);
  const Feeds feeds = random_feeds(g, chunks);
  const Schedule s = add_send_recv(generate("1f1b", stages, kMicroBatches, 1));
  const StepResult many = run(chunks, s, feeds, true);
  const StepResult one = run(chunks, s, feeds, false);
  int mine = static_cast<int>(many.grads.size()), total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(total, static_cast<int>(one.grads.size()));
}

// A device whose tensors are not host memory: its messages to and from other processes pass
// through its backend's copies, with the very bits of one process.
TEST(AcrossProcesses, StagedDevicesGiveTheSameBits) {
  if (world->size() < 2) GTEST_SKIP() << "one rank";
  const Graph g = testing::load_sample("gpt", kMicroBatch);
  const int stages = 2 * world->size();  // messages between the devices of one rank too
  const std::vector<BackwardGraphs> chunks = testing::sample_chunks(g, stages, "none", 1);
  const Feeds feeds = random_feeds(g, chunks);
  for (const char* kind : {"1f1b", "zb-h1"}) {
    SCOPED_TRACE(kind);
    const Schedule s = add_send_recv(generate(kind, stages, kMicroBatches, 1));
    int plain = 0, staged = 0;
    const StepResult one = run(chunks, s, feeds, false);
    run(chunks, s, feeds, true, false, &plain);
    const StepResult many = run(chunks, s, feeds, true, true, &staged);
    // Every message to or from another rank: at least one copy per action of this rank, per step.
    int crossing = 0;
    const std::vector<int> rank_of = rank_of_devices(stages, world->size());
    for (int d = 0; d < stages; ++d)
      for (const Action& a : s.devices[static_cast<size_t>(d)]) {
        if (!is_comm(a.op) || rank_of[static_cast<size_t>(d)] != world->rank()) continue;
        const int peer = a.op == Op::kSendF || a.op == Op::kRecvB ? s.device_of(a.chunk + 1) : s.device_of(a.chunk - 1);
        if (rank_of[static_cast<size_t>(peer)] != world->rank()) ++crossing;
      }
    EXPECT_GE(staged - plain, 2 * crossing) << "messages to other ranks not staged";
    for (const auto& [p, t] : many.grads) EXPECT_EQ(t.data, one.grads.at(p).data) << p;
    EXPECT_FALSE(many.grads.empty());
  }
}

TEST(AcrossProcesses, APlanThatDiffersBetweenRanksIsNamed) {
  EXPECT_NO_THROW(world->check_same(42, "the plan"));
  if (world->size() < 2) GTEST_SKIP() << "one rank";
  try {
    world->check_same(world->rank() == 1 ? 7 : 42, "the plan");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "ranks 1: the plan differs from rank 0's; start every rank with the same model, "
                                     "config and overrides");
  }
}

TEST(AcrossProcesses, RanksOwnContiguousDevices) {
  EXPECT_EQ(rank_of_devices(4, 2), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(rank_of_devices(2, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(rank_of_devices(6, 3), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(rank_of_devices(3, 1), (std::vector<int>{0, 0, 0}));
}

}  // namespace
}  // namespace pt

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  pt::MpiWorld w;
  pt::world = &w;
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && !failed) std::fprintf(stderr, "rank %d passed; another rank failed\n", w.rank());
  return any ? 1 : 0;
}
