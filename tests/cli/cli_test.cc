// Runs the pipetrain binary as a user would and pins what it prints and returns.
#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "exec/npy.h"
#include "onnx_import/import.h"
#include "partition/cost_model.h"
#include "tests/plan/weight_products.h"
#include "tests/cli/run_cli.h"

namespace {

TEST(Cli, OpsListsTheTable) {
  Result r = run("ops");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("MatMul"), std::string::npos);
  EXPECT_NE(r.out.find("LayerNormalization"), std::string::npos);
}

TEST(Cli, InspectReportsOpsParamsFlops) {
  Result r = run("inspect samples/gpt/gpt.onnx --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["params"].get<int64_t>(), 0);
  EXPECT_GT(j["flops_fwd"].get<int64_t>(), 0);
  EXPECT_GT(j["ops"]["MatMul"].get<int>(), 0);
  EXPECT_TRUE(j["unsupported"].empty());
}

// inspect's F, B and W come from the graphs autodiff derives (plan/chunk_costs.h): F is the
// model's forward, and W what the weight gradients compute, 2 * rows * in * out per weight
// matrix (tests/plan/weight_products.h), plus at most 10% for biases, norms, the embedding's
// scatter-add and the accumulation, in every form the exporters write a linear layer: nn.Linear
// as MatMul against Transpose(weight) (export_model.py's recipe: bert_noopt, llama_noopt; the
// per-node estimate gave these W 0.04-0.09x the products), a pre-transposed copy (the exporter's
// optimizer), MatMul or Gemm against an [in, out] weight (Conv1D, legacy, the samples), and
// nanoGPT's export.
TEST(Cli, InspectCountsWeightGradientsOnTheDerivedGraphs) {
  for (const char* model : {"samples/gpt/gpt.onnx", "samples/charlm/charlm.onnx", "samples/exports/gpt2_noopt.onnx",
                            "samples/exports/gpt2.onnx", "samples/exports/gpt2_legacy.onnx",
                            "samples/exports/bert_noopt.onnx", "samples/exports/llama_noopt.onnx",
                            "samples/exports/nanogpt.onnx"}) {
    SCOPED_TRACE(model);
    Result r = run(std::string("inspect ") + model + " -b 2 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    pt::ImportOptions o;
    o.batch = 2;
    o.fuse_attention = true;  // inspect shows the CPU program
    const pt::Graph g = pt::import_model(model, o);
    const int64_t products = pt::testing::weight_gradient_products(g);
    const double w = static_cast<double>(j["flops_bwd_weight"].get<int64_t>());
    EXPECT_GE(w, static_cast<double>(products));
    EXPECT_LE(w, 1.10 * static_cast<double>(products));
    EXPECT_EQ(j["flops_fwd"].get<int64_t>(), pt::total_cost(pt::estimate_costs(g)).flops_fwd);
    EXPECT_GT(j["flops_bwd_input"].get<int64_t>(), 0);
    EXPECT_EQ(j["flops_from"].get<std::string>().rfind("derived graphs", 0), 0u) << j["flops_from"];
  }
}

// The causal mask and BatchNorm's running statistics are flagged as buffers, weights as trained.
TEST(Cli, InspectFlagsInitializersThatLookLikeBuffers) {
  std::map<std::string, bool> trained;
  for (const char* model : {"samples/gpt/gpt.onnx", "samples/resnet/resnet.onnx"}) {
    Result r = run(std::string("inspect ") + model + " --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    for (const auto& i : j["initializers"])
      trained[i["name"].get<std::string>()] = i["trained"].get<bool>();
  }
  EXPECT_FALSE(trained.at("mask"));
  EXPECT_FALSE(trained.at("bn1.running_mean"));
  EXPECT_FALSE(trained.at("bn1.running_var"));
  EXPECT_TRUE(trained.at("bn1.weight"));
  EXPECT_TRUE(trained.at("blocks.0.ln1.weight"));
}

// `inspect --untied NAME` acts on the name: GPT-2's LM head, which reads the token embedding
// (the module's own tie), gets a copy of its own and the embedding one named after its module;
// a name that matches no initializer is one line naming it, from `inspect` and from a config.
TEST(Cli, InspectUntiedUntiesTheNamedTie) {
  const auto trained_names = [](const Result& r) {
    std::set<std::string> names;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    for (const auto& i : j["initializers"])
      if (i["trained"].get<bool>()) names.insert(i["name"].get<std::string>());
    return names;
  };
  const Result tied = run("inspect samples/exports/gpt2.onnx --json");
  ASSERT_EQ(tied.code, 0) << tied.err;
  EXPECT_TRUE(trained_names(tied).count("model.lm_head.weight"));
  EXPECT_FALSE(trained_names(tied).count("model.transformer.wte.weight"));
  const Result untied = run("inspect samples/exports/gpt2.onnx --json --untied model.lm_head.weight");
  ASSERT_EQ(untied.code, 0) << untied.err;
  EXPECT_EQ(untied.err, "");
  EXPECT_TRUE(trained_names(untied).count("model.lm_head.weight"));
  EXPECT_TRUE(trained_names(untied).count("model.transformer.wte.weight"));
  const Result text = run("inspect samples/exports/gpt2.onnx --untied model.lm_head.weight");
  EXPECT_NE(text.out.find("  model.lm_head.weight: untied into model.transformer.wte.weight (model.lm_head keeps "
                          "model.lm_head.weight)  (parameters.untied names it)\n"),
            std::string::npos)
      << text.out;
  const std::string unmatched = "samples/exports/gpt2.onnx: parameters.untied 'lm_head.weight': matches no initializer "
                                "of the model; `pipetrain inspect` lists them (and what import untied, restored or folded)";
  expect_one_line_error(run("inspect samples/exports/gpt2.onnx --untied lm_head.weight"), unmatched);
  const fs::path cfg = write(scratch("untied_config") / "c.yaml", "model: samples/exports/gpt2.onnx\ndims: {batch: 2}\n"
                                                                  "parameters: {untied: [lm_head.weight]}\n");
  expect_one_line_error(run("train " + cfg.string() + " --set output.model="), cfg.string() + ":1: model: " + unmatched);
}

TEST(Cli, PartitionJsonHasTheDocumentedShape) {
  Result r = run("partition samples/gpt/gpt.onnx --stages 4 --micro-batch 2 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["stages"].size(), 4u);
  for (const auto& s : j["stages"]) {
    for (const char* key : {"index", "nodes", "params", "flops_fwd", "flops_bwd",
                            "activation_bytes", "cost", "inputs", "outputs"})
      EXPECT_TRUE(s.contains(key)) << key;
    for (const auto& t : s["inputs"]) {
      EXPECT_TRUE(t.contains("name"));
      EXPECT_TRUE(t.contains("dtype"));
      EXPECT_EQ(t["shape"][0].get<int64_t>(), 2);  // the batch dim is the micro-batch
    }
  }
  EXPECT_LE(j["imbalance"].get<double>(), 1.10);
}

// --link prices what crosses each cut: over a slow link every GPT cut falls between blocks
// and the JSON says what the link was and what each stage waits for; the same transfers through
// --bandwidth and --latency give the same plan; bad values get one line.
TEST(Cli, PartitionLinkPricesTheCuts) {
  Result r = run("partition samples/gpt/gpt.onnx --stages 4 --micro-batch 8 --link tcp --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["link"]["name"], "tcp");
  EXPECT_DOUBLE_EQ(j["link"]["bandwidth"].get<double>(), 1.1e9);
  EXPECT_DOUBLE_EQ(j["link"]["latency_s"].get<double>(), 50e-6);
  ASSERT_EQ(j["stages"].size(), 4u);
  for (size_t k = 0; k + 1 < 4; ++k) {
    ASSERT_EQ(j["stages"][k]["outputs"].size(), 1u) << k;
    // [8,32,64] float32 over the link, one message: 65536 B / 1.1 GB/s + 50 us.
    EXPECT_NEAR(j["stages"][k]["link_out_s"].get<double>(), 65536 / 1.1e9 + 50e-6, 1e-9) << k;
    EXPECT_DOUBLE_EQ(j["stages"][k + 1]["link_in_s"].get<double>(), j["stages"][k]["link_out_s"].get<double>());
  }
  Result same = run("partition samples/gpt/gpt.onnx --stages 4 --micro-batch 8 --link none --bandwidth 1.1GB/s "
                    "--latency 50us --json");
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_EQ(nlohmann::json::parse(same.out)["stages"], j["stages"]);

  Result table = run("partition samples/gpt/gpt.onnx --stages 4 --link tcp");
  EXPECT_NE(table.out.find("link tcp: 1.1 GB/s, 50 us per message"), std::string::npos) << table.out;
  Result bad = run("partition samples/gpt/gpt.onnx --stages 4 --latency soon");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err, "error: --latency: 'soon' is not a latency; write seconds with a unit, e.g. 5us, 0.05ms or 2e-6\n");
}

// --recompute (and pipeline.recompute) takes one policy per chunk too, in forward order: with two
// chunks per device each chunk keeps what its own policy says.
TEST(Cli, RecomputeTakesOnePolicyPerChunk) {
  Result r = run("partition samples/gpt/gpt.onnx --stages 2 --chunks-per-stage 2 --backward "
                 "--recompute none,full,selective,none --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto chunks = nlohmann::json::parse(r.out)["backward"]["chunks"];
  ASSERT_EQ(chunks.size(), 4u);
  auto kept = [&](size_t c) { return chunks[c]["kept_bytes"].get<int64_t>(); };
  EXPECT_LT(kept(1), kept(2));  // full keeps the chunk's input alone, selective more
  EXPECT_LT(kept(2), kept(0));  // and none the most
  Result bad = run("partition samples/gpt/gpt.onnx --stages 2 --chunks-per-stage 2 --backward --recompute none,full,none");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("error: --recompute: gives 3 policies for 2 stages of 4 chunks; give one policy for all "
                         "stages, one per stage or one per chunk separated by commas"),
            std::string::npos)
      << bad.err;
}

// The memory per device as train counts it (plan/memory.h), from the partition alone: AdamW
// (4 x parameter bytes: weights, gradients, two moments) and stage k of K keeping K - k
// micro-batches of its activations (1F1B), which is the partitioner's own memory_bytes.
TEST(Cli, PartitionJsonGivesTheMemoryPerDevice) {
  Result r = run("partition samples/gpt/gpt.onnx --stages 4 --micro-batch 2 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& m = j["memory"];
  EXPECT_EQ(m["optimizer_moments"].get<int>(), 2);
  EXPECT_EQ(m["process_overhead_bytes"].get<int64_t>(), int64_t{300} << 20);
  ASSERT_EQ(m["devices"].size(), 4u);
  int64_t process = m["process_overhead_bytes"].get<int64_t>();
  for (int d = 0; d < 4; ++d) {
    const auto& dev = m["devices"][d];
    const auto& stage = j["stages"][d];
    const int64_t params = stage["param_bytes"].get<int64_t>();
    EXPECT_EQ(dev["parameter_bytes"].get<int64_t>(), params);
    EXPECT_EQ(dev["gradient_bytes"].get<int64_t>(), params);
    EXPECT_EQ(dev["optimizer_bytes"].get<int64_t>(), 2 * params);
    EXPECT_EQ(dev["activation_bytes"].get<int64_t>(), (4 - d) * stage["activation_bytes"].get<int64_t>());
    EXPECT_EQ(dev["total_bytes"].get<int64_t>(), stage["memory_bytes"].get<int64_t>()) << "device " << d;
    process += dev["total_bytes"].get<int64_t>();  // one process on the CPU: the devices' totals
  }
  EXPECT_EQ(m["process_bytes"].get<int64_t>(), process);
  const Result table = run("partition samples/gpt/gpt.onnx --stages 4 --micro-batch 2");
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("memory per device under AdamW, chunk k of K keeping K-k micro-batches of activations (1F1B):\n"
                           "  device   parameters    gradients    optimizer  activations        total\n"),
            std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("one process holding every device on the CPU: "), std::string::npos) << table.out;
}

TEST(Cli, PartitionTablePrintsImbalance) {
  Result r = run("partition samples/bert/bert.onnx --stages 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("imbalance "), std::string::npos);
  EXPECT_NE(r.out.find("in:  input int64[1,"), std::string::npos) << r.out;
}

TEST(Cli, ExportWritesOneFilePerStage) {
  const fs::path dir = fs::temp_directory_path() / "pt_cli_export";
  fs::remove_all(dir);
  Result r = run("partition samples/mlp/mlp.onnx --stages 2 --export " + dir.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir / "stage_0.onnx"));
  EXPECT_TRUE(fs::exists(dir / "stage_1.onnx"));
  EXPECT_FALSE(fs::exists(dir / "stage_2.onnx"));
}

TEST(CliErrors, MissingModel) {
  expect_one_line_error(run("partition nowhere.onnx --stages 2"),
                        "nowhere.onnx: no such file; check the path to the model");
}

TEST(CliErrors, TooManyStages) {
  expect_one_line_error(run("partition samples/mlp/mlp.onnx --stages 500"),
                        "partition: cannot cut the graph into 500 stages that each hold a node with FLOPs: it has 7 "
                        "such nodes (of 7); use at most 7 stages");
}

TEST(CliErrors, ImpossibleMemoryLimit) {
  expect_one_line_error_starting(
      run("partition samples/gpt/gpt.onnx --stages 2 --memory-limit 1KiB"),
      "partition: no split into 2 stages fits the memory limit of 1.00 KiB");
}

TEST(CliErrors, UnreadableMemoryLimit) {
  expect_one_line_error(run("partition samples/gpt/gpt.onnx --stages 2 --memory-limit lots"),
                        "--memory-limit: cannot read 'lots' as a size; write bytes, or a number "
                        "with KB, MB, GB, KiB, MiB or GiB");
}

TEST(CliErrors, UnknownStrategy) {
  expect_one_line_error(run("partition samples/gpt/gpt.onnx --stages 2 --strategy fastest"),
                        "--strategy: unknown strategy 'fastest'; use balanced, params, uniform or manual");
}

TEST(CliErrors, UnknownFlag) {
  Result r = run("partition samples/gpt/gpt.onnx --stages 2 --stagez 3");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// Issue 21, item 8: the unknown word is named, with the closest known one where one is close.
TEST(CliErrors, UnknownWordsAreNamedWithTheClosestKnownOne) {
  expect_one_line_error(run("trian"), "unknown command 'trian' (did you mean 'train'?); see `pipetrain --help`");
  expect_one_line_error(run("xyzzy"),
                        "unknown command 'xyzzy'; the commands are version, ops, inspect, partition, run, grad, "
                        "train, schedule, plan; see `pipetrain --help`");
  expect_one_line_error(run(""),
                        "name a command: version, ops, inspect, partition, run, grad, train, schedule, plan; see "
                        "`pipetrain --help`");
  expect_one_line_error(run("partition samples/gpt/gpt.onnx --stage 4"),
                        "unknown flag '--stage' for `pipetrain partition` (did you mean '--stages'?); see "
                        "`pipetrain partition --help`");
  expect_one_line_error(run("train samples/charlm/train.yaml --resum"),
                        "unknown flag '--resum' for `pipetrain train` (did you mean '--resume'?); see "
                        "`pipetrain train --help`");
  expect_one_line_error(run("train samples/charlm/train.yaml --steps 3"),
                        "unknown flag '--steps' for `pipetrain train`; config keys are set with --set KEY=VALUE "
                        "(--set steps=...); see `pipetrain train --help`");
  // A negative number is a value, not a flag.
  expect_one_line_error(run("partition samples/gpt/gpt.onnx -s 2 --ignore-index -100 -x"),
                        "unknown flag '-x' for `pipetrain partition`; see `pipetrain partition --help`");
}

// Counts say what they take in a few words (they printed DBL_MAX's 300 digits).
TEST(CliErrors, CountsThatAreNotPositiveWholeNumbers) {
  for (const char* bad : {"0", "four", "2.5", "-1"})
    expect_one_line_error(run(std::string("partition samples/gpt/gpt.onnx -s ") + bad),
                          std::string("--stages: must be a whole number, at least 1; got '") + bad +
                              "'; see `pipetrain partition --help`");
  expect_one_line_error(run("schedule -k 1f1b -s 2 -m 0"),
                        "--micro-batches: must be a whole number, at least 1; got '0'; see `pipetrain schedule --help`");
}

TEST(Cli, VersionFlagAndCommand) {
  for (const char* args : {"--version", "version"}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 0) << args;
    EXPECT_EQ(r.out, "pipetrain 0.1.0\n") << args;
    EXPECT_EQ(r.err, "") << args;
  }
}

// An .npy of float32 zeros of the given shape, in this process's folder.
fs::path zeros_npy(const std::string& name, std::vector<int64_t> shape) {
  pt::Tensor t;
  t.type = {pt::DType::kFloat32, std::move(shape)};
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  const fs::path p = process_folder() / name;
  pt::write_npy(t, p.string());
  return p;
}

TEST(Cli, RunWritesEveryOutput) {
  const fs::path out = fs::temp_directory_path() / "pt_cli_run";
  fs::remove_all(out);
  Result r = run("run samples/mlp/mlp.onnx --input input=" + zeros_npy("mlp_x.npy", {3, 64}).string() +
                 " --output " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const pt::Tensor y = pt::read_npy((out / "output.npy").string());
  EXPECT_EQ(y.type.shape, (std::vector<int64_t>{3, 10}));
}

// --repeats N times N forward passes and prints the median (what bench/exports.py reads).
TEST(Cli, RunTimesRepeatedForwardPasses) {
  const fs::path out = fs::temp_directory_path() / "pt_cli_run_repeats";
  fs::remove_all(out);
  Result r = run("run samples/mlp/mlp.onnx --input input=" + zeros_npy("mlp_x.npy", {3, 64}).string() +
                 " --output " + out.string() + " --repeats 5");
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t at = r.out.find("\nforward ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
  EXPECT_GT(std::stod(line.substr(8)), 0.0) << line;
  EXPECT_NE(line.find(" ms (median of 5 runs)"), std::string::npos) << line;
  expect_one_line_error_starting(run("run samples/mlp/mlp.onnx --input input=x.npy --output o --repeats 0"),
                                 "--repeats");
}

TEST(CliErrors, RunWithAMissingInput) {
  // An input of another name is named first (issue 21, item 10), with the model's inputs.
  expect_one_line_error(run("run samples/mlp/mlp.onnx --input other=" +
                            zeros_npy("mlp_other.npy", {3, 64}).string() + " --output /tmp/pt_x"),
                        "--input other: the model has no input of that name (its inputs: input "
                        "float32[batch,64]); name one of them");
}

TEST(CliErrors, RunWithAWrongShape) {
  expect_one_line_error(run("run samples/mlp/mlp.onnx --input input=" +
                            zeros_npy("mlp_bad.npy", {3, 65}).string() + " --output /tmp/pt_x"),
                        "--input input: holds float32[3,65] but the model takes float32[3,64]; "
                        "give an array of that dtype and shape (the batch axis may differ)");
}

TEST(CliErrors, FailedExportWritesNothing) {
  const fs::path dir = fs::temp_directory_path() / "pt_cli_noexport";
  fs::remove_all(dir);
  Result r = run("partition samples/gpt/gpt.onnx --stages 2 --memory-limit 1KiB --export " +
                 dir.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_FALSE(fs::exists(dir));
}

pt::Tensor int64_npy_data(const std::vector<int64_t>& shape, int64_t value) {
  pt::Tensor t;
  t.type = pt::TensorType{pt::DType::kInt64, shape};
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  for (int64_t i = 0; i < t.type.numel(); ++i) t.as<int64_t>()[i] = value;
  return t;
}

fs::path int64_npy(const std::string& name, const std::vector<int64_t>& shape, int64_t value) {
  const fs::path p = process_folder() / name;
  pt::write_npy(int64_npy_data(shape, value), p.string());
  return p;
}

TEST(Cli, GradWritesLossAndEveryParameterGradient) {
  const fs::path out = fs::temp_directory_path() / "pt_cli_grad";
  fs::remove_all(out);
  Result r = run("grad samples/mlp/mlp.onnx --input input=" + zeros_npy("grad_x.npy", {4, 64}).string() +
                 " --target " + int64_npy("grad_t.npy", {4}, 3).string() +
                 " --stages 2 --micro-batches 2 --recompute full --output " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out / "loss.npy"));
  for (const char* p : {"net.0.weight", "net.0.bias", "net.6.weight", "net.6.bias"})
    EXPECT_TRUE(fs::exists(out / (std::string(p) + ".npy"))) << p;
}

TEST(Cli, PartitionBackwardExportsThreeGraphsPerStage) {
  const fs::path dir = fs::temp_directory_path() / "pt_cli_bw";
  fs::remove_all(dir);
  Result r = run("partition samples/gpt/gpt.onnx --stages 2 --micro-batch 2 --backward "
                 "--recompute selective,full --export " + dir.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("kept bytes per micro-batch"), std::string::npos);
  for (int k = 0; k < 2; ++k)
    for (const char* part : {"fwd", "bwd_input", "bwd_weight"})
      EXPECT_TRUE(fs::exists(dir / ("stage_" + std::to_string(k) + "_" + part + ".onnx")));
}

TEST(CliErrors, UnknownRecomputePolicy) {
  expect_one_line_error(run("partition samples/gpt/gpt.onnx --stages 2 --backward --recompute most"),
                        "--recompute: unknown recompute policy 'most'; use none, full, every:N, "
                        "selective or budget:BYTES");
}

// Checked before anything is shown or written: no partition table on stdout, no stage files.
TEST(CliErrors, RecomputeListOfTheWrongLength) {
  const fs::path dir = scratch("recompute_length") / "stages";
  const Result r = run("partition samples/gpt/gpt.onnx --stages 3 --backward --recompute none,full --export " +
                       dir.string());
  expect_one_line_error(r, "--recompute: gives 2 policies for 3 stages; give one policy for all "
                           "stages, or one per stage separated by commas");
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(fs::exists(dir));
}

TEST(CliErrors, BudgetTooSmall) {
  expect_one_line_error_starting(
      run("partition samples/gpt/gpt.onnx --stages 2 --backward --recompute budget:1"),
      "recompute budget: no plan keeps at most 1 bytes per micro-batch; the least is ");
}

TEST(CliErrors, UnknownLoss) {
  expect_one_line_error(run("partition samples/gpt/gpt.onnx --stages 2 --backward --loss hinge"),
                        "--loss: unknown loss 'hinge'; use cross_entropy, mse or model");
}

TEST(CliErrors, GradTargetOfTheWrongShape) {
  expect_one_line_error(
      run("grad samples/mlp/mlp.onnx --input input=" + zeros_npy("grad_x2.npy", {4, 64}).string() +
          " --target " + int64_npy("grad_t2.npy", {4, 2}, 0).string() + " --output /tmp/pt_g"),
      "--target: holds int64[4,2] per micro-batch, but the loss takes int64[4]; give class "
      "indices (int64) for cross_entropy, or floats shaped like the output for mse");
}

TEST(CliErrors, GradTargetOutOfRange) {
  Result r = run("grad samples/mlp/mlp.onnx --input input=" + zeros_npy("grad_x3.npy", {2, 64}).string() +
                 " --target " + int64_npy("grad_t3.npy", {2}, 10).string() + " --output /tmp/pt_g3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("outside the classes [0, 10)"), std::string::npos) << r.err;
}

}  // namespace
