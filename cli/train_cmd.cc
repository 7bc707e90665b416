// `pipetrain train config.yaml`: the whole chain, then the training loop.
//
//   config -> import (dims.batch = micro-batch rows) -> training form (BatchNorm on batch
//   statistics, seeded Dropout) -> partition (stages x chunks, the schedule's placement) ->
//   F/B/W per chunk (loss, recompute, frozen) -> schedule (a kind, auto, or a CSV file; sends and
//   receives added) -> PipelineExecutor, one backend per device (cli/train_devices.h: CPU, or
//   CUDA on the GPUs `device:` names) -> per step: data, the
//   pipelined forward and backward, BatchNorm running statistics in micro-batch order, the
//   global gradient norm over every device, one optimizer per device.
//
// What it writes: progress lines, metrics as JSON lines, checkpoints, the trained model (the
// input model with new weights), the trained state_dict as safetensors (cli/trained_weights.h),
// a Chrome trace and an SVG of the measured timeline above the
// simulated one. Every file is written whole or not at all. Ctrl-C or SIGTERM (cli/interrupt.h)
// stops the loop at the next step boundary: a checkpoint of the last finished step, one line, exit
// 130 (SIGINT) or 143 (SIGTERM).
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "autodiff/chunk_backward.h"
#include "autodiff/loss.h"
#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "cli/config.h"
#include "cli/driver.h"
#include "cli/interrupt.h"
#include "cli/train_devices.h"
#include "plan/planner.h"
#include "plan/schedule_choice.h"
#include "cli/report.h"
#include "cli/train_ranks.h"
#include "cli/trained_weights.h"
#include "core/bytes.h"
#include "core/files.h"
#include "train/checkpoint.h"
#include "train/comm.h"
#include "exec/cpu/cpu_backend.h"
#include "train/reference_step.h"
#include "train/data.h"
#include "train/executor.h"
#include "train/optimizer.h"
#include "exec/stage_program.h"
#include "train/timeline.h"
#include "onnx_import/attention_fusion.h"
#include "onnx_import/export.h"
#include "onnx_import/import.h"
#include "onnx_import/module_state.h"
#include "partition/cost_model.h"
#include "partition/linear_partition.h"
#include "partition/partitioner.h"
#include "plan/chunk_costs.h"
#include "schedule/auto.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/render.h"
#include "schedule/simulate.h"
#include "schedule/validate.h"

namespace pt {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTraceSteps = 100;  // the trace holds the first this many steps
// The collectives across data-parallel replicas a step's trace shows per rank (Trainer::step).
constexpr int kCollectives = 2;
constexpr const char* kCollectiveNames[kCollectives] = {"gradients: sum over replicas", "ZeRO-1: parameters from the other replicas"};

// Runs f; a UserError from it is re-raised naming the config key (and its YAML line) first.
template <class F>
auto at_key(const TrainConfig& cfg, const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ExecutionError&) {
    throw;
  } catch (const UserError& e) {
    throw UserError(cfg.where(key), e.what());
  }
}

// Before any work: an output the run could not write at its end is one line now. The path must
// not be a folder, and its nearest existing ancestor must be a folder this process may write.
void check_writable(const std::string& path, const std::string& where) {
  if (path.empty()) return;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw UserError(where, path + " is a folder", "name a file in it, e.g. " + (fs::path(path) / "out").string());
  fs::path up = fs::absolute(path, ec).parent_path();
  while (!up.empty() && !fs::exists(up, ec) && up != up.parent_path()) up = up.parent_path();
  if (!fs::is_directory(up, ec))
    throw UserError(where, up.string() + " is a file, so " + path + " cannot be made under it", "choose another path");
  if (::access(up.c_str(), W_OK) != 0)
    throw UserError(where, "the folder " + up.string() + " is not writable", "choose another path, or make it writable");
}

void make_parent(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
}

// Largest index + 1 an integer input may hold: the rows of the table a Gather reads with it,
// directly or through ops that only view it anew (GPT-2 exported with optimize=False reads
// Gather(wte, Reshape(input_ids, [-1, T]))).
int64_t index_limit(const Graph& g, ValueId v) {
  int64_t limit = 0;
  for (int n : g.value(v).consumers) {
    const Node& node = g.nodes[static_cast<size_t>(n)];
    const std::string& op = node.op_type;
    if ((op == "Reshape" || op == "Identity" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten") &&
        node.inputs[0] == v && node.outputs.size() == 1) {
      const int64_t viewed = index_limit(g, node.outputs[0]);
      if (viewed > 0) limit = limit == 0 ? viewed : std::min(limit, viewed);
      continue;
    }
    if (node.op_type != "Gather" || node.inputs.size() < 2 || node.inputs[1] != v) continue;
    const std::vector<int64_t>& table = g.value(node.inputs[0]).type.shape;
    int64_t axis = node.attr_int("axis", 0);
    if (axis < 0) axis += static_cast<int64_t>(table.size());
    const int64_t rows = table[static_cast<size_t>(axis)];
    limit = limit == 0 ? rows : std::min(limit, rows);
  }
  return limit;
}

struct EvalResult {
  double loss = 0;
  double accuracy = -1;  // < 0: not a classification loss
  int64_t samples = 0;
};

// The model as imported (BatchNorm on running statistics, Dropout off), compiled once; reads the
// same parameter and buffer tensors the training updates in place.
// The model as evaluation runs it: Dropout the identity (autodiff/training_mode.h).
Graph inference_form(Graph g) {
  dropout_as_identity(g);
  return g;
}

class Evaluator {
 public:
  Evaluator(const Graph& model, const LossSpec& loss, int threads)
      : graph_(inference_form(model)), backend_(threads), program_(graph_, backend_), loss_(loss) {
    const std::string out = loss.output.empty() ? graph_.value(graph_.outputs.front()).name : loss.output;
    for (size_t k = 0; k < graph_.outputs.size(); ++k)
      if (graph_.value(graph_.outputs[k]).name == out) output_ = k;
  }

  EvalResult run(const DataLoader& data) {
    EvalResult r;
    double sum = 0;
    int64_t counted = 0, right = 0;
    for (int64_t i = 0; i < data.eval_batches(); ++i) {
      FeedMap feeds = data.eval_batch(i);
      // A Bernoulli draw of the file (training_mode.h): the same draws at every evaluation.
      if (graph_.find(kDropoutKey) != kNoValue) feeds[kDropoutKey] = scalar_tensor(dropout_key_for(0, -1, i));
      std::vector<Buffer> in;
      for (ValueId v : graph_.inputs) {
        const Tensor& t = feeds.at(graph_.value(v).name);
        in.push_back({const_cast<std::byte*>(t.data.data()), &graph_.value(v).type});
      }
      program_.run(in);
      const Buffer y = program_.output(output_);
      const Tensor& target = feeds.at(kLossTarget);
      r.samples += data.rows();
      if (loss_.kind == LossSpec::Kind::kModel) {
        sum += *y.as<float>();
        ++counted;
      } else if (loss_.kind == LossSpec::Kind::kMse) {
        for (int64_t j = 0; j < y.numel(); ++j) {
          const double d = static_cast<double>(y.as<float>()[j]) - target.as<float>()[j];
          sum += d * d;
        }
        counted += y.numel();
      } else {
        const int64_t classes = y.type->shape.back();
        const int64_t rows = y.numel() / classes;
        for (int64_t j = 0; j < rows; ++j) {
          const int64_t t = target.as<int64_t>()[j];
          if (t == loss_.ignore_index) continue;
          const float* z = y.as<float>() + j * classes;
          const int64_t best = std::max_element(z, z + classes) - z;
          double top = z[best], lse = 0;
          for (int64_t k = 0; k < classes; ++k) lse += std::exp(static_cast<double>(z[k]) - top);
          sum += top + std::log(lse) - z[t];
          right += best == t;
          ++counted;
        }
      }
    }
    r.loss = counted ? sum / static_cast<double>(counted) : 0;
    if (loss_.kind == LossSpec::Kind::kCrossEntropy && counted)
      r.accuracy = static_cast<double>(right) / static_cast<double>(counted);
    return r;
  }

 private:
  Graph graph_;
  CpuBackend backend_;
  StageProgram program_;
  LossSpec loss_;
  size_t output_ = 0;
};

// One line per step: on a terminal rewritten in place, otherwise every `every` steps.
class Progress {
 public:
  Progress(int64_t steps, bool quiet)
      : steps_(steps), quiet_(quiet), tty_(::isatty(STDOUT_FILENO) != 0),
        every_(std::max<int64_t>(1, steps / 20)) {}

  void step(int64_t step, double loss, double lr, double samples_per_s, double bubble) {
    if (quiet_) return;
    const int width = 24;
    const int done = static_cast<int>(width * (step + 1) / steps_);
    std::ostringstream line;
    line << "[" << std::string(static_cast<size_t>(done), '#')
         << std::string(static_cast<size_t>(width - done), '.') << "] step " << step + 1 << "/"
         << steps_ << "  loss " << std::fixed << std::setprecision(4) << loss << "  lr "
         << std::scientific << std::setprecision(2) << lr << "  " << std::fixed
         << std::setprecision(0) << samples_per_s << " samples/s  bubble " << std::setprecision(1)
         << 100 * bubble << "%";
    if (tty_) {
      std::cout << "\r" << line.str() << "\x1b[K" << std::flush;
      open_ = true;
    } else if ((step + 1) % every_ == 0 || step == 0 || step + 1 == steps_) {
      std::cout << line.str() << "\n" << std::flush;
    }
  }
  // A line that stays (eval results, checkpoints); `always`: even with -q (the final eval).
  void note(const std::string& text, bool always = false) {
    if (quiet_ && !always) return;
    if (open_) std::cout << "\n";
    open_ = false;
    std::cout << text << "\n" << std::flush;
  }
  void end() {
    if (open_ && !quiet_) std::cout << "\n";
    open_ = false;
  }

 private:
  int64_t steps_;
  bool quiet_, tty_;
  int64_t every_;
  bool open_ = false;
};

OptimizerConfig optimizer_config(const TrainConfig& cfg, bool quiet) {
  const TrainConfig::Optimizer& o = cfg.optimizer;
  OptimizerConfig c;
  c.kind = parse_optimizer_kind(o.kind);
  c.lr = o.lr;
  c.momentum = o.momentum;
  c.nesterov = o.nesterov;
  c.beta1 = o.beta1;
  c.beta2 = o.beta2;
  c.eps = o.eps;
  c.weight_decay = o.weight_decay;
  c.clip_grad_norm = o.clip_grad_norm;
  c.warmup_steps = o.warmup_steps;
  c.schedule = parse_lr_schedule(o.schedule);
  c.total_steps = cfg.steps;
  // A run shorter than the configured warm-up (a quick try with --set steps=N) keeps a tenth of
  // its steps for warm-up, so that the cosine schedule still spans it.
  if (c.schedule == OptimizerConfig::Schedule::kCosine && cfg.steps >= 1 && c.warmup_steps >= cfg.steps) {
    const int64_t shortened = cfg.steps / 10;
    if (!quiet)
      std::cout << "optimizer: warm-up shortened from " << c.warmup_steps << " to " << shortened
                << " steps to fit steps: " << cfg.steps << "\n";
    c.warmup_steps = shortened;
  }
  c.min_lr = o.min_lr;
  at_key(cfg, "optimizer", [&] { validate(c); });
  return c;
}

class Trainer {
 public:
  // guard: across processes, the one run_train installed before set-up (a rank lost then ends
  // the job with its line too); alone, run makes its own for the step loop.
  Trainer(TrainConfig cfg, const TrainArgs& args, const TrainRanks& ranks, InterruptGuard* guard = nullptr)
      : cfg_(std::move(cfg)), args_(args), ranks_(ranks), guard_(guard) {}
  int run();

 private:
  void build();
  void plan_schedule(const std::vector<NodeCost>& costs);
  void plan_pipeline(const std::vector<NodeCost>& costs);
  PartitionOptions partition_options(int chunks_per_stage) const;
  // The loss, recompute (pipeline.recompute for plan's devices and chunks) and frozen parameters.
  ChunkBackwardOptions backward_options(const PartitionPlan& plan) const;
  int chunks_for(const std::string& kind) const;
  void open_data();
  void say_synthetic_data() const;
  void claim_checkpoint_dir() const;
  void resume();
  void print_profile() const;
  // One training step and its parts (step reads as the script of them).
  struct StepFeeds {
    std::vector<FeedMap> feeds;  // this replica's micro-batches
    int first = 0;               // the global index of its first
  };
  // Times within a step from the start of the executor's run (the actions' clock): the spans of
  // the collectives across processes ([2k], [2k+1]: start and end of kind k) for the trace.
  struct StepClock {
    Clock::time_point run_begin = Clock::now();
    std::vector<double> spans = std::vector<double>(2 * kCollectives, 0.0);
    double since() const { return std::chrono::duration<double>(Clock::now() - run_begin).count(); }
  };
  void step(int64_t s);
  StepFeeds draw_feeds(int64_t s);
  void reduce_gradients(StepClock* clock);
  void update_batch_norm_statistics();
  double gradient_norm();
  double summed_loss();
  double update_parameters(double norm, StepClock* clock);
  void record_step(int64_t s, Clock::time_point begin, const StepClock& clock, double norm, double lr);
  void after_step(int64_t done);
  void save_checkpoint(int64_t steps_done);
  int stop_interrupted(int64_t steps_done, int signal);
  // Step s made a NaN or an Inf (loss or gradient norm): one line naming the step and where the
  // first non-finite value came from (the node, its chunk and stage, the micro-batch), found by
  // running this replica's micro-batches again on the CPU with every node's output watched.
  [[noreturn]] void stop_nonfinite(int64_t s, double norm, const std::vector<FeedMap>& feeds, int first);
  void finish();
  void write_weights();
  std::map<std::string, const Tensor*> trained_tensors() const;
  TrainedState trained_state() const;  // what write_weights writes (cli/trained_weights.h)
  Tensor& mutable_initializer(const std::string& name);
  bool is_site_copy(const std::string& name) const;  // a copy split_parameter_sites made
  // Across processes (cli/train_ranks.h): what such a run cannot do yet, refused in one line;
  // the plan compared between ranks; every trained parameter brought to every rank.
  void check_across_processes() const;
  void check_plan_across_processes() const;
  void share_parameters();
  // Where every device of this process has a backend that updates parameters
  // (Optimizer::bind_device), with one replica and no parameter read on two devices or split into
  // site copies (those gradients are summed on the host): the gradients stay on the devices and
  // each device's optimizer steps there.
  void bind_device_updates(const std::vector<int>& placement);
  bool device_updates() const { return !device_grads_.empty(); }
  // Device updates: the host tensors of the parameters take the devices' copies (before anything
  // on the host reads them: evaluation, checkpoints, the trained model, the NaN hunt).
  void pull_parameters();
  int owner_of(const std::string& param) const;  // the rank whose device updates it
  bool here(size_t device) const { return rank_of_[device] == ranks_.rank(); }
  bool sharded() const { return cfg_.parallel.zero == 1 && ranks_.replicas() > 1; }  // ZeRO-1 in effect
  // ZeRO-1, per device of this rank: its parameters' gradients (with their site copies') packed
  // in whole_'s order, so each shard's run is one segment; every replica sends each other one
  // its segment and sums its own in replica order (MpiWorld::sum_shard_in_replica_order).
  void reduce_scatter_gradients();
  // The device's squared gradient norm: each replica the terms of its shard, brought together
  // exactly and added in order (Optimizer::squares): the bits of the whole device's.
  double sharded_squared_norm(size_t d) const;
  // After each replica stepped its shard: every replica takes the others' updated parameters.
  void gather_parameter_shards();
  std::vector<std::vector<ActionTime>> step_times() const;  // every device's, from its rank
  // Every rank's collectives across replicas (spans[2k], spans[2k+1]: start and end of kind k
  // here), gathered for rank 0's trace; none without data parallelism.
  std::vector<TraceSpan> collective_spans(const std::vector<double>& spans) const;
  // Adds step s to the trace: this replica's devices (`times`), and with data parallelism every
  // replica's, gathered from their ranks, each on tracks of its own; then the collectives.
  void trace_step(int64_t s, double at, const std::vector<std::vector<ActionTime>>& times,
                  const std::vector<TraceSpan>& collectives);
  std::vector<std::string> device_names_;  // the trace's device tracks: "device D (rank R)" across processes

  TrainConfig cfg_;
  TrainArgs args_;
  const TrainRanks& ranks_;
  InterruptGuard* guard_;
  std::vector<int> rank_of_;  // per pipeline device
  std::map<std::string, int> first_device_;  // trained parameter -> device of its first reader
  int64_t rows_ = 1;
  LossSpec loss_;
  Graph model_;     // as imported: the eval graph
  std::optional<ModuleState> module_;  // the file's record of its module, if it has one
  Graph train_;     // training form; shares every initializer's data with model_
  TrainingForm form_;
  Schedule schedule_, lowered_;
  std::vector<BackwardGraphs> chunks_;
  Costs planned_;  // chunks_ counted (plan/chunk_costs.h): work units and kept bytes
  TrainDevices devices_;  // backends and comm: outlive the executor
  std::unique_ptr<PipelineExecutor> executor_;
  int64_t profiled_from_ = -1;  // --profile: the first profiled step
  std::vector<std::unique_ptr<Optimizer>> optimizers_;  // per device (ZeRO-1: this replica's shard)
  std::vector<std::vector<OptimizerParam>> whole_;      // per device: every parameter it updates
  std::vector<std::vector<int>> shard_of_;              // per device and parameter: its ZeRO-1 replica
  std::vector<std::vector<const float*>> device_grads_;  // device updates: per device, whole_'s gradients there
  std::vector<std::string> params_;                    // trained, in first-chunk order
  std::vector<ParameterSites> sites_;                  // parameters read at several nodes
  std::vector<std::string> side_;                      // batch statistics, mean then var per BN
  std::unique_ptr<DataLoader> data_;
  std::unique_ptr<Evaluator> eval_;
  int64_t first_step_ = 0;
  std::unique_ptr<Progress> progress_;
  std::ofstream metrics_;
  ChromeTrace trace_;
  Clock::time_point t0_;
  std::vector<std::vector<std::vector<ActionTime>>> timed_;  // a few steps' times for the costs
  std::vector<int64_t> peak_kept_;
  std::vector<double> step_seconds_;  // every step after the first of this process
  double last_loss_ = 0;
  int64_t saved_step_ = -1;  // the step of the checkpoint this process wrote last
};

bool Trainer::is_site_copy(const std::string& name) const {
  for (const ParameterSites& s : sites_)
    if (std::count(s.copies.begin(), s.copies.end(), name)) return true;
  return false;
}

Tensor& Trainer::mutable_initializer(const std::string& name) {
  const ValueId v = train_.find(name);
  PT_CHECK(v != kNoValue && train_.value(v).init, "'" + name + "' is not an initializer");
  // Initializer data is const for sharing between graphs; the training run owns it and updates
  // it between steps, when no kernel runs.
  return const_cast<Tensor&>(*train_.value(v).init);
}

void Trainer::build() {
  ImportOptions io;
  for (const auto& [name, size] : cfg_.dims) {
    if (name == "batch") io.batch = size;
    else io.dims[name] = size;
  }
  io.parameters = cfg_.parameters;
  rows_ = io.batch;
  model_ = at_key(cfg_, "model", [&] { return import_model(cfg_.model, io); });
  module_ = at_key(cfg_, "model", [&] { return read_module_state(cfg_.model); });
  loss_.kind = LossSpec::parse_kind(cfg_.loss.kind, cfg_.where("loss.kind"));
  loss_.output = cfg_.loss.output;
  loss_.ignore_index = cfg_.loss.ignore_index;
  if (!loss_.output.empty() && model_.find(loss_.output) == kNoValue)
    throw UserError(cfg_.where("loss.output"), "the model has no output '" + loss_.output + "'",
                    "name one of the model's outputs");
  train_ = model_;
  form_ = at_key(cfg_, "model",
                 [&] { return to_training_mode(train_, TrainingModeOptions{cfg_.dropout}); });
  if (cfg_.device == "cpu") fuse_attention(train_);  // the CUDA backend has no FusedAttention kernel
  sites_ = split_parameter_sites(train_, frozen_parameters(train_, cfg_.frozen));
  for (const BatchNormStats& bn : form_.batch_norms) {
    side_.push_back(bn.batch_mean);
    side_.push_back(bn.batch_var);
  }
  const std::vector<NodeCost> costs = estimate_costs(train_);
  plan_schedule(costs);

  const PartitionOptions po = partition_options(schedule_.chunks);
  PartitionPlan plan = at_key(cfg_, cfg_.pipeline.cut_after.empty() ? "pipeline.stages" : "pipeline.cut_after",
                              [&] { return plan_partition(train_, costs, po); });
  for (ChunkPlan& c : plan.chunks) c.device = schedule_.device_of(c.index);
  const ChunkBackwardOptions co = backward_options(plan);
  chunks_ = at_key(cfg_, "model", [&] { return build_chunk_backward(train_, plan, co); });
  planned_ = chunk_costs(chunks_);  // comm from the run's measured transfers, none planned

  rank_of_ = ranks_.rank_of_devices(schedule_.stages);
  if (!ranks_.alone())
    for (int d = 0; d < schedule_.stages; ++d)
      device_names_.push_back("device " + std::to_string(d) + " (rank " + std::to_string(rank_of_[static_cast<size_t>(d)]) + ")");
  devices_ = make_train_devices(cfg_, lowered_, rank_of_, ranks_);
  if (cfg_.device != "cpu" && !args_.quiet) std::cout << "devices: " << devices_.summary << "\n";
  std::vector<int> placement;
  for (int c = 0; c < schedule_.total_chunks(); ++c) placement.push_back(schedule_.device_of(c));
  executor_ = std::make_unique<PipelineExecutor>(chunks_, placement, devices_.backends, *devices_.comm,
                                                 lowered_, side_);
  check_plan_across_processes();

  // One optimizer per device over the parameters whose first reader lives there.
  const OptimizerConfig oc = optimizer_config(cfg_, args_.quiet);
  std::vector<std::vector<OptimizerParam>> per_device(static_cast<size_t>(schedule_.stages));
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (const std::string& p : chunks_[c].params) {
      if (std::find(params_.begin(), params_.end(), p) != params_.end() || is_site_copy(p)) continue;
      params_.push_back(p);
      first_device_[p] = placement[c];
      // Across processes every rank holds every device's optimizer (the model is whole on every
      // rank too) but steps its own devices' only; a resume loads them all.
      per_device[static_cast<size_t>(placement[c])].push_back({p, &mutable_initializer(p)});
    }
  // ZeRO-1: a device's parameters, in order, fall into D runs of about equal bytes; replica k
  // keeps and steps run k (shard_of_). The norm stays the whole device's (Optimizer::squared_norm
  // over the full list: the same bits).
  const int D = ranks_.replicas();
  for (auto& list : per_device) {
    int64_t total = 0, before = 0;
    for (const OptimizerParam& p : list) total += p.value->type.bytes();
    std::vector<int> shard;
    std::vector<OptimizerParam> mine;
    for (const OptimizerParam& p : list) {
      const int64_t mid = 2 * before + p.value->type.bytes();  // twice the tensor's middle byte
      shard.push_back(total ? static_cast<int>(std::min<int64_t>(D - 1, mid * D / (2 * total))) : 0);
      before += p.value->type.bytes();
      if (!sharded() || shard.back() == ranks_.replica()) mine.push_back(p);
    }
    shard_of_.push_back(std::move(shard));
    whole_.push_back(list);
    optimizers_.push_back(std::make_unique<Optimizer>(oc, std::move(mine)));
  }
  bind_device_updates(placement);
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  eval_ = std::make_unique<Evaluator>(model_, loss_, static_cast<int>(std::min<unsigned>(hw, static_cast<unsigned>(cfg_.threads * schedule_.stages))));
}

bool set_on_command_line(const TrainConfig& cfg, const std::string& key) {
  return cfg.where(key).rfind("--set ", 0) == 0;
}

// pipeline.chunks (0: the kind's default). Chunks from the file belong to the file's schedule:
// a kind given with --set alone (docs/training.md's `--set pipeline.schedule=1f1b` on a zb-v config)
// takes its own default where it does not allow the file's chunks, and says so.
int Trainer::chunks_for(const std::string& kind) const {
  const int chunks = cfg_.pipeline.chunks;
  const bool file_chunks = set_on_command_line(cfg_, "pipeline.schedule") && !set_on_command_line(cfg_, "pipeline.chunks");
  if (chunks == 0 || kind == "auto") return kind == "auto" && file_chunks ? 0 : chunks;
  const KindInfo& k = at_key(cfg_, "pipeline.schedule", [&]() -> const KindInfo& { return find_kind(kind); });
  if (chunks >= k.min_chunks && chunks <= k.max_chunks) return chunks;
  const std::string allowed = k.min_chunks == k.max_chunks ? std::to_string(k.min_chunks) : std::to_string(k.min_chunks) + " or more";
  if (!file_chunks)
    throw UserError(cfg_.where("pipeline.chunks"), "schedule " + kind + " takes " + allowed + " chunk(s) per device, not " +
                                                       std::to_string(chunks),
                    "set pipeline.chunks to " + std::to_string(k.default_chunks) + ", or leave it out");
  if (!args_.quiet)
    std::cout << "pipeline.schedule: " << kind << " takes " << allowed << " chunk(s) per device, not the " << chunks
              << " of " << cfg_.where("pipeline.chunks") << "; running " << k.default_chunks
              << " (--set pipeline.chunks=N to choose)\n";
  return 0;
}

ChunkBackwardOptions Trainer::backward_options(const PartitionPlan& plan) const {
  BackwardArgs b;
  b.loss = cfg_.loss.kind;
  b.loss_output = cfg_.loss.output;
  b.ignore_index = cfg_.loss.ignore_index;
  b.recompute = cfg_.pipeline.recompute;
  b.frozen = cfg_.frozen;
  return at_key(cfg_, "pipeline.recompute", [&] { return chunk_backward_options(b, plan.devices, static_cast<int>(plan.chunks.size())); });
}

// The cuts the config asks for, transfers priced by pipeline.link or else by the device: cpu on
// the CPU, nvlink with CUDA (partition/link.h states each preset's figures). Not by the count
// of processes: under mpirun the same config cuts where one process does and gives its bytes;
// a run across hosts over TCP says `link: tcp`.
PartitionOptions Trainer::partition_options(int chunks_per_stage) const {
  PartitionOptions po;
  po.stages = cfg_.pipeline.stages;
  po.chunks_per_stage = chunks_per_stage;
  po.strategy = at_key(cfg_, "pipeline.partition", [&] { return parse_strategy(cfg_.pipeline.partition); });
  po.cut_after = cfg_.pipeline.cut_after;
  LinkArgs link = cfg_.pipeline.link;
  if (link.preset.empty()) link.preset = cfg_.device == "cuda" ? "nvlink" : "cpu";
  po.link = link_model(link, [&](const std::string& key) { return cfg_.where("pipeline." + key); });
  return po;
}

// pipeline.plan: auto: the planner's best plan under pipeline.memory_limit (plan/planner.h), its
// schedule run as is, its cuts and its recompute policies, on the graph this run trains.
void Trainer::plan_pipeline(const std::vector<NodeCost>& costs) {
  for (const char* key : {"pipeline.schedule", "pipeline.chunks", "pipeline.recompute", "pipeline.partition",
                          "pipeline.cut_after"})
    if (cfg_.places.count(key))
      throw UserError(cfg_.where(key), "is chosen by pipeline.plan: auto", "leave it out, or drop pipeline.plan");
  if (cfg_.pipeline.memory_limit.empty())
    throw UserError(cfg_.where("pipeline.plan"), "needs pipeline.memory_limit, the memory of a device",
                    "set pipeline.memory_limit, e.g. 8GiB");
  PlanRequest r;
  r.devices = cfg_.pipeline.stages;
  r.micro_batches = cfg_.pipeline.micro_batches;
  r.memory = at_key(cfg_, "pipeline.memory_limit", [&] { return parse_bytes(cfg_.pipeline.memory_limit, "pipeline.memory_limit"); });
  r.link = partition_options(1).link;
  r.backward.loss = loss_;
  r.backward.frozen = cfg_.frozen;
  const PlanSearch s = at_key(cfg_, "pipeline.plan", [&] { return search_plans(train_, costs, r); });
  const PlanCandidate& best = s.best();
  schedule_ = best.schedule;
  cfg_.pipeline.chunks = best.chunks;
  cfg_.pipeline.recompute = best.recompute_text();
  cfg_.pipeline.partition = best.cut_after.empty() ? "balanced" : "manual";
  cfg_.pipeline.cut_after = best.cut_after;
  if (!args_.quiet)
    std::cout << "plan: " << best.name() << "; simulated step " << std::fixed << std::setprecision(3)
              << best.step_s * 1e3 << " ms, largest device " << format_bytes(best.largest_memory()) << " of "
              << format_bytes(r.memory) << " (" << s.candidates.size() << " plans searched)\n";
}

void Trainer::plan_schedule(const std::vector<NodeCost>& costs) {
  const TrainConfig::Pipeline& p = cfg_.pipeline;
  if (p.plan == "auto") {
    plan_pipeline(costs);
    lowered_ = add_send_recv(schedule_);
    return;
  }
  const std::string key = "pipeline.schedule";
  const bool csv = is_csv_schedule(p.schedule);
  ScheduleSpec spec{csv ? "" : p.schedule, csv ? p.schedule : "", p.stages, p.micro_batches, 0, 0};
  if (!csv) spec.chunks = chunks_for(schedule_kind(p.schedule));
  else if (!set_on_command_line(cfg_, key) || set_on_command_line(cfg_, "pipeline.chunks")) spec.chunks = p.chunks;
  if (!p.memory_limit.empty())  // auto: kept bytes per device
    spec.memory_limit = static_cast<double>(at_key(cfg_, "pipeline.memory_limit", [&] { return parse_bytes(p.memory_limit, "pipeline.memory_limit"); }));
  // auto's costs per chunking, from the partition of each. A partition that must succeed (one
  // chunk per device, or the chunks asked for) fails with its own error, which names its key;
  // at two chunks when none were asked for, choose_schedule takes a failure as "not possible".
  struct PartitionFailed {
    UserError error;
  };
  const auto costs_at = [&](int v) {
    try {
      const PartitionPlan plan = plan_partition(train_, costs, partition_options(v));
      return derived_costs(train_, plan, backward_options(plan));
    } catch (const UserError& e) {
      if (v == 1 || spec.chunks) throw PartitionFailed{e};
      throw;
    }
  };
  ScheduleChoice c;
  try {
    c = at_key(cfg_, key, [&] { return choose_schedule(spec, costs_at); });
  } catch (const PartitionFailed& f) {
    throw f.error;
  }
  schedule_ = std::move(c.schedule);
  lowered_ = std::move(c.lowered);
}

void Trainer::open_data() {
  DataOptions o;
  o.kind = cfg_.data.kind;
  o.inputs = cfg_.data.inputs;
  o.targets = cfg_.data.targets;
  o.file = cfg_.data.file;
  o.samples = cfg_.data.samples;
  o.shuffle = cfg_.data.shuffle;
  o.eval_fraction = cfg_.data.eval_fraction;
  o.seed = cfg_.seed;
  o.where = [this](const std::string& key) { return cfg_.where(key); };
  o.path_rule = [this](const std::string& key) { return cfg_.path_rule(key); };
  std::vector<FeedSpec> inputs;
  for (ValueId v : model_.inputs) {
    const Value& val = model_.value(v);
    inputs.push_back({val.name, val.type, is_floating(val.type.dtype) ? 0 : index_limit(model_, v)});
  }
  const Graph& last = chunks_.back().forward;
  FeedSpec target{kLossTarget, last.value(last.find(kLossTarget)).type, 0};
  if (loss_.kind == LossSpec::Kind::kCrossEntropy) {
    const ValueId out = loss_.output.empty() ? model_.outputs.front() : model_.find(loss_.output);
    target.limit = model_.value(out).type.shape.back();
  }
  data_ = std::make_unique<DataLoader>(o, std::move(inputs), std::move(target));
  const int64_t global = rows_ * cfg_.pipeline.micro_batches;
  if (data_->train_samples() < global)
    throw UserError(cfg_.where("data"), "the training split holds " + std::to_string(data_->train_samples()) +
                                            " samples, fewer than one global batch (" + std::to_string(global) + ")",
                    "give more data, or lower dims.batch or pipeline.micro_batches");
}

std::map<std::string, const Tensor*> Trainer::trained_tensors() const {
  std::map<std::string, const Tensor*> out;
  for (const std::string& p : params_) out[p] = train_.value(train_.find(p)).init.get();
  for (const BatchNormStats& bn : form_.batch_norms) {
    out[bn.running_mean] = train_.value(train_.find(bn.running_mean)).init.get();
    out[bn.running_var] = train_.value(train_.find(bn.running_var)).init.get();
  }
  return out;
}

void Trainer::save_checkpoint(int64_t steps_done) {
  pull_parameters();
  Checkpoint c;
  c.step = steps_done;
  c.data_position = data_->position();
  c.meta["model"] = cfg_.model;
  c.meta["model_file"] = std::filesystem::absolute(cfg_.model).lexically_normal().string();  // from any folder
  c.meta["global_batch"] = std::to_string(rows_ * cfg_.pipeline.micro_batches * ranks_.replicas());
  c.meta["stages"] = std::to_string(cfg_.pipeline.stages);
  c.meta["optimizer"] = cfg_.optimizer.kind;
  // Across processes each rank writes what it holds (train/checkpoint.h): its devices'
  // parameters (replica 0 alone: the replicas hold the same) and optimizer state (every
  // replica its shard under ZeRO-1, else replica 0 alone); then rank 0 names the parts.
  Checkpoint part;
  part.step = steps_done;
  Checkpoint& mine = ranks_.alone() ? c : part;
  const bool first_replica = ranks_.replica() == 0;
  for (const auto& [name, t] : trained_tensors())
    if (ranks_.alone() || (first_replica && (!first_device_.count(name) ? ranks_.rank() == 0 : owner_of(name) == ranks_.rank())))
      mine.tensors.emplace_back("model/" + name, *t);
  std::vector<double> steps(optimizers_.size(), 0.0);
  for (size_t d = 0; d < optimizers_.size(); ++d) {
    if (!here(d)) continue;
    const OptimizerState st = optimizers_[d]->state();
    if (first_replica) steps[d] = static_cast<double>(st.step);
    if (!first_replica && !sharded()) continue;
    for (const auto& [name, t] : st.tensors) mine.tensors.emplace_back("optimizer/" + name, t);
  }
  ranks_.sum(steps);
  for (size_t d = 0; d < steps.size(); ++d) c.meta["optimizer" + std::to_string(d) + ".step"] = std::to_string(static_cast<int64_t>(steps[d]));
  if (ranks_.alone()) {
    write_checkpoint(cfg_.checkpoint.dir, c);
  } else {
    // Every part is on disk before the file that names them: the sum waits for every rank.
    std::vector<int64_t> wrote(static_cast<size_t>(ranks_.size()), 0);
    if (!part.tensors.empty()) {
      write_checkpoint_part(cfg_.checkpoint.dir, part, ranks_.rank());
      wrote[static_cast<size_t>(ranks_.rank())] = 1;
    }
    ranks_.max(wrote);
    std::vector<std::string> parts;
    for (int r = 0; r < ranks_.size(); ++r)
      if (wrote[static_cast<size_t>(r)]) parts.push_back(checkpoint_part_name(steps_done, r));
    if (ranks_.rank() == 0) write_checkpoint(cfg_.checkpoint.dir, c, parts);
  }
  saved_step_ = steps_done;
}

// Ctrl-C or SIGTERM between steps: the last finished step is kept where a checkpoint.dir is set,
// one line says what was kept and how to go on; the outputs of a finished run are not written.
int Trainer::stop_interrupted(int64_t steps_done, int signal) {
  progress_->end();
  std::ostringstream line;
  line << "interrupted at step " << steps_done << " of " << cfg_.steps << ": ";
  if (cfg_.checkpoint.dir.empty()) {
    line << "nothing was kept (the config names no checkpoint.dir); add checkpoint: {dir: DIR, every: N} to "
            "make a run resumable";
  } else {
    if (saved_step_ != steps_done) save_checkpoint(steps_done);
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld.ckpt", static_cast<long long>(steps_done));
    line << "checkpoint " << name << " in " << cfg_.checkpoint.dir << "; continue with --resume";
  }
  std::cout << std::flush;
  if (ranks_.rank() == 0) std::cerr << line.str() << "\n";
  return interrupted_exit_code(signal);
}

void Trainer::stop_nonfinite(int64_t s, double norm, const std::vector<FeedMap>& feeds, int first) {
  share_parameters();  // the watched run needs every device's parameters of this step
  if (ranks_.rank() == 0) {
    const auto text = [](double x) { return std::isnan(x) ? std::string("nan") : std::string(x > 0 ? "inf" : "-inf"); };
    std::string what = !std::isfinite(last_loss_) ? "the loss is " + text(last_loss_) : "the gradient norm is " + text(norm);
    CpuBackend cpu(cfg_.threads);
    ReferenceStep watch(chunks_, cpu, true);
    for (size_t m = 0; m < feeds.size() && !watch.first_nonfinite(); ++m) {
      watch.run_micro_batch(feeds[m]);
      if (const NonFinite* f = watch.first_nonfinite())
        what += "; the first " + f->what + ": output '" + f->value + "' of node '" + f->node + "' (" + f->op + ") in the " +
                f->pass + " of chunk " + std::to_string(f->chunk) + " (stage " +
                std::to_string(schedule_.device_of(static_cast<int>(f->chunk))) + "), micro-batch " +
                std::to_string(first + static_cast<int>(m));
    }
    if (!watch.first_nonfinite()) what += "; every node stays finite when this replica's micro-batches run again on the CPU";
    throw UserError("step " + std::to_string(s + 1), what,
                    "the run stopped before updating the parameters; the last checkpoint is kept: lower optimizer.lr, "
                    "set optimizer.clip_grad_norm, or look at that node's inputs");
  }
  std::vector<double> wait = {0};
  ranks_.sum(wait);  // rank 0 never joins: its error ends every rank (MPI_Abort)
  std::abort();
}

void Trainer::resume() {
  const std::optional<Checkpoint> c = read_latest_checkpoint(cfg_.checkpoint.dir);
  if (!c) {
    std::cout << "no checkpoint in " << cfg_.checkpoint.dir << " yet: starting at step 0\n";
    return;
  }
  const std::string where = cfg_.where("checkpoint.dir");
  const std::string global = std::to_string(rows_ * cfg_.pipeline.micro_batches * ranks_.replicas());
  // The same model file: the same path, or (a config with relative_to: config resumed from
  // another folder) the same absolute file.
  std::error_code ec;
  const bool same_model = c->meta.at("model") == cfg_.model ||
                          (c->meta.count("model_file") && std::filesystem::equivalent(c->meta.at("model_file"), cfg_.model, ec));
  if (!same_model || c->meta.at("global_batch") != global)
    throw UserError(where, "the checkpoint was written for " + c->meta.at("model") + " with global batch " +
                               c->meta.at("global_batch") + ", this run trains " + cfg_.model + " with " + global,
                    "resume with the config that wrote it, or choose another checkpoint.dir");
  // Keys older checkpoints lack are not checked; their optimizer count still names the stages.
  auto written = [&](const std::string& key) { return c->meta.count(key) ? c->meta.at(key) : std::string(); };
  int saved_stages = 0;
  while (c->meta.count("optimizer" + std::to_string(saved_stages) + ".step")) ++saved_stages;
  if (saved_stages != cfg_.pipeline.stages)
    throw UserError(where, "the checkpoint was written with pipeline.stages: " + std::to_string(saved_stages) +
                               ", this run has " + std::to_string(cfg_.pipeline.stages),
                    "resume with --set pipeline.stages=" + std::to_string(saved_stages) +
                        ", or start over with --overwrite");
  if (!written("optimizer").empty() && written("optimizer") != cfg_.optimizer.kind)
    throw UserError(where, "the checkpoint was written with optimizer.kind: " + written("optimizer") +
                               ", this run has " + cfg_.optimizer.kind,
                    "resume with --set optimizer.kind=" + written("optimizer") + ", or start over with --overwrite");
  for (const auto& [name, t] : trained_tensors()) {
    const Tensor* saved = c->find("model/" + name);
    if (!saved || !(saved->type == t->type))
      throw UserError(where, "the checkpoint has no " + t->type.str() + " '" + name + "'",
                      "resume with the model and config that wrote it");
    mutable_initializer(name).data = saved->data;
  }
  for (size_t d = 0; d < optimizers_.size(); ++d) {
    OptimizerState st = optimizers_[d]->state();
    auto it = c->meta.find("optimizer" + std::to_string(d) + ".step");
    if (it == c->meta.end())
      throw UserError(where, "the checkpoint has no optimizer state for device " + std::to_string(d),
                      "resume with the pipeline.stages that wrote it");
    st.step = std::stoll(it->second);
    for (auto& [name, t] : st.tensors) {
      const Tensor* saved = c->find("optimizer/" + name);
      if (!saved) throw UserError(where, "the checkpoint has no optimizer state '" + name + "'", "resume with the optimizer that wrote it");
      t = *saved;
    }
    at_key(cfg_, "checkpoint.dir", [&] { optimizers_[d]->load_state(st); });
  }
  data_->seek(c->data_position);
  first_step_ = c->step;
  if (first_step_ < cfg_.steps) std::cout << "resumed from step " << c->step << " (" << cfg_.checkpoint.dir << ")\n";
}

// One step, as a script: the feeds, the pipeline step, the gradients over the replicas, the
// BatchNorm statistics, the norm and the loss, the update, the record, then evaluation and a
// checkpoint when due.
void Trainer::step(int64_t s) {
  const Clock::time_point begin = Clock::now();
  const StepFeeds in = draw_feeds(s);
  StepClock clock;  // the executor's action times count from here
  executor_->run_step(in.feeds);
  reduce_gradients(&clock);
  update_batch_norm_statistics();
  const double norm = gradient_norm();
  last_loss_ = summed_loss();
  // A NaN or an Inf stops the run before the update: the parameters stay those of the last step.
  if (!std::isfinite(last_loss_) || !std::isfinite(norm)) stop_nonfinite(s, norm, in.feeds, in.first);
  const double lr = update_parameters(norm, &clock);
  record_step(s, begin, clock, norm, lr);
  after_step(s + 1);
}

// Data parallelism: every replica draws the global batch (D x M micro-batches, the loss scaled
// over all of it) and runs its own M; micro-batch m of replica k is global k * M + m.
Trainer::StepFeeds Trainer::draw_feeds(int64_t s) {
  const int M = cfg_.pipeline.micro_batches, D = ranks_.replicas();
  StepFeeds in;
  in.first = ranks_.replica() * M;
  std::vector<FeedMap> all = data_->next(D * M);
  std::vector<const Tensor*> targets;
  for (const FeedMap& f : all) targets.push_back(&f.at(kLossTarget));
  const float scale = loss_scale(loss_, targets, cfg_.where("data"));
  in.feeds.assign(std::make_move_iterator(all.begin() + in.first), std::make_move_iterator(all.begin() + in.first + M));
  for (int m = 0; m < M; ++m) {
    in.feeds[static_cast<size_t>(m)][kLossScale] = scalar_tensor(scale);
    if (form_.dropout_key)
      in.feeds[static_cast<size_t>(m)][kDropoutKey] = scalar_tensor(dropout_key_for(cfg_.seed, s, in.first + m));
  }
  return in;
}

// Each parameter's gradient over the replicas, added in replica order: the same on every replica
// and from run to run (ZeRO-1: each replica sums its shard only).
void Trainer::reduce_gradients(StepClock* clock) {
  clock->spans[0] = clock->since();
  if (sharded()) reduce_scatter_gradients();
  else if (ranks_.replicas() > 1)
    for (auto& [p, g] : executor_->grads()) ranks_.sum_in_replica_order(g.as<float>(), static_cast<size_t>(g.type.numel()));
  clock->spans[1] = clock->since();
  sum_sites(sites_, executor_->grads());  // the copies' data is the parameter's: one update serves
}

// BatchNorm buffers, micro-batch by micro-batch as torch updates them.
void Trainer::update_batch_norm_statistics() {
  for (int m = 0; m < cfg_.pipeline.micro_batches; ++m)
    for (size_t i = 0; i < form_.batch_norms.size(); ++i) {
      const BatchNormStats& bn = form_.batch_norms[i];
      const std::vector<Tensor>& side = executor_->side_outputs(m);
      update_running_statistics(mutable_initializer(bn.running_mean), mutable_initializer(bn.running_var),
                                side[2 * i], side[2 * i + 1], bn.momentum);
    }
}

// Each device's squared norm from its rank, summed: the same norm as in one process.
double Trainer::gradient_norm() {
  std::vector<double> squares;
  for (size_t d = 0; d < optimizers_.size(); ++d)
    squares.push_back(!here(d)           ? 0.0
                      : sharded()        ? sharded_squared_norm(d)
                      : device_updates() ? optimizers_[d]->squared_norm(device_grads_[d])
                                         : Optimizer::squared_norm(whole_[d], executor_->grads()));
  ranks_.sum(squares, Over::kReplica);
  return Optimizer::global_norm(squares);
}

// Each replica's loss is held where its last chunk runs; their sum, in replica order.
double Trainer::summed_loss() {
  std::vector<double> losses(static_cast<size_t>(ranks_.replicas()), 0.0);
  losses[static_cast<size_t>(ranks_.replica())] = executor_->loss();
  ranks_.sum(losses);
  double sum = 0;
  for (double l : losses) sum += l;
  return sum;
}

// Every device of this rank steps its optimizer; ZeRO-1: each replica updated its shard, and
// every replica takes the others' (exactly). Then the devices' copies of what changed. Returns
// the step's learning rate.
double Trainer::update_parameters(double norm, StepClock* clock) {
  const double lr = optimizers_.front()->current_lr();
  for (size_t d = 0; d < optimizers_.size(); ++d) {
    if (!here(d)) continue;
    if (device_updates()) optimizers_[d]->step(device_grads_[d], norm);
    else optimizers_[d]->step(executor_->grads(), norm);
  }
  clock->spans[2] = clock->since();
  if (sharded()) gather_parameter_shards();
  clock->spans[3] = clock->since();
  if (!device_updates()) devices_.refresh_constants();  // device copies of the parameters and BatchNorm buffers
  else
    for (const BatchNormStats& bn : form_.batch_norms)
      for (const std::string& buffer : {bn.running_mean, bn.running_var}) devices_.refresh_constant(mutable_initializer(buffer));
  return lr;
}

// The step's times, bubble and peak kept bytes: to the progress line, the metrics, the trace (the
// first steps; its gathers are collectives on every rank alike, so they stop with it) and the
// costs the summary measures.
void Trainer::record_step(int64_t s, Clock::time_point begin, const StepClock& clock, double norm, double lr) {
  const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  const std::vector<std::vector<ActionTime>> times = step_times();
  const Simulation measured = measured_step(lowered_, times);
  std::vector<int64_t> peak_kept = executor_->peak_kept_bytes();
  ranks_.max(peak_kept, Over::kReplica);
  const double samples_per_s = static_cast<double>(rows_ * cfg_.pipeline.micro_batches * ranks_.replicas()) / seconds;
  if (s > first_step_) step_seconds_.push_back(seconds);
  if (s - first_step_ < kTraceSteps)
    trace_step(s, std::chrono::duration<double>(clock.run_begin - t0_).count(), times, collective_spans(clock.spans));
  if (s > first_step_ && timed_.size() < 8) timed_.push_back(times);  // the first warms up
  for (size_t d = 0; d < peak_kept_.size(); ++d) peak_kept_[d] = std::max(peak_kept_[d], peak_kept[d]);
  progress_->step(s, last_loss_, lr, samples_per_s, measured.bubble);
  if (metrics_.is_open()) {
    nlohmann::json j = {{"step", s + 1},       {"loss", last_loss_},   {"lr", lr},
                        {"grad_norm", norm},   {"step_s", seconds},    {"samples_per_s", samples_per_s},
                        {"bubble", measured.bubble}, {"peak_kept_bytes", peak_kept}};
    metrics_ << j.dump() << "\n" << std::flush;
  }
}

// After `done` steps: the held-out evaluation and a checkpoint, each when due (and after the last).
void Trainer::after_step(int64_t done) {
  const bool last = done == cfg_.steps;
  if (cfg_.eval_every > 0 && data_->eval_batches() > 0 && (done % cfg_.eval_every == 0 || last)) {
    share_parameters();  // the whole model evaluates on every rank; rank 0 reports
    const EvalResult r = eval_->run(*data_);
    std::ostringstream line;
    line << "eval after step " << done << ": loss " << std::fixed << std::setprecision(4) << r.loss;
    if (r.accuracy >= 0) line << ", accuracy " << std::setprecision(3) << r.accuracy;
    line << " (" << r.samples << " held-out samples)";
    progress_->note(line.str(), last);
    if (metrics_.is_open()) {
      nlohmann::json j = {{"step", done}, {"eval_loss", r.loss}, {"eval_samples", r.samples}};
      if (r.accuracy >= 0) j["eval_accuracy"] = r.accuracy;
      metrics_ << j.dump() << "\n" << std::flush;
    }
  }
  if (!cfg_.checkpoint.dir.empty() && cfg_.checkpoint.every > 0 && (done % cfg_.checkpoint.every == 0 || last)) {
    save_checkpoint(done);
    progress_->note("checkpoint: step " + std::to_string(done) + " -> " + cfg_.checkpoint.dir);
  }
}

// Keeps the metrics lines of steps a resumed run has already taken, drops the rest.
void trim_metrics(const std::string& path, int64_t steps_done) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("step") && j.at("step").get<int64_t>() <= steps_done) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      // a line cut short by the kill: dropped
    }
  }
  write_file_atomic(path, kept, "choose another output.metrics");
}

// --profile: per pass (F, B, W) and op type, the kernel time per step summed over every device,
// largest first, and the share of all kernel time; beside it what the cost model counts for the
// same nodes (plan/chunk_costs.h work units), in ms at the one rate that makes the two totals
// equal, and the ratio: a row far from 1 is an op the model misprices (or a slow kernel).
void Trainer::print_profile() const {
  const std::vector<PipelineExecutor::OpTime> rows = executor_->op_profile();
  const double steps = static_cast<double>(cfg_.steps - profiled_from_);
  double total = 0, units = 0;
  for (const auto& r : rows) {
    total += r.seconds;
    units += work_units(r.cost);
  }
  if (total <= 0 || steps <= 0) return;
  units *= schedule_.micro_batches;  // each chunk's F, B and W run once per micro-batch
  const double ms_per_unit = units > 0 ? total / steps * 1e3 / units : 0;
  std::cout << "kernel time per step, steps " << profiled_from_ + 1 << " to " << cfg_.steps
            << " (each kernel timed alone, all devices): " << std::fixed << std::setprecision(2)
            << total / steps * 1e3 << " ms; model ms at " << std::setprecision(2)
            << (ms_per_unit > 0 ? 1 / (ms_per_unit * 1e-3) : 0) << " GFLOP-equivalents/s\n";
  std::cout << "  pass  op                          nodes        ms  share  model ms  ratio\n";
  double shown = 0;
  for (size_t i = 0; i < rows.size() && (i < 12 || shown < 0.995 * total) && i < 40; ++i) {
    const auto& r = rows[i];
    shown += r.seconds;
    const double ms = r.seconds / steps * 1e3, model = work_units(r.cost) * schedule_.micro_batches * ms_per_unit;
    std::cout << "  " << std::left << std::setw(6) << r.pass << std::setw(28) << r.op << std::right << std::setw(5)
              << r.nodes << std::setw(10) << std::setprecision(3) << ms << std::setw(6) << std::setprecision(1)
              << 100 * r.seconds / total << "%" << std::setw(10) << std::setprecision(3) << model << std::setw(7);
    if (model > 0)
      std::cout << std::setprecision(2) << ms / model << "\n";
    else
      std::cout << "-" << "\n";
  }
}

void Trainer::finish() {
  progress_->end();
  share_parameters();  // the trained model, whole, on every rank (rank 0 writes it)
  if (timed_.empty()) timed_.push_back(step_times());
  const Costs costs = measured_costs(planned_, lowered_, timed_);
  const Simulation predicted = simulate(lowered_, costs);
  const Simulation measured = measured_step(lowered_, timed_.back());
  double bubble = 0, makespan = 0;
  for (const auto& times : timed_) {
    const Simulation m = measured_step(lowered_, times);
    bubble += m.bubble / static_cast<double>(timed_.size());
    makespan += m.makespan / static_cast<double>(timed_.size());
  }
  const std::vector<double> planned = peak_memory(lowered_, planned_);
  std::cout << "schedule " << schedule_.kind << ": " << schedule_.stages << " stages x " << schedule_.chunks
            << " chunk(s), " << schedule_.micro_batches << " micro-batches; measured step " << std::fixed
            << std::setprecision(2) << makespan * 1e3 << " ms, bubble " << std::setprecision(1) << 100 * bubble
            << "%; simulated on measured costs " << std::setprecision(2) << predicted.makespan * 1e3 << " ms, bubble "
            << std::setprecision(1) << 100 * predicted.bubble << "%\n";
  std::cout << "peak kept activations per device, measured / planned:";
  for (size_t d = 0; d < planned.size(); ++d)
    std::cout << (d ? "," : "") << " " << format_bytes(peak_kept_[d]) << " / "
              << format_bytes(static_cast<int64_t>(planned[d]));
  std::cout << "\n";
  print_chunk_times(std::cout, schedule_, planned_, costs);
  if (metrics_.is_open()) {
    std::vector<double> sorted = step_seconds_;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted.empty() ? 0 : sorted[sorted.size() / 2];
    nlohmann::json chunk_costs_s = nlohmann::json::array(), chunk_costs_model = nlohmann::json::array();
    for (const ChunkCost& c : costs.chunks) chunk_costs_s.push_back({c.f, c.b, c.w});
    for (const ChunkCost& c : planned_.chunks) chunk_costs_model.push_back({c.f, c.b, c.w});
    nlohmann::json j = {{"schedule", schedule_.kind},
                        {"stages", schedule_.stages},
                        {"chunks", schedule_.chunks},
                        {"micro_batches", schedule_.micro_batches},
                        {"rows", rows_},
                        {"threads", cfg_.threads},
                        {"measured_bubble", bubble},
                        {"measured_makespan_s", makespan},
                        {"simulated_bubble", predicted.bubble},
                        {"simulated_makespan_s", predicted.makespan},
                        {"step_s_median", median},
                        {"peak_kept_bytes_measured", peak_kept_},
                        {"peak_kept_bytes_planned", planned},
                        {"chunk_costs_s", chunk_costs_s},
                        {"chunk_costs_model", chunk_costs_model}};
    metrics_ << nlohmann::json{{"summary", j}}.dump() << "\n" << std::flush;
  }
  if (profiled_from_ >= 0) print_profile();
  if (!cfg_.output.model.empty()) {
    make_parent(cfg_.output.model);
    save_model_with_weights(cfg_.model, trained_tensors(), cfg_.output.model, cfg_.parameters);
    std::cout << "trained model -> " << cfg_.output.model << "\n";
  }
  if (!cfg_.output.safetensors.empty()) write_weights();
  if (!cfg_.output.trace.empty()) {
    make_parent(cfg_.output.trace);
    trace_.write(cfg_.output.trace, "output.trace");
    std::cout << "trace (" << trace_.events() << " events, open in Perfetto) -> " << cfg_.output.trace << "\n";
  }
  if (!cfg_.output.timeline.empty()) {
    make_parent(cfg_.output.timeline);
    write_file_atomic(cfg_.output.timeline,
                      svg_timelines(lowered_, {{"measured (last step)", measured}, {"simulated on measured costs", predicted}}),
                      "choose another output.timeline");
    std::cout << "timeline, measured above simulated -> " << cfg_.output.timeline << "\n";
  }
}

// Every BatchNorm ran one training-mode forward per micro-batch of every step, resumed or not.
TrainedState Trainer::trained_state() const {
  TrainedState t;
  t.tensors = trained_tensors();
  for (const BatchNormStats& bn : form_.batch_norms) t.counted.insert(bn.running_mean);
  t.forwards = cfg_.steps * cfg_.pipeline.micro_batches;
  t.module_names = model_.module_names;
  t.start_state = cfg_.output.start_state;
  return t;
}

void Trainer::write_weights() {
  const TrainedState t = trained_state();
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"producer", "pipetrain"}, {"model", cfg_.model}, {"steps", std::to_string(cfg_.steps)}};
  make_parent(cfg_.output.safetensors);
  const WeightsWritten w = write_trained_weights(cfg_.model, module_, t, meta, cfg_.output.safetensors);
  std::cout << "trained weights -> " << cfg_.output.safetensors << "\n";
  const auto list = [](const std::vector<std::string>& keys) {
    std::string s;
    for (size_t i = 0; i < keys.size() && i < 5; ++i) s += " " + keys[i];
    return s + (keys.size() > 5 ? " ..." : "");
  };
  if (!w.completed.empty() && cfg_.optimizer.weight_decay > 0)
    std::cout << "  warning: the elements of" << list(w.completed) << " that the model file does not hold are "
              << "written as output.start_state has them; PyTorch's weight decay would have shrunk them\n";
  if (!w.not_in_start.empty())
    std::cout << "  " << w.not_in_start.size() << " trained tensor(s) output.start_state does not name, written too:"
              << list(w.not_in_start) << " (load with strict=False)\n";
  if (w.missing.empty()) return;
  std::cout << "  " << w.missing.size() << " state_dict key(s) the model file does not hold, left out:";
  for (size_t i = 0; i < w.missing.size() && i < 5; ++i) std::cout << " " << w.missing[i];
  std::cout << (w.missing.size() > 5 ? " ..." : "") << " (load with strict=False)\n";
}

// A checkpoint folder holds one run's series: a fresh run that would write checkpoints into a
// folder holding some refuses (before anything is built or written), unless --overwrite.
void Trainer::claim_checkpoint_dir() const {
  if (cfg_.checkpoint.dir.empty() || cfg_.checkpoint.every <= 0 || args_.overwrite) return;
  const std::vector<int64_t> steps = checkpoint_steps(cfg_.checkpoint.dir);
  if (steps.empty()) return;
  throw UserError(cfg_.where("checkpoint.dir"),
                  "'" + cfg_.checkpoint.dir + "' holds another run's checkpoints (up to step " +
                      std::to_string(steps.back()) + ")",
                  "continue that run with --resume, start over with --overwrite (deletes them), or --set "
                  "checkpoint.dir=ANOTHER");
}

void Trainer::check_across_processes() const {
  const int n = ranks_.size() / ranks_.replicas();  // the processes of one replica
  const auto refuse = [&](const std::string& key, const std::string& what, const std::string& todo) {
    throw UserError(cfg_.where(key), what + " (running on " + std::to_string(n) + " processes)", todo);
  };
  if (cfg_.pipeline.stages % n != 0)
    refuse("pipeline.stages", std::to_string(cfg_.pipeline.stages) + " stages do not split evenly over the ranks" +
                                  std::string(ranks_.replicas() > 1 ? " of a replica" : ""),
           "use a multiple of " + std::to_string(n) + " stages, or start " + std::to_string(cfg_.pipeline.stages) +
               " processes or fewer that divide it");
}

// Every rank must run the same plan: the lowered schedule's actions and each chunk's nodes and
// parameters, hashed and compared before the first step.
void Trainer::check_plan_across_processes() const {
  if (ranks_.alone()) return;
  std::string text = lowered_.kind + "/" + std::to_string(lowered_.micro_batches);
  for (const auto& list : lowered_.devices)
    for (const Action& a : list) text += format_action(a) + ";";
  for (const BackwardGraphs& c : chunks_) {
    for (const Node& n : c.forward.nodes) text += n.op_type + ",";
    for (const std::string& p : c.params) text += p + ",";
  }
  ranks_.check_same(fnv1a(text), "the plan (schedule, stages and their parameters)");
  if (!side_.empty())
    throw UserError(cfg_.where("model"), "has BatchNormalization, whose running statistics do not yet cross processes",
                    "train it in one process");
  // A parameter read at several nodes sums its sites' gradients where it is updated: every
  // site must be on that rank.
  for (const ParameterSites& s : sites_) {
    std::set<int> ranks;
    for (size_t c = 0; c < chunks_.size(); ++c)
      for (const std::string& p : chunks_[c].params)
        if (p == s.parameter || std::count(s.copies.begin(), s.copies.end(), p))
          ranks.insert(rank_of_[static_cast<size_t>(schedule_.device_of(static_cast<int>(c)))]);
    if (ranks.size() > 1)
      throw UserError("parameter '" + s.parameter + "'",
                      "is read by stages on " + std::to_string(ranks.size()) + " processes (a tie across processes)",
                      "train in one process, or under a V-shaped schedule (zb-v, v-half, v-min, dualpipev), "
                      "which puts the first and last chunks on one device");
  }
}

int Trainer::owner_of(const std::string& param) const {
  return rank_of_[static_cast<size_t>(first_device_.at(param))];
}

void Trainer::bind_device_updates(const std::vector<int>& placement) {
  if (ranks_.replicas() > 1 || !sites_.empty()) return;
  for (size_t d = 0; d < devices_.backends.size(); ++d)
    if (here(d) && !devices_.backends[d]->updates_parameters()) return;
  std::map<std::string, int> device_of;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (const std::string& p : chunks_[c].params) {
      const auto [it, fresh] = device_of.emplace(p, placement[c]);
      if (!fresh && it->second != placement[c]) return;  // read on two devices
    }
  std::vector<std::vector<const float*>> grads(optimizers_.size());
  std::vector<std::vector<float*>> params(optimizers_.size());
  for (size_t d = 0; d < optimizers_.size(); ++d) {
    if (!here(d)) continue;  // another process's device
    Backend& b = *devices_.backends[d];
    for (const OptimizerParam& p : whole_[d]) {
      const float* g = executor_->device_gradient(p.name, b);
      if (!g) return;
      grads[d].push_back(g);
      params[d].push_back(static_cast<float*>(const_cast<void*>(b.device_constant(*p.value))));
    }
  }
  for (size_t d = 0; d < optimizers_.size(); ++d)
    if (here(d)) optimizers_[d]->bind_device(*devices_.backends[d], std::move(params[d]));
  device_grads_ = std::move(grads);
  executor_->keep_gradients_on_device();
}

void Trainer::pull_parameters() {
  if (!device_updates()) return;
  for (size_t d = 0; d < whole_.size(); ++d) {
    if (!here(d)) continue;
    Backend& b = *devices_.backends[d];
    for (const OptimizerParam& p : whole_[d]) b.copy(p.value->data.data(), b.device_constant(*p.value), p.value->data.size());
  }
}

void Trainer::share_parameters() {
  pull_parameters();
  if (ranks_.alone()) return;
  for (const std::string& p : params_) {
    Tensor& t = mutable_initializer(p);
    ranks_.share(t.data.data(), t.data.size(), owner_of(p) == ranks_.rank(), Over::kReplica);
  }
  devices_.refresh_constants();
}

void Trainer::reduce_scatter_gradients() {
  std::map<std::string, Tensor>& grads = executor_->grads();
  std::map<std::string, std::vector<std::string>> copies;
  for (const ParameterSites& site : sites_) copies[site.parameter] = site.copies;
  for (size_t d = 0; d < whole_.size(); ++d) {
    if (!here(d)) continue;
    std::vector<size_t> counts(static_cast<size_t>(ranks_.replicas()), 0);
    std::vector<Tensor*> order;
    for (size_t i = 0; i < whole_[d].size(); ++i) {
      std::vector<std::string> names = {whole_[d][i].name};
      if (copies.count(names[0])) names.insert(names.end(), copies[names[0]].begin(), copies[names[0]].end());
      for (const std::string& n : names) {
        auto it = grads.find(n);
        if (it == grads.end()) continue;  // no gradient reaches it: the same on every replica
        order.push_back(&it->second);
        counts[static_cast<size_t>(shard_of_[d][i])] += static_cast<size_t>(it->second.type.numel());
      }
    }
    std::vector<float> packed;
    for (const Tensor* g : order) packed.insert(packed.end(), g->as<float>(), g->as<float>() + g->type.numel());
    ranks_.sum_shard_in_replica_order(packed.data(), counts);
    size_t at = 0;
    for (Tensor* g : order) {
      std::copy_n(packed.data() + at, g->type.numel(), g->as<float>());
      at += static_cast<size_t>(g->type.numel());
    }
  }
}

double Trainer::sharded_squared_norm(size_t d) const {
  std::vector<bool> mine;
  for (int k : shard_of_[d]) mine.push_back(k == ranks_.replica());
  std::vector<double> terms = Optimizer::squares(whole_[d], executor_->grads(), mine);
  ranks_.sum(terms, Over::kPosition);  // each term from its shard's replica, zeros elsewhere: exact
  return Optimizer::sum_in_order(terms);
}

void Trainer::gather_parameter_shards() {
  for (size_t d = 0; d < whole_.size(); ++d) {
    if (!here(d)) continue;
    std::vector<size_t> bytes(static_cast<size_t>(ranks_.replicas()), 0);
    std::vector<std::byte> packed;
    for (size_t i = 0; i < whole_[d].size(); ++i) {
      const Tensor& t = *whole_[d][i].value;
      bytes[static_cast<size_t>(shard_of_[d][i])] += t.data.size();
      packed.insert(packed.end(), t.data.begin(), t.data.end());
    }
    ranks_.gather_shards(packed.data(), bytes);
    size_t at = 0;
    for (const OptimizerParam& p : whole_[d]) {
      std::copy_n(packed.data() + at, p.value->data.size(), p.value->data.data());
      at += p.value->data.size();
    }
  }
}

void Trainer::trace_step(int64_t s, double at, const std::vector<std::vector<ActionTime>>& times,
                         const std::vector<TraceSpan>& collectives) {
  const int D = ranks_.replicas();
  if (D == 1) {
    trace_.add_step(s, at, lowered_, times, device_names_, collectives);
    return;
  }
  // Each rank its devices' times in its replica's slot, zeros elsewhere; summed over every rank.
  const std::vector<std::vector<ActionTime>> mine = executor_->action_times();
  size_t per = 0;
  for (const auto& list : mine) per += 2 * list.size();
  std::vector<double> all(per * static_cast<size_t>(D), 0.0);
  size_t at_slot = per * static_cast<size_t>(ranks_.replica());
  for (size_t d = 0; d < mine.size(); ++d)
    for (const ActionTime& t : mine[d]) {
      if (here(d)) {
        all[at_slot] = t.start;
        all[at_slot + 1] = t.end;
      }
      at_slot += 2;
    }
  ranks_.sum(all);
  const int ranks_per_replica = ranks_.size() / D, devices = schedule_.stages;
  const std::vector<int> rank_in_replica = rank_of_devices(devices, ranks_per_replica);
  size_t i = 0;
  for (int k = 0; k < D; ++k) {
    std::vector<std::vector<ActionTime>> replica(mine.size());
    std::vector<std::string> names;
    for (size_t d = 0; d < mine.size(); ++d) {
      for (size_t a = 0; a < mine[d].size(); ++a, i += 2) replica[d].push_back({all[i], all[i + 1]});
      names.push_back("device " + std::to_string(d) + " of replica " + std::to_string(k) + " (rank " +
                      std::to_string(k * ranks_per_replica + rank_in_replica[d]) + ")");
    }
    trace_.add_step(s, at, lowered_, replica, names, k + 1 == D ? collectives : std::vector<TraceSpan>{},
                    static_cast<size_t>(k * devices));
  }
}

std::vector<TraceSpan> Trainer::collective_spans(const std::vector<double>& spans) const {
  if (ranks_.replicas() == 1) return {};
  const size_t per = spans.size();
  std::vector<double> all(per * static_cast<size_t>(ranks_.size()), 0.0);
  std::copy(spans.begin(), spans.end(), all.begin() + static_cast<std::ptrdiff_t>(per * static_cast<size_t>(ranks_.rank())));
  ranks_.sum(all);  // each rank's slot from that rank alone: exact
  std::vector<TraceSpan> out;
  for (int r = 0; r < ranks_.size(); ++r)
    for (int k = 0; k < kCollectives; ++k) {
      const size_t at = per * static_cast<size_t>(r) + 2 * static_cast<size_t>(k);
      if (k == 1 && !sharded()) continue;
      out.push_back({"rank " + std::to_string(r) + ": across replicas", kCollectiveNames[k], all[at], all[at + 1]});
    }
  return out;
}

std::vector<std::vector<ActionTime>> Trainer::step_times() const {
  std::vector<std::vector<ActionTime>> times = executor_->action_times();
  if (ranks_.alone()) return times;
  std::vector<double> flat;
  for (size_t d = 0; d < times.size(); ++d)
    for (const ActionTime& t : times[d]) {
      const bool mine = rank_of_[d] == ranks_.rank();
      flat.push_back(mine ? t.start : 0.0);
      flat.push_back(mine ? t.end : 0.0);
    }
  ranks_.sum(flat, Over::kReplica);
  size_t i = 0;
  for (auto& list : times)
    for (ActionTime& t : list) {
      t.start = flat[i++];
      t.end = flat[i++];
    }
  return times;
}

// A config without `data:` trains on seeded random samples (data.kind: synthetic, for benchmarks
// and tries): one line says so at the start, and how to give real data (rank 0 alone prints).
void Trainer::say_synthetic_data() const {
  std::string inputs;
  for (ValueId v : model_.inputs) inputs += (inputs.empty() ? "" : ", ") + model_.value(v).name + ": FILE.npy";
  std::cout << "data: the config names none, so this run trains on " << data_->samples()
            << " synthetic samples (seeded random inputs and targets); to train on yours add data: {kind: npy, inputs: {"
            << inputs << "}, targets: FILE.npy} or {kind: tokens, file: FILE}\n";
}

int Trainer::run() {
  if (!ranks_.alone()) check_across_processes();
  if (args_.resume && cfg_.checkpoint.dir.empty())
    throw UserError("--resume", "the config names no checkpoint.dir", "add checkpoint: {dir: DIR, every: N}");
  if (!args_.resume) claim_checkpoint_dir();
  for (const auto& [key, path] : {std::pair<const char*, const std::string&>{"output.model", cfg_.output.model},
                                  {"output.safetensors", cfg_.output.safetensors},
                                  {"output.metrics", cfg_.output.metrics},
                                  {"output.trace", cfg_.output.trace},
                                  {"output.timeline", cfg_.output.timeline}})
    check_writable(path, cfg_.where(key));
  build();
  // A start state that cannot complete the output fails now, not after training.
  if (!cfg_.output.safetensors.empty() && !module_)
    at_key(cfg_, "output.start_state", [&] { check_start_state(trained_state()); });
  open_data();
  if (args_.resume) {
    resume();
    if (first_step_ >= cfg_.steps) {  // a finished run: every output stays as it was
      std::cout << "nothing to do: step " << first_step_ << " of " << cfg_.steps << " ("
                << cfg_.checkpoint.dir << "); raise steps (--set steps=N) to train on\n";
      return 0;
    }
    devices_.refresh_constants();
  } else if (args_.overwrite && !cfg_.checkpoint.dir.empty() && !checkpoint_steps(cfg_.checkpoint.dir).empty()) {
    if (ranks_.rank() == 0) clear_checkpoints(cfg_.checkpoint.dir);
    if (!args_.quiet) std::cout << "--overwrite: removed the checkpoints in " << cfg_.checkpoint.dir << "\n";
  }
  if (!cfg_.output.metrics.empty()) {
    make_parent(cfg_.output.metrics);
    if (args_.resume) trim_metrics(cfg_.output.metrics, first_step_);
    metrics_.open(cfg_.output.metrics, args_.resume ? std::ios::app : std::ios::trunc);
    if (!metrics_) throw UserError(cfg_.where("output.metrics"), "cannot write '" + cfg_.output.metrics + "'", "choose another file");
  }
  peak_kept_.assign(static_cast<size_t>(schedule_.stages), 0);
  progress_ = std::make_unique<Progress>(cfg_.steps, args_.quiet);
  if (!args_.quiet && !cfg_.places.count("data")) say_synthetic_data();
  if (!args_.quiet)
    std::cout << "training " << cfg_.model << ": " << params_.size() << " parameter tensors, "
              << data_->train_samples() << " training samples (" << data_->eval_samples() << " held out), "
              << schedule_.kind << " on " << schedule_.stages << " stage(s), " << cfg_.pipeline.micro_batches
              << " micro-batches of " << rows_
              << (ranks_.replicas() > 1 ? " per replica, " + std::to_string(ranks_.replicas()) + " data-parallel replicas" : "")
              << (ranks_.alone() ? "" : " on " + std::to_string(ranks_.size()) + " processes") << "\n";
  if (!args_.quiet && sharded()) {
    int64_t held = 0;
    for (size_t d = 0; d < optimizers_.size(); ++d)
      if (here(d)) held += optimizers_[d]->state_bytes();
    std::cout << "ZeRO-1: each replica holds the optimizer state of 1/" << ranks_.replicas()
              << " of the parameters: " << format_bytes(held) << " on rank 0\n";
  }
  t0_ = Clock::now();
  {
    std::optional<InterruptGuard> own;  // a signal stops the loop at the next step boundary
    InterruptGuard& guard = guard_ ? *guard_ : own.emplace();
    guard.completed(first_step_);
    for (int64_t s = first_step_; s < cfg_.steps; ++s) {
      // The first step warms up (library heuristics, first touches); profile the rest.
      if (args_.profile && (s == first_step_ + 1 || cfg_.steps - first_step_ == 1) && profiled_from_ < 0) {
        executor_->profile_ops();
        profiled_from_ = s;
      }
      step(s);
      // Across processes every rank stops at the same boundary: a signal seen by any of them
      // (the highest number, if several, gives the exit code).
      std::vector<int64_t> stop = {guard.signal()};
      ranks_.max(stop);
      guard.completed(s + 1);  // every rank took part in that reduction
      if (stop[0] > 0 && s + 1 < cfg_.steps) return stop_interrupted(s + 1, static_cast<int>(stop[0]));
    }
  }
  finish();
  return 0;
}

}  // namespace

// One process, or each rank of an mpirun: a rank other than 0 prints nothing and writes no file;
// an error on any rank ends every rank (the others would wait for its messages).
int run_train(const TrainArgs& a) {
  TrainRanks ranks;
  if (ranks.alone()) {
    TrainConfig cfg = load_config(a.config, a.set);
    ranks.split(cfg.parallel.data, cfg.where("parallel.data"));  // D > 1 alone: one line
    Trainer t(std::move(cfg), a, ranks);
    return t.run();
  }
  // From here on a rank lost (or mpirun's SIGTERM) ends this one with its line, set-up included.
  InterruptGuard guard;
  guard.watch_ranks(ranks.rank(), ranks.size(), ranks.host_ranks());
  std::streambuf* out = std::cout.rdbuf();
  std::ofstream discard;
  if (ranks.rank() != 0) std::cout.rdbuf(discard.rdbuf());
  try {
    TrainConfig cfg = load_config(a.config, a.set);
    ranks.split(cfg.parallel.data, cfg.where("parallel.data"));
    if (ranks.rank() != 0) cfg.output = {};
    Trainer t(std::move(cfg), a, ranks, &guard);
    const int code = t.run();
    std::cout.rdbuf(out);
    return code;
  } catch (const std::exception& e) {
    std::cout.rdbuf(out);
    std::cout.flush();
    // One write: mpirun forwards every rank's stderr, and a line in pieces would interleave.
    const std::string line = "error: rank " + std::to_string(ranks.rank()) + " of " + std::to_string(ranks.size()) +
                             ": " + e.what() + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
    ranks.abort(2);
  }
}

}  // namespace pt
