// How many stages a model takes (partition/partitioner.h, "Balanced cuts"): every chunk holds a
// node with FLOPs. For every sample model, as `train` trains it, under every schedule kind: more
// stages than that is one line naming the most that fit, and the advice is right: that many
// stages partition (no chunk without FLOPs) and schedule, and one more gets the same line.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "autodiff/chunk_backward.h"
#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "core/error.h"
#include "onnx_import/import.h"
#include "partition/cost_model.h"
#include "partition/link.h"
#include "partition/partitioner.h"
#include "schedule/generators.h"
#include "tests/cli/run_cli.h"

namespace pt {
namespace {

// Every .onnx in a folder of samples/, in name order.
std::vector<std::string> sample_models() {
  std::vector<std::string> out;
  for (const auto& dir : fs::directory_iterator("samples"))
    if (dir.is_directory())
      for (const auto& f : fs::directory_iterator(dir.path()))
        if (f.path().extension() == ".onnx") out.push_back(f.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The graph `train` partitions (plan/pipeline.h training_form): training mode, one copy per parameter site.
Graph training_graph(const std::string& path) {
  ImportOptions io;
  io.batch = 2;
  Graph g = import_model(path, io);
  to_training_mode(g, TrainingModeOptions{true});
  split_parameter_sites(g, frozen_parameters(g, {}));
  return g;
}

// `train`'s partition of `stages` stages at `chunks` per stage: balanced, transfers priced as on
// the CPU (its default link).
PartitionPlan partition(const Graph& g, const std::vector<NodeCost>& costs, int stages, int chunks) {
  PartitionOptions o;
  o.stages = stages;
  o.chunks_per_stage = chunks;
  o.link = link_preset("cpu");
  return plan_partition(g, costs, o);
}

// The message of the UserError `fn` throws; "" when it throws none.
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// The N of "use at most N stages" in a message; -1 when it says no such thing.
int advised(const std::string& message) {
  std::smatch m;
  static const std::regex most("; use at most ([0-9]+) stages");
  return std::regex_search(message, m, most) ? std::stoi(m[1]) : -1;
}

TEST(StageLimit, TheAdvisedCountFitsEverySampleAndKindAndOneMoreDoesNot) {
  std::vector<std::string> kinds;
  for (const KindInfo& k : schedule_kinds()) kinds.push_back(k.name);
  kinds.push_back("auto");  // tries 1 and 2 chunks per stage; 1 must fit (plan/pipeline.h)
  int cases = 0;
  for (const std::string& path : sample_models()) {
    SCOPED_TRACE(path);
    const Graph g = training_graph(path);
    const std::vector<NodeCost> costs = estimate_costs(g);
    const int computing = static_cast<int>(
        std::count_if(costs.begin(), costs.end(), [](const NodeCost& c) { return c.flops_fwd > 0; }));
    std::map<int, int> most;  // by chunks per stage: the advised stages, checked once
    for (const std::string& kind : kinds) {
      SCOPED_TRACE(kind);
      const int chunks = kind == "auto" ? 1 : find_kind(kind).default_chunks;
      if (!most.count(chunks)) {
        const int too_many = static_cast<int>(g.nodes.size()) + 1;
        const std::string refusal = error_of([&] { partition(g, costs, too_many, chunks); });
        const int n = advised(refusal);
        ASSERT_GE(n, 1) << refusal;
        EXPECT_EQ(n, computing / chunks) << refusal;
        EXPECT_EQ(refusal.find('\n'), std::string::npos) << refusal;
        // That many fit, every chunk computing; one more is the same line.
        const PartitionPlan plan = partition(g, costs, n, chunks);
        EXPECT_EQ(plan.chunks.size(), static_cast<size_t>(n * chunks));
        for (const ChunkPlan& c : plan.chunks) EXPECT_GT(c.flops_fwd, 0) << "chunk " << c.index;
        const std::string more = error_of([&] { partition(g, costs, n + 1, chunks); });
        EXPECT_EQ(advised(more), n) << more;
        most[chunks] = n;
      }
      if (kind != "auto") {
        const int n = most[chunks];
        const Schedule s = generate(kind, n, 2, chunks);
        EXPECT_EQ(s.stages, n);
        EXPECT_EQ(s.total_chunks(), n * chunks);
      }
      ++cases;
    }
  }
  std::cout << cases << " cases (" << sample_models().size() << " models x " << kinds.size() << " kinds)\n";
  EXPECT_GE(cases, 60 * 11);
}

// Below the limit too: GPT at 64 stages, whose exact balance put the token embedding's Gather
// alone on stage 0 (no FLOPs: that stage only looked an index up), now cuts every stage with
// compute in it.
TEST(StageLimit, NoChunkIsLeftWithoutFlops) {
  const Graph g = training_graph("samples/gpt/gpt.onnx");
  const std::vector<NodeCost> costs = estimate_costs(g);
  for (int chunks : {1, 2}) {
    const PartitionPlan plan = partition(g, costs, 64, chunks);
    for (const ChunkPlan& c : plan.chunks)
      EXPECT_GT(c.flops_fwd, 0) << chunks << " chunk(s) per stage: chunk " << c.index << " holds nodes " << c.begin
                                << " to " << c.end - 1 << " (" << g.nodes[static_cast<size_t>(c.begin)].name << ")";
  }
}

// The lines a user sees: `partition` and `train` name the most stages that fit at the chunks the
// schedule takes (ResNet under zb-v: 2 per stage), and `train` runs that many; `plan` the most
// devices.
TEST(StageLimit, TrainAndPartitionSayTheMostThatFit) {
  expect_one_line_error(
      run("partition samples/resnet/resnet.onnx --stages 69 --chunks-per-stage 2"),
      "partition: cannot cut the graph into 69 stages x 2 chunks = 138 chunks that each hold a node with FLOPs: it "
      "has 51 such nodes (of 52); use at most 25 stages at 2 chunks per stage");
  const fs::path d = scratch("stage_limit");
  const fs::path cfg = write(d / "resnet.yaml", "model: samples/resnet/resnet.onnx\n"
                                                "dims: {batch: 2}\n"
                                                "pipeline: {stages: 4, micro_batches: 2, schedule: zb-v}\n"
                                                "steps: 1\n");
  expect_one_line_error(
      run("train " + cfg.string() + " -q --set pipeline.stages=26"),
      "--set pipeline.stages: partition: cannot cut the graph into 26 stages x 2 chunks = 52 chunks that each hold a "
      "node with FLOPs: it has 51 such nodes (of 52); use at most 25 stages at 2 chunks per stage");
  const Result ok = run("train " + cfg.string() + " -q --set pipeline.stages=25");
  EXPECT_EQ(ok.code, 0) << ok.err;
  // `plan` searches 1 and 2 chunks per device, skipping the chunkings past the limit.
  expect_one_line_error(run("plan samples/mlp/mlp.onnx --devices 8 --memory 1GiB"),
                        "plan: the model has 7 nodes with FLOPs (of 7), too few for 8 devices holding one each; use "
                        "at most 7 devices");
  const Result planned = run("plan samples/mlp/mlp.onnx --devices 7 --memory 1GiB");
  EXPECT_EQ(planned.code, 0) << planned.err;
}

}  // namespace
}  // namespace pt
