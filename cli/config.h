// cli/config.h: `pipetrain train`'s YAML config as one struct, read and checked once. In: the
// file and `--set key=value` overrides. Out: a TrainConfig every later stage trusts.
//
// Every key is checked: an unknown key, a value of the wrong type or an impossible value is a
// UserError naming `file:line` and the dotted key. Overrides use the same dotted keys
// (`--set optimizer.lr=1e-3`, `--set pipeline.stages=2`) and are checked like the file.
//
//   relative_to: working_folder      # working_folder | config: where the file's relative paths
//                                    # start (see below)
//   model: samples/gpt/gpt.onnx
//   dims: {batch: 8}                 # micro-batch size binds the batch dim; other named dims
//   loss: {kind: cross_entropy, output: output, ignore_index: -100}
//   data: {kind: npy, inputs: {input: x.npy}, targets: y.npy, shuffle: true, eval_fraction: 0.1}
//   optimizer: {kind: adamw, lr: 3.0e-4, weight_decay: 0.1, clip_grad_norm: 1.0,
//               warmup_steps: 20, schedule: cosine, min_lr: 0, momentum: 0.9, nesterov: false,
//               betas: [0.9, 0.999], eps: 1.0e-8}
//   pipeline: {stages: 4, chunks: 2, micro_batches: 8, schedule: zb-v, partition: balanced,
//              recompute: selective, memory_limit: 8GiB,
//              link: tcp, bandwidth: 1GB/s, latency: 50us, device_rate: 100, plan: auto}
//                                    # partition: manual with cut_after: [node, ...] cuts there
//                                    # link prices the transfers the balanced cuts weigh
//                                    # (partition/link.h); by default cpu, or nvlink with
//                                    # device: cuda (however many processes: the same cuts);
//                                    # plan: auto lets the planner choose schedule, chunks and
//                                    # recompute under memory_limit (plan/planner.h)
//   parameters: {frozen: [mask], tied: [wte], untied: ["*.ln_*"], trained: [embedding_1]}   # names or globs
//   device: cpu                      # cpu | cuda | cuda:I,J,... (see below)
//   parallel: {data: 1, zero: 0}     # data-parallel replicas of the pipeline (mpirun -n: a
//                                    # multiple; each replica pipeline.micro_batches of its own);
//                                    # zero: 1 shards the optimizer state over the replicas;
//                                    # pipeline: P is pipeline.stages by another name
//   precision: fp32                  # fp32 | bf16 | fp16 (CUDA: GEMM and attention inputs rounded
//                                    # to 16 bits, fp32 accumulation, fp32 tensors and master
//                                    # weights; fp16 without loss scaling)
//   threads: 1                       # per stage (CPU)
//   seed: 0
//   dropout: on                      # off: every Dropout the identity, every stochastic-depth
//                                    # draw its expected value (autodiff/training_mode.h)
//   steps: 200
//   eval_every: 50
//   checkpoint: {dir: out/ckpt, every: 100}
//   memory: {check: on}              # off: train skips the check of its planned memory against
//                                    # the host's (and GPUs') free memory before loading
//   output: {model: out/trained.onnx, safetensors: out/trained.safetensors,
//            metrics: out/metrics.jsonl, trace: out/trace.json, timeline: out/timeline.svg,
//            dtype: file}           # file | fp32: the dtype of the trained weights (see below)
//
// relative_to: the keys naming files and folders (model, data.inputs.*, data.targets,
// data.file, a pipeline.schedule CSV, checkpoint.dir, output.*) take a relative path from the
// working folder `train` runs in (working_folder, the default: the repository's configs name
// `samples/...` and `out/...` from its root), or with `relative_to: config` from the folder the
// config file lies in, so that the file runs from anywhere; `plan --write` writes such configs.
// A path given with --set is from the working folder either way, as any command line's is.
// load_config joins them: every path in a TrainConfig is one the process can open as it is.
//
// output.safetensors: the trained parameters and buffers under the module's state_dict keys
// (cli/trained_weights.h); by default the output.model path with .safetensors, none without an
// output.model; `--set output.safetensors=` turns it off. output.start_state: the module's
// state_dict before training (safetensors.torch.save_file(model.state_dict(), path)), for a file
// exported without samples/export_model.py's record: the output then has exactly its keys and
// shapes, so load_state_dict(strict=True) takes it.
//
// output.dtype: a model whose weights the file holds in float16 or bfloat16 trains in float32
// (onnx_import/widen_halves.h). `file` (the default) writes each trained weight back in its
// file dtype, rounded to nearest even as torch's .half() / .to(torch.bfloat16) do, into the
// file's graph as it is; `fp32` writes the float32 master weights, into the graph as import
// widened it (float32 weights in a float16 graph would not be valid ONNX).
//
// device: `cpu` runs every stage on the CPU backend. `cuda` puts pipeline stage d on GPU
// d mod G (G: the GPUs found), so stages share GPUs where there are fewer GPUs than stages;
// across processes a rank's k-th device goes on GPU (its rank among its host's ranks x its
// devices + k) mod G, one GPU per rank as clusters place them (train/train_devices.h).
// `cuda:I,J,...` names the GPU of each stage: one index per pipeline stage, or a single index
// for every stage (`cuda:1`); several stages may name the same GPU.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cli/args.h"
#include "core/ir.h"
#include "plan/pipeline.h"
#include "train/data.h"

namespace pt {

struct TrainConfig {
  std::string relative_to = "working_folder";  // working_folder | config
  std::string model;
  std::map<std::string, int64_t> dims;  // "batch" is the micro-batch size

  struct Loss {
    std::string kind = "cross_entropy";  // cross_entropy | mse | model
    std::string output;                  // empty: the model's first output
    int64_t ignore_index = -100;
  } loss;

  DataOptions data;  // train/data.h; seed, where and path_rule are the run's

  struct Optimizer {
    std::string kind = "adamw";  // sgd | adamw
    double lr = 1e-3;
    double momentum = 0.0;       // sgd
    bool nesterov = false;       // sgd
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
    double weight_decay = 0.0;
    double clip_grad_norm = 0.0;  // 0: off
    int64_t warmup_steps = 0;
    std::string schedule = "constant";  // constant | cosine
    double min_lr = 0.0;
  } optimizer;

  PipelineConfig pipeline;  // plan/pipeline.h

  std::vector<std::string> frozen;  // parameters.frozen
  ParameterChoices parameters;      // parameters.tied / untied / trained (onnx_import/module_params.h)
  std::string device = "cpu";       // cpu | cuda (the `device:` text up to a ':')
  std::vector<int> gpus;            // cuda:I,J,...: the GPU indices as written; empty: d mod G
  std::string precision = "fp32";   // fp32 | bf16 | fp16 (device: cuda only)
  struct Parallel {
    int data = 1;  // replicas of the pipeline over the processes (mpirun), each its own micro-batches
    int zero = 0;  // 1: ZeRO-1, each replica keeps and steps the optimizer state of a shard
  } parallel;
  int threads = 1;                  // per stage
  int64_t fuse_attention_from = kFusedAttentionMinKeys;  // keys from which an attention runs as one
                                                         // kernel (device cpu; 1: every one)
  uint64_t seed = 0;
  bool dropout = true;              // training-mode Dropout and Bernoulli draws, seeded
  int64_t steps = 1;
  int64_t eval_every = 0;           // 0: no evaluation

  struct Memory {
    bool check = true;  // the planned memory against what the host and GPUs have, before loading
  } memory;

  struct Checkpoint {
    std::string dir;   // empty: none
    int64_t every = 0;
  } checkpoint;

  struct Output {
    std::string model, metrics, trace;
    std::string safetensors;  // the module's state_dict; default: model's path with .safetensors
    std::string start_state;  // the module's state_dict at the start, completing safetensors
    std::string timeline;  // SVG: the measured timeline of the last step above the simulated one
    std::string dtype = "file";  // file | fp32: the trained weights' dtype in model and safetensors
  } output;

  // "file:line: dotted.key" for every key the file (or "--set dotted.key" for an override) set;
  // later checks (data files, stages the model allows, shapes) name the YAML line through it.
  std::map<std::string, std::string> places;
  std::string where(const std::string& key) const {
    auto it = places.find(key);
    return it == places.end() ? "config: " + key : it->second;
  }
  // The link preset that prices transfers where pipeline.link names none (plan/pipeline.h).
  std::string default_link() const { return device == "cuda" ? "nvlink" : "cpu"; }
  // The keys from which train fuses an attention: fuse_attention_from on the CPU and on CUDA in
  // bf16 or fp16 (cuDNN's fused attention), 0 (none) on CUDA in fp32, where cuBLAS's products and
  // the softmax kernel outrun the backend's fp32 attention kernel (docs/measured.md).
  int64_t attention_fused_from() const {
    return device == "cpu" || precision != "fp32" ? fuse_attention_from : 0;
  }
  // Whether train fuses attentions that read a mask: on the CPU; not on CUDA, where they would run
  // on the fp32 kernel (cuDNN's takes no mask).
  bool attention_masks_fused() const { return device == "cpu"; }
  // Where a relative path at `key` was read from, for the errors of a file that is not there.
  std::string path_rule(const std::string& key) const {
    return relative_to == "config" && where(key).rfind("--set ", 0) != 0
               ? "relative paths in this file are from its folder, as relative_to: config says"
               : "relative paths are from the working folder";
  }
};

// Reads and checks the file, applying `overrides` ("dotted.key=value") on top.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace pt
