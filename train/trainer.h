// train/trainer.h: the training loop. In: what the chain above made (TrainerPlan: the model as
// imported, its training form, the chunks' F/B/W graphs, the schedule and its lowered form; cli/
// builds it with onnx_import/ and plan/), the run's options (TrainerOptions: steps, optimizer,
// data, checkpoints, devices), and the processes (train/train_ranks.h). Out: the trained
// parameters in the model's initializers, checkpoints, one record per step to a TrainObserver,
// a trace of the first steps, and the measured step against the simulated one.
//
// The Trainer prints nothing: the caller prints the records, the notes and the summary.
//
// Per step (Trainer::step): data (the global batch, this replica's micro-batches), the pipelined
// forward and backward (train/executor.h), the gradients over the replicas (summed in replica
// order; ZeRO-1: train/zero.h), BatchNorm running statistics in micro-batch order (on the rank
// whose device computes them, over every replica's micro-batches: train/trainer_batch_norm.cc),
// the global gradient norm over every device, one optimizer per device, then evaluation
// (train/evaluator.h: a forward-only pipeline over the chunks, each rank running its own) and a
// checkpoint when due. A NaN or an Inf in the loss or the norm stops the run before the update
// with a UserError naming the first non-finite node. A stop signal (StopCheck) ends the loop at
// the next step boundary, on every rank alike.
//
// The schedule owns the micro-batch count: a step draws schedule.micro_batches micro-batches of
// `rows` rows per replica.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autodiff/chunk_backward.h"
#include "autodiff/loss.h"
#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "core/ir.h"
#include "core/tensor_fetch.h"
#include "schedule/costs.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"
#include "train/data.h"
#include "train/evaluator.h"
#include "train/executor.h"
#include "train/optimizer.h"
#include "train/reference_step.h"
#include "train/timeline.h"
#include "train/train_devices.h"
#include "train/ties.h"
#include "train/train_ranks.h"

namespace pt {

struct TrainerPlan {
  Graph model;                         // as imported: what evaluation runs
  Graph train;                         // the training form; shares every initializer's data with model
  TrainingForm form;                   // BatchNorms on batch statistics, the dropout key
  std::vector<ParameterSites> sites;   // parameters read at several nodes (autodiff/parameter_sites.h)
  LossSpec loss;
  int64_t rows = 1;                    // of a micro-batch: the model's batch dimension
  Schedule schedule;                   // compute actions; its micro_batches are each step's
  Schedule lowered;                    // with sends and receives: what the executor runs
  std::vector<BackwardGraphs> chunks;  // in chunk order, placed by the schedule
  Costs planned;                       // the chunks counted (plan/chunk_costs.h): work units, kept bytes
};

struct TrainerOptions {
  std::string model_file;      // the model's path: checkpoints record it, a resume checks it
  int64_t steps = 1;
  int64_t eval_every = 0;      // 0: no evaluation
  uint64_t seed = 0;           // dropout draws (the data's seed is data.seed)
  int threads = 1;             // per CPU device, and the NaN hunt's CPU
  TrainDeviceOptions device;
  OptimizerConfig optimizer;   // validated
  std::string optimizer_kind;  // as the config names it: checkpoints record it
  DataOptions data;
  bool zero1 = false;          // shard the optimizer state over the replicas (train/zero.h)
  std::string checkpoint_dir;  // empty: no checkpoints
  int64_t checkpoint_every = 0;
  bool profile = false;        // time every kernel from the second step on (Trainer::node_profile)
  // Where a config key sits, for errors ("train.yaml:7: data"); empty: the key itself.
  std::function<std::string(const std::string& key)> where;
};

// One finished step, as the progress line and the metrics show it.
struct StepRecord {
  int64_t step = 0;  // from 0
  double loss = 0, lr = 0, grad_norm = 0;
  double seconds = 0, samples_per_s = 0, bubble = 0;
  std::vector<int64_t> peak_kept_bytes;  // per device, this step
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void step(const StepRecord&) {}
  // After `done` steps; `last`: the run's final evaluation.
  virtual void evaluated(int64_t /*done*/, const EvalResult&, bool /*last*/) {}
  virtual void checkpointed(int64_t /*done*/) {}
};

// The loop's stop: signal() is read at each step boundary (0: go on), the highest over the ranks
// stops every rank; completed(n): every rank has completed n steps. Either may be empty.
struct StopCheck {
  std::function<int()> signal;
  std::function<void(int64_t)> completed;
};

// After the last step: the measured step against the simulation on measured costs.
struct TrainSummary {
  Costs costs;                        // measured (train/timeline.h measured_costs), wall time
  // F, B and W as the actions themselves spent them, beside the cost model's: each action's
  // thread CPU time (ActionClock::kThreadCpu) where every device is a CPU running one thread,
  // else as `costs` (wall time: a GPU's work, or a device's OpenMP team, is not its thread's).
  Costs spent;
  ActionClock spent_clock = ActionClock::kWall;
  Simulation predicted;               // on the measured costs
  Simulation measured;                // the last timed step
  double bubble = 0, makespan = 0;    // measured, the mean over the timed steps
  std::vector<double> planned_peak;   // kept bytes per device, as planned
  std::vector<int64_t> peak_kept;     // kept bytes per device, measured
  std::vector<int64_t> arena;         // per device: the programs' arena allocated (scratch included)
  double step_s_median = 0;
};

class Trainer {
 public:
  // Makes the devices, the executor, the optimizers (one per device), the evaluator and the data.
  Trainer(TrainerPlan plan, TrainerOptions options, const TrainRanks& ranks);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Loads the latest checkpoint of checkpoint_dir and goes on from its step; nullopt: none yet.
  std::optional<int64_t> resume();
  // Runs the steps from first_step() to options.steps. Returns the signal that stopped it at a
  // step boundary before the last, 0 when every step ran.
  int run(TrainObserver& observer, const StopCheck& stop = {});
  void save_checkpoint(int64_t steps_done);
  // After run: the step measured and simulated.
  TrainSummary finish();
  // After finish, the outputs: the step's state (programs, gradients, optimizer state) and the
  // evaluation's are freed, then rank 0 runs `write` (it writes the trained model) with a fetch
  // that gives each trained tensor's bytes by name (trained_tensors()) as write asks for them:
  // rank 0's own, or another rank's brought from the rank that updates it, one at a time (the
  // fetch's last alone is held). The other ranks of replica 0 serve them until write returns.
  // No rank holds the whole model. node_profile() is gone from here on.
  void write_trained(const std::function<void(const TensorFetch& fetch)>& write);

  // The trained parameters and the BatchNorm running statistics, by name (across processes the
  // bytes of another rank's are not here: write_trained brings them).
  std::map<std::string, const Tensor*> trained_tensors() const;
  // Every trained parameter and BatchNorm buffer from the rank that updates it (and from the
  // devices) to every rank of its replica: the NaN hunt runs the whole model.
  std::optional<ReferenceCut> reference_cut();
  // The training-mode forwards whose batch statistics each BatchNorm's running statistics take
  // in a step: every micro-batch of the global batch (of every replica).
  int64_t batch_norm_updates_per_step() const { return int64_t{schedule_.micro_batches} * ranks_.replicas(); }

  const Schedule& schedule() const { return schedule_; }
  const Schedule& lowered() const { return lowered_; }
  const Costs& planned() const { return planned_; }  // the chunks counted (plan/chunk_costs.h)
  const Graph& model() const { return model_; }
  const TrainingForm& form() const { return form_; }
  const DataLoader& data() const { return *data_; }
  const std::string& device_summary() const { return devices_.summary; }
  const ChromeTrace& trace() const { return trace_; }
  size_t parameter_count() const { return params_.size(); }
  int64_t rows() const { return rows_; }
  int64_t first_step() const { return first_step_; }
  int64_t steps_done() const { return steps_done_; }
  int64_t saved_step() const { return saved_step_; }  // the checkpoint this process wrote last
  bool sharded() const { return options_.zero1 && ranks_.replicas() > 1; }  // ZeRO-1 in effect
  // Bytes of other ranks' trained tensors this process has taken since import (read from the
  // external-data file or received) and holds now, with the one write_trained's fetch brought
  // last: what gathering the model (for evaluation, for the outputs) would show.
  int64_t foreign_tensor_bytes() const;
  int64_t optimizer_state_bytes() const;  // held by this rank
  // --profile: kernel time per node since profiled_from() (-1: not profiled); PipelineExecutor::by_op
  // sums it per pass and op.
  std::vector<PipelineExecutor::NodeTime> node_profile() const { return executor_->node_profile(); }
  int64_t profiled_from() const { return profiled_from_; }

 private:
  using Clock = std::chrono::steady_clock;
  // The collectives across replicas a step's trace shows per rank: gradients summed, and ZeRO-1's
  // parameters taken from the other replicas.
  static constexpr int kCollectives = 2;
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

  void make_optimizers(const std::vector<int>& placement);
  void open_data();
  void make_evaluator(const std::vector<int>& placement);
  void evaluate(int64_t done, bool last, TrainObserver& observer);
  // write_trained on a rank other than 0: each tensor rank 0 asks for, until it says it is done.
  void serve_trained(const std::vector<std::string>& names, const std::map<std::string, const Tensor*>& tensors);
  int mailbox_of(int rank) const;  // the device of `rank` (of this replica) the outputs' messages go to
  void check_plan_across_processes() const;
  std::string where(const std::string& key) const;
  // One training step and its parts (step reads as the script of them).
  void step(int64_t s, TrainObserver& observer);
  StepFeeds draw_feeds(int64_t s);
  void reduce_gradients(StepClock* clock);
  // BatchNorm's running statistics across devices, processes and replicas (trainer_batch_norm.cc).
  void place_batch_norms(const std::vector<int>& placement);
  void update_batch_norm_statistics();
  void gather_batch_statistics();
  const std::vector<Tensor>& batch_statistics(int global_micro_batch) const;
  double gradient_norm();
  double summed_loss();
  double update_parameters(double norm, StepClock* clock);
  void record_step(int64_t s, Clock::time_point begin, const StepClock& clock, double norm, double lr,
                   TrainObserver& observer);
  void after_step(int64_t done, TrainObserver& observer);
  // Step s made a NaN or an Inf (loss or gradient norm): one line naming the step and where the
  // first non-finite value came from (the node, its chunk and stage, the micro-batch), found by
  // running this replica's micro-batches again on the CPU with every node's output watched.
  [[noreturn]] void stop_nonfinite(int64_t s, double norm, const std::vector<FeedMap>& feeds, int first);
  Tensor& mutable_initializer(const std::string& name);
  bool is_site_copy(const std::string& name) const;  // a copy split_parameter_sites made
  // Where every device of this process has a backend that updates parameters
  // (Optimizer::bind_device), with one replica and no parameter read on two devices or split into
  // site copies (those gradients are summed on the host): the gradients stay on the devices and
  // each device's optimizer steps there.
  void bind_device_updates(const std::vector<int>& placement);
  bool device_updates() const { return !device_grads_.empty(); }
  // Device updates: the host tensors of the parameters take the devices' copies (before anything
  // on the host reads them: evaluation, checkpoints, the trained model, the NaN hunt).
  void pull_parameters();
  int owner_of(const std::string& param) const;  // the rank whose device updates it (a tie's: its first reader's)
  bool holds(const std::string& param) const;     // this rank updates it: its owner, or a tie's mirror (train/ties.h)
  bool here(size_t device) const { return rank_of_[device] == ranks_.rank(); }
  // Across processes (train/trainer_ranks.cc): every device's action times from its rank; the
  // collectives' spans of every rank; step s added to the trace, each replica on its own tracks.
  std::vector<std::vector<ActionTime>> step_times() const;
  std::vector<TraceSpan> collective_spans(const std::vector<double>& spans) const;
  void trace_step(int64_t s, double at, const std::vector<std::vector<ActionTime>>& times,
                  const std::vector<TraceSpan>& collectives);

  TrainerOptions options_;
  const TrainRanks& ranks_;
  Graph model_;     // as imported: the eval graph
  Graph train_;     // training form; shares every initializer's data with model_
  TrainingForm form_;
  std::vector<ParameterSites> sites_;
  LossSpec loss_;
  int64_t rows_ = 1;
  Schedule schedule_, lowered_;
  std::vector<BackwardGraphs> chunks_;
  Costs planned_;
  std::vector<int> rank_of_;                   // per pipeline device
  std::vector<std::string> device_names_;      // the trace's device tracks: "device D (rank R)" across processes
  // Trained tensor -> the device that updates it: a parameter's first reader, a BatchNorm
  // buffer's the device whose chunk computes its batch statistics.
  std::map<std::string, int> first_device_;
  std::vector<std::string> side_;              // batch statistics, mean then var per BN
  std::vector<size_t> local_batch_norms_;      // the BNs (form_.batch_norms) this rank's devices compute
  // Data parallelism: every replica's batch statistics, [global micro-batch][side output] (the
  // others' BNs: zeros), and the bytes the replicas gather them through.
  std::vector<std::vector<Tensor>> replica_side_;
  std::vector<std::byte> replica_side_bytes_;
  TrainDevices devices_;                       // backends and comm: outlive the executor
  std::unique_ptr<PipelineExecutor> executor_;
  std::vector<std::unique_ptr<Optimizer>> optimizers_;   // per device (ZeRO-1: this replica's shard)
  std::vector<std::vector<OptimizerParam>> whole_;       // per device: every parameter it updates (then mirrors)
  std::vector<std::vector<OptimizerParam>> counted_;     // per device: whole_ less the mirrors: what the norm counts
  std::vector<TiedParameter> ties_;                      // parameters read on several ranks (train/ties.h)
  std::unique_ptr<TieExchange> tie_exchange_;            // their sites' gradients to every holder
  std::vector<std::vector<int>> shard_of_;               // per device and parameter: its ZeRO-1 replica
  std::vector<std::vector<const float*>> device_grads_;  // device updates: per device, whole_'s gradients there
  std::vector<std::string> params_;                      // trained, in first-chunk order
  std::unique_ptr<DataLoader> data_;
  bool targets_read_ = true;  // this process's chunks (or rank 0's NaN hunt) read the targets
  std::unique_ptr<Comm> host_comm_;  // between processes, beside the step's: evaluation and the outputs
  std::unique_ptr<Evaluator> eval_;
  const Tensor* fetched_ = nullptr;  // write_trained's last tensor brought from another rank
  int64_t first_step_ = 0, steps_done_ = 0;
  int64_t profiled_from_ = -1;
  ChromeTrace trace_;
  Clock::time_point t0_;
  std::vector<std::vector<std::vector<ActionTime>>> timed_;  // a few steps' times for the costs
  static constexpr size_t kTimedSteps = 8;                     // after the first, which warms up
  ActionClock spent_clock() const;
  std::vector<int64_t> peak_kept_;
  std::vector<int64_t> arena_;  // per device, gathered from the ranks at the first step
  std::vector<double> step_seconds_;  // every step after the first of this process
  double last_loss_ = 0;
  int64_t saved_step_ = -1;
};

}  // namespace pt
