// ReferenceStep cut across processes (train/reference_step.h, the non-finite hunt of a run on
// several ranks): each process (a thread here, all on one InProcessComm) runs only its own
// chunks; together they make the whole step's loss and gradients bit for bit, and a value that
// stops being finite in a later chunk is found where one process finds it.
#include "train/reference_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <limits>

#include "exec/cpu/cpu_backend.h"
#include "train/comm.h"
#include "tests/autodiff/sample_chunks.h"
#include "tests/exec/test_tensors.h"

namespace pt {
namespace {

constexpr int kRows = 2;
constexpr int kMicroBatches = 3;
using Feeds = std::vector<std::map<std::string, Tensor>>;

struct StepRun {
  double loss = 0;
  std::map<std::string, Tensor> grads;
  std::optional<NonFinite> found;
  int64_t at = -1;
};

StepRun run_whole_or_part(const std::vector<BackwardGraphs>& chunks, const Feeds& feeds, bool watch, const ReferenceCut* cut) {
  CpuBackend backend(1);
  ReferenceStep step(chunks, backend, watch, cut);
  for (const auto& f : feeds) step.run_micro_batch(f);
  StepRun r{step.loss(), step.grads(), std::nullopt, step.first_nonfinite_at()};
  if (const NonFinite* f = step.first_nonfinite()) r.found = *f;
  return r;
}

// The step on the processes rank_of_device names (chunk c on device c), each a thread.
std::vector<StepRun> run_cut(const std::vector<BackwardGraphs>& chunks, const Feeds& feeds, bool watch,
                         const std::vector<int>& rank_of_device) {
  InProcessComm comm;
  ReferenceCut cut;
  for (size_t c = 0; c < chunks.size(); ++c) cut.device_of_chunk.push_back(static_cast<int>(c));
  cut.rank_of_device = rank_of_device;
  cut.comm = &comm;
  const int ranks = *std::max_element(rank_of_device.begin(), rank_of_device.end()) + 1;
  std::vector<std::future<StepRun>> runs;
  for (int r = 0; r < ranks; ++r) {
    ReferenceCut mine = cut;
    mine.rank = r;
    runs.push_back(std::async(std::launch::async, [&, mine] { return run_whole_or_part(chunks, feeds, watch, &mine); }));
  }
  std::vector<StepRun> out;
  for (auto& f : runs) out.push_back(f.get());
  return out;
}

TEST(ReferenceCut, ProcessesRunningTheirOwnChunksMakeTheWholeStep) {
  const Graph g = testing::load_sample("gpt", kRows);
  const std::vector<BackwardGraphs> chunks = testing::sample_chunks(g, 4);
  const Feeds feeds = testing::step_feeds(g, chunks, kMicroBatches, kRows);
  const StepRun whole = run_whole_or_part(chunks, feeds, false, nullptr);
  for (const std::vector<int>& rank_of_device : {std::vector<int>{0, 1, 2, 3}, {0, 0, 1, 1}, {0, 1, 1, 0}}) {
    SCOPED_TRACE(::testing::PrintToString(rank_of_device));
    const std::vector<StepRun> parts = run_cut(chunks, feeds, false, rank_of_device);
    size_t grads = 0;
    for (size_t r = 0; r < parts.size(); ++r) {
      for (const auto& [name, t] : parts[r].grads) {
        ++grads;
        EXPECT_TRUE(t.data == whole.grads.at(name).data) << name;
      }
    }
    EXPECT_EQ(grads, whole.grads.size());
    const StepRun& last = parts[static_cast<size_t>(rank_of_device.back())];
    EXPECT_EQ(last.loss, whole.loss);
    EXPECT_NE(whole.loss, 0.0);
  }
}

// An Inf in a weight of chunk 2 (of 4): the first non-finite output one process meets is met by
// the process running chunk 2, at the same place in the order; the others meet only later ones.
TEST(ReferenceCut, TheFirstNonFiniteIsWhereOneProcessFindsIt) {
  const Graph g = testing::load_sample("gpt", kRows);
  std::vector<BackwardGraphs> chunks = testing::sample_chunks(g, 4);
  const Feeds feeds = testing::step_feeds(g, chunks, kMicroBatches, kRows);
  ASSERT_FALSE(chunks[2].params.empty());
  const Graph& f2 = chunks[2].forward;
  const Tensor& weight = *f2.value(f2.find(chunks[2].params.front())).init;
  auto& poisoned = const_cast<Tensor&>(weight);  // shared by the chunk's graphs, as a diverged step leaves it
  poisoned.as<float>()[0] = std::numeric_limits<float>::infinity();

  const StepRun one = run_whole_or_part(chunks, feeds, true, nullptr);
  ASSERT_TRUE(one.found);
  EXPECT_EQ(one.found->chunk, 2u);
  EXPECT_EQ(one.found->pass, "forward");
  const std::vector<StepRun> parts = run_cut(chunks, feeds, true, {0, 0, 1, 1});
  ASSERT_TRUE(parts[1].found);
  EXPECT_EQ(parts[1].at, one.at);
  EXPECT_EQ(parts[1].found->node, one.found->node);
  EXPECT_EQ(parts[1].found->value, one.found->value);
  EXPECT_EQ(parts[1].found->what, one.found->what);
  ASSERT_TRUE(parts[0].found);  // chunk 1's B takes the Inf's gradients, later in the order
  EXPECT_GT(parts[0].at, one.at);
}

}  // namespace
}  // namespace pt
