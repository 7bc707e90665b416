#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "exec/cpu/cpu_backend.h"
#include "train/checkpoint.h"
#include "train/reference_step.h"
#include "train/zero.h"

namespace pt {
namespace {

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

// The parameter a checkpoint key holds: model/<param>, optimizer/<param>.<state kind>.
std::string parameter_of(const std::string& key) {
  const size_t slash = key.find('/'), dot = key.rfind('.');
  return key.rfind("model/", 0) == 0 ? key.substr(slash + 1) : key.substr(slash + 1, dot - slash - 1);
}

}  // namespace

Trainer::Trainer(TrainerPlan plan, TrainerOptions options, const TrainRanks& ranks)
    : options_(std::move(options)),
      ranks_(ranks),
      model_(std::move(plan.model)),
      train_(std::move(plan.train)),
      form_(std::move(plan.form)),
      sites_(std::move(plan.sites)),
      loss_(std::move(plan.loss)),
      rows_(plan.rows),
      schedule_(std::move(plan.schedule)),
      lowered_(std::move(plan.lowered)),
      chunks_(std::move(plan.chunks)),
      planned_(std::move(plan.planned)) {
  for (const BatchNormStats& bn : form_.batch_norms) {
    side_.push_back(bn.batch_mean);
    side_.push_back(bn.batch_var);
  }
  rank_of_ = ranks_.rank_of_devices(schedule_.stages);
  if (!ranks_.alone())
    for (int d = 0; d < schedule_.stages; ++d)
      device_names_.push_back("device " + std::to_string(d) + " (rank " + std::to_string(rank_of_[static_cast<size_t>(d)]) + ")");
  devices_ = make_train_devices(options_.device, lowered_, rank_of_, ranks_);
  std::vector<int> placement;
  for (int c = 0; c < schedule_.total_chunks(); ++c) placement.push_back(schedule_.device_of(c));
  executor_ = std::make_unique<PipelineExecutor>(chunks_, placement, devices_.backends, *devices_.comm, lowered_, side_);
  check_plan_across_processes();
  ties_ = ties_across_ranks(sites_, chunks_, placement, rank_of_);
  tie_exchange_ = std::make_unique<TieExchange>(ties_, ranks_, executor_->grads());
  make_optimizers(placement);
  place_batch_norms(placement);
  bind_device_updates(placement);
  open_data();
  make_evaluator(placement);
  peak_kept_.assign(static_cast<size_t>(schedule_.stages), 0);
}

Trainer::~Trainer() = default;

std::string Trainer::where(const std::string& key) const { return options_.where ? options_.where(key) : key; }

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

// One optimizer per device over the parameters whose first reader lives there, then the tied
// parameters it mirrors (train/ties.h: read on its rank, first read on another). ZeRO-1: a
// device's parameters fall into shards (train/zero.h); this replica keeps and steps its own. The
// norm stays the whole device's (Optimizer::squared_norm over the full list: the same bits),
// without the mirrors (their owners count them).
void Trainer::make_optimizers(const std::vector<int>& placement) {
  std::vector<std::vector<OptimizerParam>> per_device(static_cast<size_t>(schedule_.stages));
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (const std::string& p : chunks_[c].params) {
      if (std::find(params_.begin(), params_.end(), p) != params_.end() || is_site_copy(p)) continue;
      params_.push_back(p);
      first_device_[p] = placement[c];
      // Across processes every rank has an optimizer per device, but only its own devices' hold
      // parameters and state (another rank's device: none, and nothing of its model is read).
      per_device[static_cast<size_t>(placement[c])].push_back({p, &mutable_initializer(p)});
    }
  counted_ = per_device;
  for (const TiedParameter& t : ties_)
    for (const auto& [rank, device] : t.mirror_device)
      per_device[static_cast<size_t>(device)].push_back({t.parameter, &mutable_initializer(t.parameter)});
  for (size_t d = 0; d < per_device.size(); ++d) {
    const std::vector<OptimizerParam>& list = per_device[d];
    std::vector<int> shard = zero_shards(list, ranks_.replicas());
    std::vector<OptimizerParam> mine;
    for (size_t i = 0; i < list.size(); ++i)
      if (here(d) && (!sharded() || shard[i] == ranks_.replica())) mine.push_back(list[i]);
    shard_of_.push_back(std::move(shard));
    whole_.push_back(list);
    optimizers_.push_back(std::make_unique<Optimizer>(options_.optimizer, std::move(mine)));
  }
}

// Across processes a rank reads the feeds its own chunks take: the inputs where it holds a first
// stage, the target where it holds the loss (its evaluation chunks and its part of the
// non-finite hunt read no more).
void Trainer::open_data() {
  DataOptions o = options_.data;
  const auto read_here = [&](const std::string& feed) {
    for (size_t c = 0; c < chunks_.size(); ++c) {
      const Graph& g = chunks_[c].forward;
      if (here(static_cast<size_t>(schedule_.device_of(static_cast<int>(c)))))
        for (ValueId v : g.inputs)
          if (g.value(v).name == feed) return true;
    }
    return false;
  };
  std::vector<FeedSpec> inputs;
  for (ValueId v : model_.inputs) {
    const Value& val = model_.value(v);
    inputs.push_back({val.name, val.type, is_floating(val.type.dtype) ? 0 : index_limit(model_, v), read_here(val.name)});
  }
  const Graph& last = chunks_.back().forward;
  FeedSpec target{kLossTarget, last.value(last.find(kLossTarget)).type, 0, read_here(kLossTarget)};
  if (loss_.kind == LossSpec::Kind::kCrossEntropy) {
    const ValueId out = loss_.output.empty() ? model_.outputs.front() : model_.find(loss_.output);
    target.limit = model_.value(out).type.shape.back();
  }
  targets_read_ = target.read;
  data_ = std::make_unique<DataLoader>(o, std::move(inputs), std::move(target));
  const int64_t global = rows_ * schedule_.micro_batches;
  if (data_->train_samples() < global)
    throw UserError(where("data"), "the training split holds " + std::to_string(data_->train_samples()) +
                                       " samples, fewer than one global batch (" + std::to_string(global) + ")",
                    "give more data, or lower dims.batch or pipeline.micro_batches");
}

int64_t Trainer::optimizer_state_bytes() const {
  int64_t held = 0;
  for (size_t d = 0; d < optimizers_.size(); ++d)
    if (here(d)) held += optimizers_[d]->state_bytes();
  return held;
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

int Trainer::run(TrainObserver& observer, const StopCheck& stop) {
  t0_ = Clock::now();
  steps_done_ = first_step_;
  if (stop.completed) stop.completed(first_step_);
  for (int64_t s = first_step_; s < options_.steps; ++s) {
    // The first step warms up (library heuristics, first touches); profile the rest.
    if (options_.profile && (s == first_step_ + 1 || options_.steps - first_step_ == 1) && profiled_from_ < 0) {
      executor_->profile_ops();
      profiled_from_ = s;
    }
    step(s, observer);
    steps_done_ = s + 1;
    // Across processes every rank stops at the same boundary: a signal seen by any of them
    // (the highest number, if several, gives the exit code).
    std::vector<int64_t> signal = {stop.signal ? stop.signal() : 0};
    ranks_.max(signal);
    if (stop.completed) stop.completed(s + 1);  // every rank took part in that reduction
    if (signal[0] > 0 && s + 1 < options_.steps) return static_cast<int>(signal[0]);
  }
  return 0;
}

// One step, as a script: the feeds, the pipeline step, the gradients over the replicas, the
// BatchNorm statistics, the norm and the loss, the update, the record, then evaluation and a
// checkpoint when due.
void Trainer::step(int64_t s, TrainObserver& observer) {
  const Clock::time_point begin = Clock::now();
  const StepFeeds in = draw_feeds(s);
  StepClock clock;  // the executor's action times count from here
  // The steps the summary keeps (record_step) also read each action's thread CPU time.
  executor_->time_cpu(spent_clock() == ActionClock::kThreadCpu && s > first_step_ && timed_.size() < kTimedSteps);
  executor_->run_step(in.feeds);
  reduce_gradients(&clock);
  update_batch_norm_statistics();
  const double norm = gradient_norm();
  last_loss_ = summed_loss();
  // A NaN or an Inf stops the run before the update: the parameters stay those of the last step.
  if (!std::isfinite(last_loss_) || !std::isfinite(norm)) stop_nonfinite(s, norm, in.feeds, in.first);
  const double lr = update_parameters(norm, &clock);
  record_step(s, begin, clock, norm, lr, observer);
  after_step(s + 1, observer);
}

// Data parallelism: every replica draws the global batch (D x M micro-batches, the loss scaled
// over all of it) and runs its own M; micro-batch m of replica k is global k * M + m.
Trainer::StepFeeds Trainer::draw_feeds(int64_t s) {
  const int M = schedule_.micro_batches, D = ranks_.replicas();
  StepFeeds in;
  in.first = ranks_.replica() * M;
  std::vector<FeedMap> all = data_->next(D * M);
  std::vector<const Tensor*> targets;
  for (const FeedMap& f : all) targets.push_back(&f.at(kLossTarget));
  // Read by the loss alone: a rank that holds no loss has zeros for targets and needs none.
  const float scale = targets_read_ ? loss_scale(loss_, targets, where("data")) : 1.0f;
  in.feeds.assign(std::make_move_iterator(all.begin() + in.first), std::make_move_iterator(all.begin() + in.first + M));
  for (int m = 0; m < M; ++m) {
    in.feeds[static_cast<size_t>(m)][kLossScale] = scalar_tensor(scale);
    if (form_.dropout_key)
      in.feeds[static_cast<size_t>(m)][kDropoutKey] = scalar_tensor(dropout_key_for(options_.seed, s, in.first + m));
  }
  return in;
}

// A tied parameter's sites to each of its holders (train/ties.h), then each parameter's gradient
// over the replicas, added in replica order: the same on every replica and from run to run
// (ZeRO-1: each replica sums its shard only); then each parameter's sites, in node order.
void Trainer::reduce_gradients(StepClock* clock) {
  clock->spans[0] = clock->since();
  tie_exchange_->run();
  if (sharded()) {
    for (size_t d = 0; d < whole_.size(); ++d)
      if (here(d)) reduce_scatter_gradients(whole_[d], shard_of_[d], sites_, executor_->grads(), ranks_);
  } else if (ranks_.replicas() > 1) {
    for (auto& [p, g] : executor_->grads()) ranks_.sum_in_replica_order(g.as<float>(), static_cast<size_t>(g.type.numel()));
  }
  clock->spans[1] = clock->since();
  sum_sites(sites_, executor_->grads());  // the copies' data is the parameter's: one update serves
}

// Each device's squared norm from its rank, summed: the same norm as in one process.
double Trainer::gradient_norm() {
  std::vector<double> squares;
  for (size_t d = 0; d < optimizers_.size(); ++d)
    squares.push_back(!here(d)           ? 0.0
                      : sharded()        ? sharded_squared_norm(counted_[d], shard_of_[d], executor_->grads(), ranks_)
                      : device_updates() ? optimizers_[d]->squared_norm(device_grads_[d])
                                         : Optimizer::squared_norm(counted_[d], executor_->grads()));
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
  if (sharded())
    for (size_t d = 0; d < whole_.size(); ++d)
      if (here(d)) gather_parameter_shards(whole_[d], shard_of_[d], ranks_);
  clock->spans[3] = clock->since();
  if (!device_updates()) devices_.refresh_constants();  // device copies of the parameters and BatchNorm buffers
  else
    for (const BatchNormStats& bn : form_.batch_norms)
      for (const std::string& buffer : {bn.running_mean, bn.running_var}) devices_.refresh_constant(mutable_initializer(buffer));
  return lr;
}

// The step's times, bubble and peak kept bytes: to the observer, the trace (the first steps; its
// gathers are collectives on every rank alike, so they stop with it) and the costs the summary
// measures.
void Trainer::record_step(int64_t s, Clock::time_point begin, const StepClock& clock, double norm, double lr,
                          TrainObserver& observer) {
  constexpr int64_t kTraceSteps = 100;  // the trace holds the first this many steps
  StepRecord r;
  r.step = s;
  r.loss = last_loss_;
  r.lr = lr;
  r.grad_norm = norm;
  r.seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  const std::vector<std::vector<ActionTime>> times = step_times();
  r.bubble = measured_step(lowered_, times).bubble;
  r.peak_kept_bytes = executor_->peak_kept_bytes();
  ranks_.max(r.peak_kept_bytes, Over::kReplica);
  r.samples_per_s = static_cast<double>(rows_ * schedule_.micro_batches * ranks_.replicas()) / r.seconds;
  if (s > first_step_) step_seconds_.push_back(r.seconds);
  if (s - first_step_ < kTraceSteps)
    trace_step(s, std::chrono::duration<double>(clock.run_begin - t0_).count(), times, collective_spans(clock.spans));
  if (s > first_step_ && timed_.size() < kTimedSteps) timed_.push_back(times);  // the first warms up
  for (size_t d = 0; d < peak_kept_.size(); ++d) peak_kept_[d] = std::max(peak_kept_[d], r.peak_kept_bytes[d]);
  if (arena_.empty()) {  // fixed before the first step: gathered once, with the first step's figures
    arena_ = executor_->arena_bytes();
    ranks_.max(arena_, Over::kReplica);
  }
  observer.step(r);
}

// After `done` steps: the held-out evaluation and a checkpoint, each when due (and after the last).
void Trainer::after_step(int64_t done, TrainObserver& observer) {
  const bool last = done == options_.steps;
  if (eval_ && (done % options_.eval_every == 0 || last)) evaluate(done, last, observer);
  if (!options_.checkpoint_dir.empty() && options_.checkpoint_every > 0 && (done % options_.checkpoint_every == 0 || last)) {
    save_checkpoint(done);
    observer.checkpointed(done);
  }
}

// Where the step's first NaN or Inf came from: replica 0's ranks run its micro-batches again on
// the CPU, each its own chunks (ReferenceStep cut as the pipeline is: no rank takes another's
// parameters), watching every node's output; the find first in one process's order is said, by
// the rank that met it (rank 0 when none did).
void Trainer::stop_nonfinite(int64_t s, double norm, const std::vector<FeedMap>& feeds, int first) {
  pull_parameters();  // the device copies, where the devices update them
  std::optional<NonFinite> found;
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  int64_t at = kNone;
  if (ranks_.replica() == 0) {
    CpuBackend cpu(options_.threads);
    const std::optional<ReferenceCut> cut = reference_cut();
    ReferenceStep watch(chunks_, cpu, true, cut ? &*cut : nullptr);
    for (size_t m = 0; m < feeds.size() && (cut || !watch.first_nonfinite()); ++m) watch.run_micro_batch(feeds[m]);
    if (const NonFinite* f = watch.first_nonfinite()) {
      found = *f;
      at = watch.first_nonfinite_at();
    }
    if (host_comm_) host_comm_->reset();
  }
  int64_t first_at = at;
  if (!ranks_.alone()) {
    std::vector<int64_t> lowest = {-at};  // the earliest find, over every rank
    ranks_.max(lowest);
    first_at = -lowest[0];
  }
  const bool says = first_at == kNone ? ranks_.rank() == 0 : found && at == first_at;
  if (says) {
    const auto text = [](double x) { return std::isnan(x) ? std::string("nan") : std::string(x > 0 ? "inf" : "-inf"); };
    std::string what = !std::isfinite(last_loss_) ? "the loss is " + text(last_loss_) : "the gradient norm is " + text(norm);
    if (found) {
      const auto m = static_cast<int>(at / (3 * static_cast<int64_t>(chunks_.size())));
      what += "; the first " + found->what + ": output '" + found->value + "' of node '" + found->node + "' (" + found->op +
              ") in the " + found->pass + " of chunk " + std::to_string(found->chunk) + " (stage " +
              std::to_string(schedule_.device_of(static_cast<int>(found->chunk))) + "), micro-batch " +
              std::to_string(first + m);
    } else {
      what += "; every node stays finite when this replica's micro-batches run again on the CPU";
    }
    throw UserError("step " + std::to_string(s + 1), what,
                    "the run stopped before updating the parameters; the last checkpoint is kept: lower optimizer.lr, "
                    "set optimizer.clip_grad_norm, or look at that node's inputs");
  }
  std::vector<double> wait = {0};
  ranks_.sum(wait);  // the rank that says it never joins: its error ends every rank
  std::abort();
}

// The pipeline's cut of the chunks over the processes, for a ReferenceStep; none alone.
std::optional<ReferenceCut> Trainer::reference_cut() {
  if (ranks_.alone()) return std::nullopt;
  ReferenceCut cut;
  for (size_t c = 0; c < chunks_.size(); ++c) cut.device_of_chunk.push_back(schedule_.device_of(static_cast<int>(c)));
  cut.rank_of_device = rank_of_;
  cut.rank = ranks_.rank();
  cut.comm = host_comm_.get();
  return cut;
}

void Trainer::save_checkpoint(int64_t steps_done) {
  pull_parameters();
  Checkpoint c;
  c.step = steps_done;
  c.data_position = data_->position();
  c.meta["model"] = options_.model_file;
  c.meta["model_file"] = std::filesystem::absolute(options_.model_file).lexically_normal().string();  // from any folder
  c.meta["global_batch"] = std::to_string(rows_ * schedule_.micro_batches * ranks_.replicas());
  c.meta["stages"] = std::to_string(schedule_.stages);
  c.meta["optimizer"] = options_.optimizer_kind;
  // Across processes each rank writes what it holds (train/checkpoint.h): its devices'
  // parameters and BatchNorm buffers (replica 0 alone: the replicas hold the same) and optimizer
  // state (every replica its shard under ZeRO-1, else replica 0 alone); then rank 0 names the parts.
  Checkpoint part;
  part.step = steps_done;
  Checkpoint& mine = ranks_.alone() ? c : part;
  const bool first_replica = ranks_.replica() == 0;
  for (const auto& [name, t] : trained_tensors())
    if (ranks_.alone() || (first_replica && (!first_device_.count(name) ? ranks_.rank() == 0 : owner_of(name) == ranks_.rank())))
      mine.borrowed.emplace_back("model/" + name, t);
  std::vector<double> steps(optimizers_.size(), 0.0);
  for (size_t d = 0; d < optimizers_.size(); ++d) {
    if (!here(d)) continue;
    const Optimizer& o = *optimizers_[d];
    if (first_replica) steps[d] = static_cast<double>(o.steps());
    if (!first_replica && !sharded()) continue;
    const auto mirror = [&](const std::string& key) { return owner_of(parameter_of(key)) != ranks_.rank(); };
    if (!o.on_device()) {
      for (const auto& [name, t] : o.host_state())  // a tie's mirror: its owner writes the state
        if (const std::string key = "optimizer/" + name; !mirror(key)) mine.borrowed.emplace_back(key, t);
      continue;
    }
    OptimizerState copied = o.state();  // from the device
    for (auto& [name, t] : copied.tensors)
      if (const std::string key = "optimizer/" + name; !mirror(key)) mine.tensors.emplace_back(key, std::move(t));
  }
  ranks_.sum(steps);
  for (size_t d = 0; d < steps.size(); ++d) c.meta["optimizer" + std::to_string(d) + ".step"] = std::to_string(static_cast<int64_t>(steps[d]));
  if (ranks_.alone()) {
    write_checkpoint(options_.checkpoint_dir, c);
  } else {
    // Every part is on disk before the file that names them: the sum waits for every rank.
    std::vector<int64_t> wrote(static_cast<size_t>(ranks_.size()), 0);
    if (!part.tensors.empty() || !part.borrowed.empty()) {
      write_checkpoint_part(options_.checkpoint_dir, part, ranks_.rank());
      wrote[static_cast<size_t>(ranks_.rank())] = 1;
    }
    ranks_.max(wrote);
    std::vector<std::string> parts;
    for (int r = 0; r < ranks_.size(); ++r)
      if (wrote[static_cast<size_t>(r)]) parts.push_back(checkpoint_part_name(steps_done, r));
    if (ranks_.rank() == 0) write_checkpoint(options_.checkpoint_dir, c, parts);
  }
  saved_step_ = steps_done;
}

std::optional<int64_t> Trainer::resume() {
  // Across processes a rank reads the bytes of the parameters it holds and their optimizer state only.
  const auto wanted = [this](const std::string& key) {
    const std::string p = parameter_of(key);
    return ranks_.alone() || !first_device_.count(p) || holds(p);
  };
  // Each wanted tensor is read straight into its home: a parameter this process holds, its
  // optimizer state (no second copy of the training state while resuming).
  std::map<std::string, Optimizer*> state_of;
  for (const auto& o : optimizers_)
    for (const std::string& name : o->state_names()) state_of["optimizer/" + name] = o.get();
  const std::map<std::string, const Tensor*> trained = trained_tensors();
  const auto place = [&](const std::string& key, const TensorType& type) -> std::byte* {
    if (auto it = state_of.find(key); it != state_of.end()) return it->second->state_place(key.substr(10), type);
    if (key.rfind("model/", 0) != 0 || !trained.count(key.substr(6))) return nullptr;
    Tensor& held = mutable_initializer(key.substr(6));
    if (!(held.type == type)) return nullptr;  // named below
    held.skip_load();  // the checkpoint's bytes, not the file's
    return held.data.data();
  };
  std::optional<Checkpoint> c = read_latest_checkpoint(options_.checkpoint_dir, wanted, place);
  if (!c) return std::nullopt;
  const std::string at_dir = where("checkpoint.dir");
  const std::string global = std::to_string(rows_ * schedule_.micro_batches * ranks_.replicas());
  const std::string& model = options_.model_file;
  // The same model file: the same path, or (a config with relative_to: config resumed from
  // another folder) the same absolute file.
  std::error_code ec;
  const bool same_model = c->meta.at("model") == model ||
                          (c->meta.count("model_file") && std::filesystem::equivalent(c->meta.at("model_file"), model, ec));
  if (!same_model || c->meta.at("global_batch") != global)
    throw UserError(at_dir, "the checkpoint was written for " + c->meta.at("model") + " with global batch " +
                                c->meta.at("global_batch") + ", this run trains " + model + " with " + global,
                    "resume with the config that wrote it, or choose another checkpoint.dir");
  // Keys older checkpoints lack are not checked; their optimizer count still names the stages.
  auto written = [&](const std::string& key) { return c->meta.count(key) ? c->meta.at(key) : std::string(); };
  int saved_stages = 0;
  while (c->meta.count("optimizer" + std::to_string(saved_stages) + ".step")) ++saved_stages;
  if (saved_stages != schedule_.stages)
    throw UserError(at_dir, "the checkpoint was written with pipeline.stages: " + std::to_string(saved_stages) +
                                ", this run has " + std::to_string(schedule_.stages),
                    "resume with --set pipeline.stages=" + std::to_string(saved_stages) +
                        ", or start over with --overwrite");
  if (!written("optimizer").empty() && written("optimizer") != options_.optimizer_kind)
    throw UserError(at_dir, "the checkpoint was written with optimizer.kind: " + written("optimizer") +
                                ", this run has " + options_.optimizer_kind,
                    "resume with --set optimizer.kind=" + written("optimizer") + ", or start over with --overwrite");
  for (const auto& [name, t] : trained_tensors()) {
    const Tensor* saved = c->find("model/" + name);
    if (!saved || !(saved->type == t->type))
      throw UserError(at_dir, "the checkpoint has no " + t->type.str() + " '" + name + "'",
                      "resume with the model and config that wrote it");
    // Another rank's parameter: that rank resumes it, and this one never reads it.
    if (!ranks_.alone() && first_device_.count(name) && !holds(name)) continue;
    PT_CHECK(saved->data.empty() || saved->type.bytes() == 0, "'" + name + "' was not read in place");
  }
  for (size_t d = 0; d < optimizers_.size(); ++d) {
    OptimizerState st;
    auto it = c->meta.find("optimizer" + std::to_string(d) + ".step");
    if (it == c->meta.end())
      throw UserError(at_dir, "the checkpoint has no optimizer state for device " + std::to_string(d),
                      "resume with the pipeline.stages that wrote it");
    st.step = std::stoll(it->second);
    bool in_place = true;
    for (const std::string& name : optimizers_[d]->state_names()) {
      Tensor* saved = c->find("optimizer/" + name);
      if (!saved) throw UserError(at_dir, "the checkpoint has no optimizer state '" + name + "'", "resume with the optimizer that wrote it");
      in_place = in_place && saved->data.empty();
      st.tensors.emplace_back(name, std::move(*saved));
    }
    // Read in place; else (another type than this optimizer's) load_state names what differs.
    located(at_dir, [&] { in_place ? optimizers_[d]->loaded_in_place(st.step) : optimizers_[d]->load_state(std::move(st)); });
  }
  data_->seek(c->data_position);
  first_step_ = steps_done_ = c->step;
  if (first_step_ < options_.steps) devices_.refresh_constants();
  return c->step;
}

ActionClock Trainer::spent_clock() const {
  return options_.device.kind == "cpu" && options_.device.threads == 1 ? ActionClock::kThreadCpu : ActionClock::kWall;
}

TrainSummary Trainer::finish() {
  if (timed_.empty()) timed_.push_back(step_times());
  TrainSummary t;
  t.costs = measured_costs(planned_, lowered_, timed_);
  t.spent_clock = spent_clock();
  t.spent = measured_costs(planned_, lowered_, timed_, t.spent_clock);
  t.predicted = simulate(lowered_, t.costs);
  t.measured = measured_step(lowered_, timed_.back());
  for (const auto& times : timed_) {
    const Simulation m = measured_step(lowered_, times);
    t.bubble += m.bubble / static_cast<double>(timed_.size());
    t.makespan += m.makespan / static_cast<double>(timed_.size());
  }
  t.planned_peak = peak_memory(lowered_, planned_);
  t.peak_kept = peak_kept_;
  t.arena = arena_;
  std::vector<double> sorted = step_seconds_;
  std::sort(sorted.begin(), sorted.end());
  t.step_s_median = sorted.empty() ? 0 : sorted[sorted.size() / 2];
  return t;
}

}  // namespace pt
