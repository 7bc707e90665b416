// The train config: every key read, and bad files rejected with file:line and the dotted key.
#include "cli/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli/args.h"
#include "core/error.h"
#include "onnx_import/attention_fusion.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

std::string write(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p.string();
}

std::string error_of(const std::string& path, const std::vector<std::string>& overrides = {}) {
  try {
    load_config(path, overrides);
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Config, ReadsEveryKey) {
  const std::string path = write("pt_cfg_full.yaml", R"(model: samples/gpt/gpt.onnx
dims: {batch: 8}
loss: {kind: cross_entropy, output: output, ignore_index: -1}
data: {kind: synthetic, samples: 64, shuffle: false, eval_fraction: 0.25}
optimizer: {kind: adamw, lr: 3.0e-4, weight_decay: 0.1, clip_grad_norm: 1.0, warmup_steps: 20,
            schedule: cosine, min_lr: 1.0e-5, betas: [0.8, 0.99], eps: 1.0e-6}
pipeline: {stages: 4, chunks: 2, micro_batches: 8, schedule: zb-v, partition: params,
           recompute: selective, memory_limit: 8GiB, link: pcie, bandwidth: 2GB/s, latency: 20us,
           device_rate: 900}
parameters: {frozen: [mask, "*.running_*"], tied: [wte], untied: ["*.ln_*"], trained: [embedding_1]}
device: cpu
threads: 2
seed: 7
dropout: off
steps: 200
eval_every: 50
checkpoint: {dir: out/ckpt, every: 100}
output: {model: out/trained.onnx, metrics: out/metrics.jsonl, trace: out/trace.json, start_state: start.safetensors}
)");
  const TrainConfig c = load_config(path);
  EXPECT_EQ(c.model, "samples/gpt/gpt.onnx");
  EXPECT_EQ(c.dims.at("batch"), 8);
  EXPECT_EQ(c.loss.ignore_index, -1);
  EXPECT_EQ(c.data.samples, 64);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_DOUBLE_EQ(c.data.eval_fraction, 0.25);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.99);
  EXPECT_EQ(c.optimizer.schedule, "cosine");
  EXPECT_EQ(c.pipeline.stages, 4);
  EXPECT_EQ(c.pipeline.chunks, 2);
  EXPECT_EQ(c.pipeline.schedule, "zb-v");
  EXPECT_EQ(c.pipeline.memory_limit, "8GiB");
  EXPECT_EQ(c.pipeline.link.preset, "pcie");
  EXPECT_EQ(c.pipeline.link.bandwidth, "2GB/s");
  EXPECT_EQ(c.pipeline.link.latency, "20us");
  EXPECT_DOUBLE_EQ(c.pipeline.link.device_rate, 900);
  EXPECT_EQ(c.frozen, (std::vector<std::string>{"mask", "*.running_*"}));
  EXPECT_EQ(c.parameters.tied, (std::vector<std::string>{"wte"}));
  EXPECT_EQ(c.parameters.untied, (std::vector<std::string>{"*.ln_*"}));
  EXPECT_EQ(c.parameters.trained, (std::vector<std::string>{"embedding_1"}));
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_FALSE(c.dropout);
  EXPECT_EQ(c.steps, 200);
  EXPECT_EQ(c.checkpoint.every, 100);
  EXPECT_EQ(c.output.trace, "out/trace.json");
  EXPECT_EQ(c.output.start_state, "start.safetensors");
}

// output.safetensors: beside output.model unless set; none without a model output; off when
// set to nothing.
TEST(Config, TrainedWeightsGoBesideTheModel) {
  const std::string path = write("pt_cfg_st.yaml", "model: samples/mlp/mlp.onnx\noutput: {model: out/t.onnx}\n");
  EXPECT_EQ(load_config(path).output.safetensors, "out/t.safetensors");
  EXPECT_EQ(load_config(path, {"output.safetensors=w/x.safetensors"}).output.safetensors, "w/x.safetensors");
  EXPECT_EQ(load_config(path, {"output.safetensors="}).output.safetensors, "");
  EXPECT_EQ(load_config(path, {"output.model=a/b"}).output.safetensors, "a/b.safetensors");
  EXPECT_EQ(load_config(path, {"output.model="}).output.safetensors, "");
  const std::string none = write("pt_cfg_st0.yaml", "model: samples/mlp/mlp.onnx\n");
  EXPECT_EQ(load_config(none).output.safetensors, "");
}

// memory.check: on by default (train checks its plan against the host before loading).
TEST(Config, MemoryCheckIsOnUnlessTurnedOff) {
  const std::string path = write("pt_cfg_mem.yaml", "model: samples/mlp/mlp.onnx\n");
  EXPECT_TRUE(load_config(path).memory.check);
  EXPECT_FALSE(load_config(path, {"memory.check=off"}).memory.check);
  const std::string off = write("pt_cfg_mem_off.yaml", "model: samples/mlp/mlp.onnx\nmemory: {check: off}\n");
  EXPECT_FALSE(load_config(off).memory.check);
  EXPECT_EQ(error_of(path, {"memory.check=maybe"}), "--set memory.check: expected on or off, got 'maybe'; give on or off");
  EXPECT_EQ(error_of(path, {"memory.limit=1GiB"}), "--set memory.limit: unknown key; known keys here: check");
}

// output.dtype: the trained weights in the file's dtype (file, the default) or in float32 (fp32).
TEST(Config, OutputDtypeIsFileOrFp32) {
  const std::string path = write("pt_cfg_dtype.yaml", "model: samples/mlp/mlp.onnx\noutput: {model: out/t.onnx}\n");
  EXPECT_EQ(load_config(path).output.dtype, "file");
  EXPECT_EQ(load_config(path, {"output.dtype=fp32"}).output.dtype, "fp32");
  EXPECT_EQ(error_of(path, {"output.dtype=fp16"}), "--set output.dtype: unknown value 'fp16'; use one of file, fp32");
}

TEST(Config, OverridesUseDottedKeys) {
  const std::string path = write("pt_cfg_min.yaml", "model: samples/mlp/mlp.onnx\n");
  const TrainConfig c = load_config(path, {"optimizer.lr=0.5", "pipeline.stages=2", "steps=3"});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.pipeline.stages, 2);
  EXPECT_EQ(c.steps, 3);
  EXPECT_TRUE(c.dropout);  // the default: training-mode dropout as the file says
  EXPECT_FALSE(load_config(path, {"dropout=off"}).dropout);
  EXPECT_TRUE(load_config(path, {"dropout=on"}).dropout);
  EXPECT_EQ(error_of(path, {"dropout=sometimes"}),
            "--set dropout: expected on or off, got 'sometimes'; give on or off");
  EXPECT_EQ(error_of(path, {"pipeline.stagez=2"}),
            "--set pipeline.stagez: unknown key; known keys here: bandwidth, chunks, cut_after, device_rate, "
            "latency, link, memory_limit, micro_batches, partition, plan, recompute, schedule, stages");
  EXPECT_EQ(load_config(path, {"pipeline.partition=manual", "pipeline.cut_after=[a, b]"}).pipeline.cut_after,
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(error_of(path, {"pipeline.partition=manual"}),
            "--set pipeline.partition: manual needs pipeline.cut_after, the nodes to cut after; list the nodes "
            "(`pipetrain inspect --nodes` names them)");
  EXPECT_EQ(error_of(path, {"pipeline.cut_after=[a]"}),
            "--set pipeline.cut_after: applies only to partition: manual; set pipeline.partition: manual, or drop "
            "cut_after");
  EXPECT_EQ(error_of(path, {"pipeline.plan=manual"}), "--set pipeline.plan: unknown value 'manual'; use one of auto");
  EXPECT_EQ(error_of(path, {"pipeline.link=infiniband"}),
            "--set pipeline.link: unknown link 'infiniband'; use none, cpu, nvlink, pcie or tcp");
  EXPECT_EQ(error_of(path, {"pipeline.latency=soon"}),
            "--set pipeline.latency: 'soon' is not a latency; write seconds with a unit, e.g. 5us, "
            "0.05ms or 2e-6");
}

// device: cpu | cuda (stage d on GPU d mod G) | cuda:I,J,... (a GPU per stage, or one for all).
TEST(Config, DeviceNamesTheGpus) {
  const std::string path = write("pt_cfg_cuda.yaml", "model: samples/mlp/mlp.onnx\npipeline: {stages: 2}\ndevice: cuda\n");
  TrainConfig c = load_config(path);
  EXPECT_EQ(c.device, "cuda");
  EXPECT_TRUE(c.gpus.empty());
  c = load_config(path, {"device=cuda:1,0"});
  EXPECT_EQ(c.device, "cuda");
  EXPECT_EQ(c.gpus, (std::vector<int>{1, 0}));
  c = load_config(path, {"device=cuda:3", "pipeline.stages=4"});
  EXPECT_EQ(c.gpus, (std::vector<int>{3}));
  c = load_config(path, {"device=cuda:0,0"});  // two stages sharing GPU 0
  EXPECT_EQ(c.gpus, (std::vector<int>{0, 0}));
  c = load_config(path, {"device=cpu"});
  EXPECT_EQ(c.device, "cpu");
  EXPECT_TRUE(c.gpus.empty());
}

TEST(ConfigErrors, DeviceNamesTheLine) {
  const std::string path = write("pt_cfg_gpus.yaml", "model: samples/mlp/mlp.onnx\npipeline: {stages: 2}\ndevice: cuda:0,1,2\n");
  const std::string use = "; use cpu, cuda or cuda:I,J,... (a GPU index per stage)";
  EXPECT_EQ(error_of(path), path + ":3: device: names 3 GPUs for 2 pipeline stage(s); name one GPU per "
                                   "stage, or one GPU for every stage");
  EXPECT_EQ(error_of(path, {"pipeline.stages=3"}), "no error");
  const std::string bad = write("pt_cfg_gpu_x.yaml", "model: samples/mlp/mlp.onnx\ndevice: cuda:0,x\n");
  EXPECT_EQ(error_of(bad), bad + ":2: device: 'x' in 'cuda:0,x' is no GPU index" + use);
  const std::string tpu = write("pt_cfg_tpu.yaml", "model: samples/mlp/mlp.onnx\n\ndevice: tpu\n");
  EXPECT_EQ(error_of(tpu), tpu + ":3: device: unknown value 'tpu'" + use);
  EXPECT_EQ(error_of(tpu, {"device=cuda:1,"}), "--set device: '' in 'cuda:1,' is no GPU index" + use);
  // An override of a key the file sets names the --set, not the file's line.
  EXPECT_EQ(error_of(path, {"device=tpu"}), "--set device: unknown value 'tpu'" + use);
  EXPECT_EQ(error_of(path, {"pipeline.stages=3", "steps=many"}), "--set steps: expected a whole number, got 'many'; give a whole number");
  EXPECT_EQ(error_of(tpu, {"device=cuda:-1"}), "--set device: '-1' in 'cuda:-1' is no GPU index" + use);
}

// parallel: {pipeline: P, data: D, zero: 0|1}: P is pipeline.stages by another name; given both
// with different values, --set wins over the file, and two in the same place are one line.
TEST(Config, ParallelPipelineIsTheStages) {
  const std::string path = write("pt_cfg_parallel.yaml", "model: samples/mlp/mlp.onnx\nparallel: {pipeline: 2, data: 2, zero: 1}\n");
  TrainConfig c = load_config(path);
  EXPECT_EQ(c.pipeline.stages, 2);
  EXPECT_EQ(c.parallel.data, 2);
  EXPECT_EQ(c.parallel.zero, 1);
  EXPECT_EQ(load_config(path, {"pipeline.stages=4"}).pipeline.stages, 4);  // --set over the file
  const std::string both = write("pt_cfg_parallel_both.yaml",
                                 "model: samples/mlp/mlp.onnx\npipeline: {stages: 4}\nparallel: {pipeline: 2}\n");
  EXPECT_EQ(error_of(both), both + ":3: parallel.pipeline: 2 pipeline stages, but pipeline.stages says 4; give the "
                                   "stages once (parallel.pipeline or pipeline.stages)");
  EXPECT_EQ(load_config(both, {"parallel.pipeline=4"}).pipeline.stages, 4);
  EXPECT_EQ(load_config(both, {"parallel.pipeline=3"}).pipeline.stages, 3);  // --set over the file
  EXPECT_EQ(error_of(path, {"parallel.zero=2"}),
            "--set parallel.zero: must be 0 or 1, got 2; use zero: 1 (optimizer state sharded over the data-parallel "
            "replicas) or 0");
}

// precision: fp32 (default) | bf16 | fp16, and the 16-bit ones only where the CUDA backend runs;
// train fuses attention on CUDA only in them (cuDNN's kernel), and never a masked one there.
TEST(Config, PrecisionIsFp32Bf16OrFp16OnCuda) {
  const std::string path = write("pt_cfg_precision.yaml", "model: samples/mlp/mlp.onnx\ndevice: cuda\n");
  EXPECT_EQ(load_config(path).precision, "fp32");
  EXPECT_EQ(load_config(path).attention_fused_from(), 0);
  for (const char* half : {"bf16", "fp16"}) {
    const TrainConfig c = load_config(path, {std::string("precision=") + half});
    EXPECT_EQ(c.precision, half);
    EXPECT_EQ(c.attention_fused_from(), kFusedAttentionMinKeys);
    EXPECT_FALSE(c.attention_masks_fused());
  }
  EXPECT_EQ(error_of(path, {"precision=fp8"}),
            "--set precision: unknown value 'fp8'; use one of bf16, fp16, fp32");
  EXPECT_EQ(error_of(path, {"precision=fp16", "device=cpu"}),
            "--set precision: fp16 runs on the CUDA backend only; set device: cuda, or precision: fp32");
  EXPECT_TRUE(load_config(path, {"device=cpu"}).attention_masks_fused());
}

// A plan file is a train config: `schedule --plan` and `partition --plan` fuse attention as that
// config's train would (read_plan_file): on CUDA in bf16 the maskless attentions alone.
TEST(Config, APlanFileFusesAttentionAsItsTrainWould) {
  const std::string path = write("pt_cfg_plan.yaml", "model: samples/mlp/mlp.onnx\ndevice: cuda\nprecision: bf16\n");
  const PlanFile cuda = read_plan_file(path);
  EXPECT_EQ(cuda.fuse_attention_from, kFusedAttentionMinKeys);
  EXPECT_FALSE(cuda.fuse_attention_masks);
  const PlanFile cpu = read_plan_file(write("pt_cfg_plan_cpu.yaml", "model: samples/mlp/mlp.onnx\n"));
  EXPECT_TRUE(cpu.fuse_attention_masks);
}

TEST(ConfigErrors, UnknownKeyNamesTheLine) {
  const std::string path = write("pt_cfg_unknown.yaml", "model: samples/mlp/mlp.onnx\noptimizer:\n  kind: sgd\n  lrate: 0.1\n");
  EXPECT_EQ(error_of(path), path + ":4: optimizer.lrate: unknown key; known keys here: betas, "
                                   "clip_grad_norm, eps, kind, lr, min_lr, momentum, nesterov, "
                                   "schedule, warmup_steps, weight_decay");
}

TEST(ConfigErrors, WrongTypeNamesTheLine) {
  const std::string path = write("pt_cfg_type.yaml", "model: samples/mlp/mlp.onnx\nsteps: many\n");
  EXPECT_EQ(error_of(path), path + ":2: steps: expected a whole number, got 'many'; give a whole number");
}

TEST(ConfigErrors, ImpossibleValues) {
  const std::string a = write("pt_cfg_stages.yaml", "model: samples/mlp/mlp.onnx\npipeline: {stages: 0}\n");
  EXPECT_EQ(error_of(a), a + ":2: pipeline.stages: must be at least 1, got 0; raise it");
  const std::string b = write("pt_cfg_lr.yaml", "model: samples/mlp/mlp.onnx\noptimizer:\n  lr: -1\n");
  EXPECT_EQ(error_of(b), b + ":3: optimizer.lr: must be positive, got -1.000000; give a learning rate such as 3e-4");
  const std::string c = write("pt_cfg_kind.yaml", "model: samples/mlp/mlp.onnx\nloss: {kind: hinge}\n");
  EXPECT_EQ(error_of(c), c + ":2: loss.kind: unknown value 'hinge'; use one of cross_entropy, model, mse");
}

TEST(ConfigErrors, MissingFiles) {
  const std::string a = write("pt_cfg_nomodel.yaml", "model: nowhere.onnx\n");
  EXPECT_EQ(error_of(a), a + ":1: model: file 'nowhere.onnx' does not exist; check the path "
                             "(relative paths are from the working folder)");
  const std::string b = write("pt_cfg_nodata.yaml", "model: samples/mlp/mlp.onnx\ndata:\n  kind: npy\n  inputs: {input: x_missing.npy}\n  targets: y.npy\n");
  EXPECT_EQ(error_of(b), b + ":5: data.targets: file 'y.npy' does not exist; check the path "
                             "(relative paths are from the working folder)");
  EXPECT_EQ(error_of("/nonexistent/cfg.yaml"), "/nonexistent/cfg.yaml: cannot read the config file; check the path");
}

// relative_to: config (what `plan --write` writes): the file's relative paths are from its
// folder, whatever folder `train` runs in; absolute paths and --set ones are taken as given.
// By default (working_folder) nothing changes: the repository's configs name samples/... from
// its root.
TEST(Config, RelativeToConfigReadsPathsFromTheFilesFolder) {
  const fs::path dir = fs::temp_directory_path() / "pt_cfg_relative" / "plans";
  fs::create_directories(dir);
  fs::create_directories(dir.parent_path() / "data");
  fs::copy_file("samples/mlp/mlp.onnx", dir.parent_path() / "mlp.onnx", fs::copy_options::overwrite_existing);
  std::ofstream(dir.parent_path() / "data" / "tokens.txt") << "some text";
  const std::string file = (dir / "c.yaml").string();
  std::ofstream(file) << "relative_to: config\n"
                         "model: ../mlp.onnx\n"
                         "data: {kind: tokens, file: ../data/tokens.txt}\n"
                         "pipeline: {schedule: s.csv}\n"
                         "checkpoint: {dir: ckpt}\n"
                         "output: {model: out/t.onnx, metrics: /tmp/m.jsonl, trace: t.json, timeline: t.svg}\n";
  const std::string d = dir.string(), top = dir.parent_path().string();
  const TrainConfig c = load_config(file);
  EXPECT_EQ(c.relative_to, "config");
  EXPECT_EQ(c.model, top + "/mlp.onnx");
  EXPECT_EQ(c.data.file, top + "/data/tokens.txt");
  EXPECT_EQ(c.pipeline.schedule, d + "/s.csv");
  EXPECT_EQ(c.checkpoint.dir, d + "/ckpt");
  EXPECT_EQ(c.output.model, d + "/out/t.onnx");
  EXPECT_EQ(c.output.safetensors, d + "/out/t.safetensors");
  EXPECT_EQ(c.output.metrics, "/tmp/m.jsonl");
  EXPECT_EQ(c.output.trace, d + "/t.json");
  EXPECT_EQ(c.output.timeline, d + "/t.svg");
  // A command line's paths are the shell's: from the working folder.
  const TrainConfig set = load_config(file, {"output.trace=here.json", "pipeline.schedule=zb-v"});
  EXPECT_EQ(set.output.trace, "here.json");
  EXPECT_EQ(set.pipeline.schedule, "zb-v");  // a kind is no path
  // The missing file's message says where relative paths start.
  std::ofstream(file) << "relative_to: config\nmodel: nowhere.onnx\n";
  EXPECT_EQ(error_of(file), file + ":2: model: file '" + d + "/nowhere.onnx' does not exist; check the path "
                                   "(relative paths in this file are from its folder, as relative_to: config says)");
  EXPECT_EQ(error_of(file, {"model=nowhere.onnx"}),
            "--set model: file 'nowhere.onnx' does not exist; check the path (relative paths are from the working folder)");
  std::ofstream(file) << "relative_to: here\nmodel: ../mlp.onnx\n";
  EXPECT_EQ(error_of(file), file + ":1: relative_to: unknown value 'here'; use one of config, working_folder");
  // working_folder, the default: as written.
  std::ofstream(file) << "relative_to: working_folder\nmodel: samples/mlp/mlp.onnx\noutput: {model: out/t.onnx}\n";
  EXPECT_EQ(load_config(file).model, "samples/mlp/mlp.onnx");
  EXPECT_EQ(load_config(file).output.model, "out/t.onnx");
}

TEST(ConfigErrors, BrokenYaml) {
  const std::string a = write("pt_cfg_broken.yaml", "model: samples/mlp/mlp.onnx\noptimizer: {lr: [1, 2\n");
  EXPECT_EQ(error_of(a).rfind(a + ":", 0), 0u) << error_of(a);
  EXPECT_NE(error_of(a).find("not valid YAML"), std::string::npos);
}

}  // namespace
}  // namespace pt
