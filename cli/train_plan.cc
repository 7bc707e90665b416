#include "cli/train_plan.h"

#include <iostream>

#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "onnx_import/attention_fusion.h"
#include "onnx_import/import.h"
#include "plan/pipeline.h"

namespace pt {
namespace {

bool set_on_command_line(const TrainConfig& cfg, const std::string& key) {
  return cfg.where(key).rfind("--set ", 0) == 0;
}

// What plan/pipeline.h needs of the config: pipeline.plan: auto chooses the keys it would
// otherwise read.
PipelineRequest pipeline_request(const TrainConfig& cfg, const LossSpec& loss) {
  if (cfg.pipeline.plan == "auto")
    for (const char* key : {"pipeline.schedule", "pipeline.chunks", "pipeline.recompute", "pipeline.partition",
                            "pipeline.cut_after"})
      if (cfg.places.count(key))
        throw UserError(cfg.where(key), "is chosen by pipeline.plan: auto", "leave it out, or drop pipeline.plan");
  PipelineRequest r;
  r.config = cfg.pipeline;
  r.loss = loss;
  r.frozen = cfg.frozen;
  r.default_link = cfg.default_link();
  r.chunks_for_schedule = !set_on_command_line(cfg, "pipeline.schedule") || set_on_command_line(cfg, "pipeline.chunks");
  r.where = [&cfg](const std::string& key) { return cfg.where(key); };
  return r;
}

}  // namespace

TrainerPlan plan_training(const TrainConfig& cfg, bool quiet) {
  TrainerPlan t;
  ImportOptions io;
  for (const auto& [name, size] : cfg.dims) {
    if (name == "batch") io.batch = size;
    else io.dims[name] = size;
  }
  io.parameters = cfg.parameters;
  t.rows = io.batch;
  t.model = at_key(cfg, "model", [&] { return import_model(cfg.model, io); });
  t.loss.kind = LossSpec::parse_kind(cfg.loss.kind, cfg.where("loss.kind"));
  t.loss.output = cfg.loss.output;
  t.loss.ignore_index = cfg.loss.ignore_index;
  if (!t.loss.output.empty() && t.model.find(t.loss.output) == kNoValue)
    throw UserError(cfg.where("loss.output"), "the model has no output '" + t.loss.output + "'",
                    "name one of the model's outputs");
  t.train = t.model;
  t.form = at_key(cfg, "model", [&] { return to_training_mode(t.train, TrainingModeOptions{cfg.dropout}); });
  if (const int64_t from = cfg.attention_fused_from()) fuse_attention(t.train, from, cfg.attention_masks_fused());
  t.sites = split_parameter_sites(t.train, frozen_parameters(t.train, cfg.frozen));
  PipelinePlan p = plan_pipeline(t.train, pipeline_request(cfg, t.loss));
  if (!quiet)
    for (const std::string& line : p.notes) std::cout << line << "\n";
  t.schedule = std::move(p.schedule);
  t.lowered = std::move(p.lowered);
  t.chunks = std::move(p.chunks);
  t.planned = std::move(p.planned);
  return t;
}

OptimizerConfig optimizer_config(const TrainConfig& cfg, std::string* note) {
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
    *note = "optimizer: warm-up shortened from " + std::to_string(c.warmup_steps) + " to " + std::to_string(shortened) +
            " steps to fit steps: " + std::to_string(cfg.steps);
    c.warmup_steps = shortened;
  }
  c.min_lr = o.min_lr;
  at_key(cfg, "optimizer", [&] { validate(c); });
  return c;
}

TrainerOptions trainer_options(const TrainConfig& cfg, const TrainArgs& args, const OptimizerConfig& optimizer) {
  TrainerOptions o;
  o.model_file = cfg.model;
  o.steps = cfg.steps;
  o.eval_every = cfg.eval_every;
  o.seed = cfg.seed;
  o.threads = cfg.threads;
  o.device = {cfg.device, cfg.gpus, cfg.precision, cfg.threads, cfg.where("device")};
  o.optimizer = optimizer;
  o.optimizer_kind = cfg.optimizer.kind;
  o.data = cfg.data;
  o.data.seed = cfg.seed;
  o.data.where = [&cfg](const std::string& key) { return cfg.where(key); };
  o.data.path_rule = [&cfg](const std::string& key) { return cfg.path_rule(key); };
  o.where = o.data.where;
  o.zero1 = cfg.parallel.zero == 1;
  o.checkpoint_dir = cfg.checkpoint.dir;
  o.checkpoint_every = cfg.checkpoint.every;
  o.profile = args.profile;
  return o;
}

}  // namespace pt
