// The planner (plan/planner.h) against the grid of plans a user would try by hand, on every sample
// at 2, 4 and 8 devices under three memory caps; and its plan run by `train`, whose executor
// must keep exactly the bytes the plan counted.
#include "plan/planner.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "core/error.h"
#include "onnx_import/attention_fusion.h"
#include "onnx_import/import.h"
#include "tests/cli/run_cli.h"

namespace pt {
namespace {

// The graph as `train` trains it; `name` a sample, or a path.
Graph training_graph(const std::string& name) {
  ImportOptions io;
  io.batch = 4;
  const bool path = name.find('/') != std::string::npos;
  Graph g = import_model(path ? name : "samples/" + name + "/" + name + ".onnx", io);
  to_training_mode(g, TrainingModeOptions{true});
  fuse_attention(g);  // as `plan` and `train` on the CPU
  split_parameter_sites(g, {});
  return g;
}

// An empty directory `name` of this process alone (ctest's parallel processes would otherwise
// share it), removed when the process ends (run_cli.h's scratch).
fs::path fresh_dir(const std::string& name) { return scratch(name); }

// The "summary" of a metrics file's last line (what `train` writes at its end).
nlohmann::json last_summary(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  return nlohmann::json::parse(last)["summary"];
}

int64_t least_memory(const PlanSearch& s) {
  int64_t least = s.candidates.front().largest_memory();
  for (const PlanCandidate& c : s.candidates) least = std::min(least, c.largest_memory());
  return least;
}

// On every sample and the synthetic model, caps: the fastest plan's memory (loose), a third of the way down to the least any plan needs
// (medium), and just above that least (tight). In every case the best plan fits its cap, is never
// slower than the fastest fitting grid plan (every kind x one policy for all devices, balanced
// cuts), and is strictly faster in at least half of the cases.
TEST(Planner, NeverSlowerThanTheHandMadeGridAndFasterInHalf) {
  int cases = 0, faster = 0, grid_fits = 0;
  for (const char* name :
       {"gpt", "bert", "vit", "resnet", "mobilenet", "mlp", "charlm", "samples/synthetic/tiny.onnx"}) {
    const Graph g = training_graph(name);
    const std::vector<NodeCost> costs = estimate_costs(g);
    for (int devices : {2, 4, 8}) {
      if (2 * devices > static_cast<int>(g.nodes.size())) continue;
      PlanRequest r;
      r.devices = devices;
      r.micro_batches = 2 * devices;
      r.link = link_preset("cpu");
      r.backward.loss = LossSpec{};
      const PlanSearch free = search_plans(g, costs, r);
      const int64_t fast = free.best().largest_memory(), least = least_memory(free);
      for (int64_t cap : {fast, fast - (fast - least) / 3, least + (fast - least) / 20 + 1}) {
        SCOPED_TRACE(std::string(name) + " at " + std::to_string(devices) + " devices, cap " + std::to_string(cap));
        r.memory = cap;
        const PlanSearch s = search_plans(g, costs, r);
        const PlanCandidate& best = s.best();
        ASSERT_TRUE(best.fits);
        for (int d = 0; d < devices; ++d) EXPECT_LE(best.memory(d), cap) << "device " << d;
        ++cases;
        const PlanCandidate* grid = s.best_grid();
        if (!grid) {
          ++faster;  // nothing a user would try by hand fits; the plan does
          continue;
        }
        ++grid_fits;
        EXPECT_LE(best.step_s, grid->step_s) << best.name() << " against " << grid->name();
        faster += best.step_s < grid->step_s * (1 - 1e-9);
      }
    }
  }
  std::cout << "strictly faster than the best fitting grid plan in " << faster << " of " << cases << " cases ("
            << cases - grid_fits << " where no grid plan fits)\n";
  EXPECT_GE(cases, 45);
  EXPECT_GE(grid_fits, cases / 2);
  EXPECT_GE(2 * faster, cases) << faster << " of " << cases << " strictly faster";
}

// The plan fits its cap as the executor measures it: on every sample at 2, 4 and 8 devices under
// the tight cap of the test above, `plan --write` then one `train` step keeps, per device,
// exactly the bytes the plan counted, within the cap with the parameters' state.
TEST(Planner, EverySamplesTightPlanKeepsWhatItPlannedWhenTrained) {
  const fs::path dir = fresh_dir("pt_plan_samples");
  int trained = 0;
  for (const char* name : {"gpt", "bert", "vit", "resnet", "mobilenet", "mlp", "charlm"}) {
    const Graph g = training_graph(name);
    for (int devices : {2, 4, 8}) {
      if (devices > static_cast<int>(g.nodes.size())) {
        PlanRequest too_many;
        too_many.devices = devices;
        too_many.micro_batches = 2 * devices;
        EXPECT_THROW(search_plans(g, estimate_costs(g), too_many), UserError);
        continue;
      }
      PlanRequest r;
      r.devices = devices;
      r.micro_batches = 2 * devices;
      r.link = link_preset("cpu");
      r.backward.loss = LossSpec{};
      const PlanSearch free = search_plans(g, estimate_costs(g), r);
      const int64_t fast = free.best().largest_memory(), least = least_memory(free);
      const int64_t cap = least + (fast - least) / 20 + 1;
      SCOPED_TRACE(std::string(name) + " at " + std::to_string(devices) + " devices, cap " + std::to_string(cap));
      const std::string yaml = (dir / (std::string(name) + std::to_string(devices) + ".yaml")).string();
      Result p = run(std::string("plan samples/") + name + "/" + name + ".onnx --devices " + std::to_string(devices) +
                     " --memory " + std::to_string(cap) + " -b 4 --global-batch " + std::to_string(8 * devices) +
                     " --json --write " + yaml);
      ASSERT_EQ(p.code, 0) << p.err;
      const nlohmann::json best = nlohmann::json::parse(p.out)["best"];
      const std::string metrics = yaml + ".jsonl";
      Result t = run("train " + yaml + " -q --set steps=1 --set output.model= --set output.metrics=" + metrics);
      ASSERT_EQ(t.code, 0) << t.err;
      const std::vector<int64_t> measured = last_summary(metrics)["peak_kept_bytes_measured"];
      EXPECT_EQ(measured, best["kept_bytes"].get<std::vector<int64_t>>()) << best.dump();
      for (size_t d = 0; d < measured.size(); ++d)
        EXPECT_LE(measured[d] + best["state_bytes"][d].get<int64_t>(), cap) << "device " << d;
      ++trained;
    }
  }
  EXPECT_EQ(trained, 20);  // mlp has too few nodes for 8 devices x 2 chunks
}

// Under a cap the partitioner's cuts fitted to it are searched beside the balanced ones: for
// MobileNet at 2 devices under 3.5 MiB they win, the written plan cuts there (partition: manual),
// and train keeps what the plan counted. (ViT under 16 MiB was the case until its GELUs became
// one node each: its balanced cuts fit every cap since; MobileNet under 4 MiB until the chunks
// were priced on their derived F, B and W graphs, and under 5 MiB until each kernel run was
// priced (kFlopsPerKernel) and the weight gradients' Adds fused into their products were not:
// the balanced cuts are faster there since.)
TEST(Planner, CutsFittedToTheCapAreSearchedAndTrainCutsThere) {
  const fs::path dir = fresh_dir("pt_plan_cuts");
  const std::string yaml = (dir / "mobilenet.yaml").string();
  Result p = run("plan samples/mobilenet/mobilenet.onnx --devices 2 --memory 3.5MiB -b 4 --json --write " + yaml);
  ASSERT_EQ(p.code, 0) << p.err;
  const nlohmann::json best = nlohmann::json::parse(p.out)["best"];
  ASSERT_GE(best["cut_after"].size(), 1u) << best.dump();
  std::ifstream in(yaml);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("  partition: manual\n  cut_after: [\"" + best["cut_after"][0].get<std::string>()),
            std::string::npos)
      << text;
  Result cuts = run("partition --plan " + yaml + " --json");
  ASSERT_EQ(cuts.code, 0) << cuts.err;
  const nlohmann::json shown = nlohmann::json::parse(cuts.out);
  for (size_t c = 0; c < best["cut_after"].size(); ++c)
    EXPECT_EQ(shown["stages"][c]["last_node"], best["cut_after"][c]);
  const std::string metrics = (dir / "m.jsonl").string();
  Result t = run("train " + yaml + " -q --set steps=1 --set output.model= --set output.metrics=" + metrics);
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(last_summary(metrics)["peak_kept_bytes_measured"], best["kept_bytes"]);
}

TEST(Planner, ACapNoPlanFitsNamesTheLeastThatWould) {
  const Graph g = training_graph("gpt");
  PlanRequest r;
  r.devices = 4;
  r.micro_batches = 8;
  r.memory = 1 << 20;
  r.backward.loss = LossSpec{};
  try {
    search_plans(g, estimate_costs(g), r);
    FAIL() << "1 MiB per device cannot hold the parameters' AdamW state";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("plan: no plan fits 1.00 MiB per device; the least any needs is ", 0), 0u) << msg;
    EXPECT_NE(msg.find("; raise the cap (plan --memory, train's pipeline.memory_limit), add devices, or take "
                       "smaller micro-batches"), std::string::npos) << msg;
  }
}

// `plan --write` gives a config `train` runs as is, and `partition --plan`, `schedule --plan`
// show; the executor keeps, per device, exactly the bytes the plan counted, within the cap with
// the parameters' state.
TEST(Planner, TrainRunsThePlanAndKeepsThePlannedBytes) {
  const fs::path dir = fresh_dir("pt_plan_train");
  const std::string yaml = (dir / "plan.yaml").string();
  Result p = run("plan samples/gpt/gpt.onnx --devices 4 --memory 12MiB -b 8 --global-batch 64 --json --write " + yaml);
  ASSERT_EQ(p.code, 0) << p.err;
  const nlohmann::json plan = nlohmann::json::parse(p.out);
  const nlohmann::json& best = plan["best"];
  EXPECT_TRUE(best["fits"].get<bool>());
  // partition and schedule show it: its chunks, placed as its schedule places them; its schedule.
  Result cuts = run("partition --plan " + yaml + " --json");
  ASSERT_EQ(cuts.code, 0) << cuts.err;
  const nlohmann::json shown = nlohmann::json::parse(cuts.out);
  EXPECT_EQ(shown["stages"].size(), 4 * best["chunks"].get<size_t>());
  EXPECT_EQ(shown["link"]["name"], "cpu");
  Result sched = run("schedule --plan " + yaml + " --json");
  ASSERT_EQ(sched.code, 0) << sched.err;
  EXPECT_EQ(nlohmann::json::parse(sched.out)["micro_batches"], 8);
  EXPECT_EQ(run("partition samples/gpt/gpt.onnx").err, "error: partition: needs --stages; give --stages N, or --plan FILE\n");
  // A flag for what the plan sets is refused by name, not silently replaced by the plan's value.
  for (const auto& [command, flag] : std::vector<std::pair<std::string, std::string>>{
           {"schedule", "--fuse-attention-from 1"}, {"schedule", "--chunks 2"}, {"schedule", "--link nvlink"},
           {"schedule", "--kind 1f1b"}, {"partition", "-b 4"}, {"partition", "--chunks-per-stage 2"}}) {
    const Result r = run(command + " --plan " + yaml + " " + flag);
    const std::string name = flag.substr(0, flag.find(' ')) == "-b" ? "--micro-batch" : flag.substr(0, flag.find(' '));
    EXPECT_EQ(r.code, 2) << command << " " << flag;
    EXPECT_EQ(r.err, "error: " + name + ": the plan (--plan FILE) sets it; leave out " + name + "; see `pipetrain " +
                         command + " --help`\n");
  }

  Result t = run("train " + yaml + " -q --set steps=2 --set output.metrics=" + (dir / "m.jsonl").string());
  ASSERT_EQ(t.code, 0) << t.err;
  const nlohmann::json summary = last_summary(dir / "m.jsonl");
  EXPECT_EQ(summary["stages"], 4);
  EXPECT_EQ(summary["chunks"], best["chunks"]);
  EXPECT_EQ(summary["micro_batches"], 8);
  const std::vector<int64_t> measured = summary["peak_kept_bytes_measured"];
  EXPECT_EQ(measured, best["kept_bytes"].get<std::vector<int64_t>>());
  for (size_t d = 0; d < measured.size(); ++d)
    EXPECT_LE(measured[d] + best["state_bytes"][d].get<int64_t>(), 12 << 20) << "device " << d;
}

// `plan --write` names the model, the schedule CSV and the trained model from the config's own
// folder (relative_to: config), so `train` runs it from any folder and writes beside it; a path
// given with --set is from the folder train runs in.
// A plan made with --fuse-attention-from writes that bound into its config, so that train runs the
// attention the plan priced (here fused, over the gpt sample's 32 keys); the default writes nothing.
// `schedule --plan` simulates the plan's step from the same graph as `plan`, fused or not (its
// makespan, in work units, over the plan's step in seconds is the link's device rate either way),
// and `partition --plan` cuts that graph.
TEST(Planner, AWrittenPlanKeepsItsAttentionFusionBound) {
  const fs::path dir = fresh_dir("pt_plan_fuse");
  const std::string binary = fs::absolute(PT_BINARY).string();
  const std::string plan_file = (dir / "p.yaml").string();
  struct Written {
    std::string text;
    double plan_step_s = 0, schedule_makespan = 0, partition_cost = 0;
  };
  const auto written = [&](const std::string& flag) {
    Written w;
    const Result p = run_command(binary + " plan samples/gpt/gpt.onnx --devices 2 --memory 1GiB -b 2 --frozen mask " +
                                 flag + " --json --write " + plan_file);
    EXPECT_EQ(p.code, 0) << p.err;
    w.plan_step_s = nlohmann::json::parse(p.out)["best"]["step_s"].get<double>();
    std::ifstream in(plan_file);
    w.text = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const Result s = run_command(binary + " schedule --plan " + plan_file + " --json");
    EXPECT_EQ(s.code, 0) << s.err;
    w.schedule_makespan = nlohmann::json::parse(s.out)["makespan"].get<double>();
    const Result c = run_command(binary + " partition --plan " + plan_file + " --json");
    EXPECT_EQ(c.code, 0) << c.err;
    w.partition_cost = nlohmann::json::parse(c.out)["total_cost"].get<double>();
    return w;
  };
  const Written plain = written(""), fused = written("--fuse-attention-from 1");
  EXPECT_EQ(plain.text.find("fuse_attention_from"), std::string::npos);
  EXPECT_NE(fused.text.find("\nfuse_attention_from: 1\n"), std::string::npos) << fused.text;
  EXPECT_NE(fused.plan_step_s, plain.plan_step_s);
  EXPECT_NEAR(fused.schedule_makespan / fused.plan_step_s, plain.schedule_makespan / plain.plan_step_s,
              1e-9 * plain.schedule_makespan / plain.plan_step_s);
  EXPECT_NE(fused.partition_cost, plain.partition_cost);
  const Result t = run_command(binary + " train " + plan_file + " -q --set steps=1 --profile");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("FusedAttention"), std::string::npos) << t.out;
}

TEST(Planner, AWrittenPlanTrainsFromAnotherFolder) {
  const fs::path dir = fresh_dir("pt_plan_where");
  fs::create_directories(dir / "models");
  fs::create_directories(dir / "plans");
  fs::create_directories(dir / "elsewhere");
  fs::copy_file("samples/mlp/mlp.onnx", dir / "models" / "mlp.onnx");
  const std::string binary = fs::absolute(PT_BINARY).string();
  Result p = run_command("cd " + dir.string() + " && " + binary +
                         " plan models/mlp.onnx --devices 2 --memory 64MiB -b 2 --write plans/p.yaml");
  ASSERT_EQ(p.code, 0) << p.err;
  std::ifstream in(dir / "plans" / "p.yaml");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("relative_to: config"), std::string::npos) << text;
  EXPECT_NE(text.find("model: \"../models/mlp.onnx\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("output: {model: \"p_trained.onnx\"}"), std::string::npos) << text;
  Result t = run_command("cd " + (dir / "elsewhere").string() + " && " + binary +
                         " train ../plans/p.yaml -q --set steps=1 --set output.metrics=m.jsonl");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(fs::exists(dir / "plans" / "p_trained.onnx"));
  EXPECT_TRUE(fs::exists(dir / "elsewhere" / "m.jsonl"));
  // And from the plan's own folder, and given by an absolute path from the root.
  t = run_command("cd " + (dir / "plans").string() + " && " + binary + " train p.yaml -q --set steps=1");
  EXPECT_EQ(t.code, 0) << t.err;
  t = run_command("cd / && " + binary + " train " + (dir / "plans" / "p.yaml").string() + " -q --set steps=1");
  EXPECT_EQ(t.code, 0) << t.err;
  Result cuts = run_command("cd " + (dir / "elsewhere").string() + " && " + binary + " partition --plan ../plans/p.yaml");
  EXPECT_EQ(cuts.code, 0) << cuts.err;
  if (text.find("schedule.csv") != std::string::npos)  // an `auto` schedule: the CSV beside it
    EXPECT_NE(text.find("schedule: \"p.schedule.csv\"\n"), std::string::npos) << text;
  // A run checkpointed from one folder resumes from another: the same model file.
  std::ofstream(dir / "plans" / "c.yaml") << "relative_to: config\nmodel: ../models/mlp.onnx\ndims: {batch: 2}\n"
                                             "data: {kind: synthetic, samples: 16}\nsteps: 1\n"
                                             "checkpoint: {dir: ckpt, every: 1}\n";
  t = run_command("cd " + (dir / "elsewhere").string() + " && " + binary + " train ../plans/c.yaml -q");
  ASSERT_EQ(t.code, 0) << t.err;
  t = run_command("cd " + dir.string() + " && " + binary + " train plans/c.yaml --resume --set steps=2");
  EXPECT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("resumed from step 1"), std::string::npos) << t.out;
}

// pipeline.plan: auto in a train config: the planner picks schedule, chunks and recompute under
// pipeline.memory_limit, and the run keeps what it planned; keys it would choose are refused.
TEST(Planner, TrainPlansItselfUnderTheMemoryLimit) {
  const fs::path dir = fresh_dir("pt_plan_auto");
  const std::string yaml = (dir / "auto.yaml").string();
  std::ofstream(yaml) << "model: samples/charlm/charlm.onnx\n"
                         "dims: {batch: 8}\n"
                         "loss: {kind: cross_entropy, output: output}\n"
                         "data: {kind: tokens, file: samples/charlm/gpl3.txt}\n"
                         "pipeline: {stages: 2, micro_batches: 8, plan: auto, memory_limit: 24MiB}\n"
                         "steps: 2\n"
                         "output: {metrics: " << (dir / "m.jsonl").string() << "}\n";
  Result t = run("train " + yaml);
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("plan: "), std::string::npos) << t.out;
  const nlohmann::json summary = last_summary(dir / "m.jsonl");
  EXPECT_EQ(summary["peak_kept_bytes_measured"], summary["peak_kept_bytes_planned"]);
  for (int64_t kept : summary["peak_kept_bytes_measured"].get<std::vector<int64_t>>()) EXPECT_LE(kept, 24 << 20);

  Result chosen = run("train " + yaml + " --set pipeline.schedule=1f1b");
  EXPECT_EQ(chosen.code, 2);
  EXPECT_EQ(chosen.err, "error: --set pipeline.schedule: is chosen by pipeline.plan: auto; leave it out, or drop "
                        "pipeline.plan\n");
  Result uncapped = run("train " + yaml + " --set pipeline.memory_limit=");
  EXPECT_EQ(uncapped.code, 2);
  EXPECT_NE(uncapped.err.find("pipeline.plan: needs pipeline.memory_limit, the memory of a device"), std::string::npos)
      << uncapped.err;
}

}  // namespace
}  // namespace pt
