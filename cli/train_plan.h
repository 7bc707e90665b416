// cli/train_plan.h: `pipetrain train`'s chain up to the Trainer, spelt out as a script:
//
//   config -> import (dims.batch = micro-batch rows) -> training form (BatchNorm on batch
//   statistics, seeded Dropout; parameter sites split, frozen ones left out) -> the pipeline
//   (plan/pipeline.h: the schedule, made once from the config, then the partition at its
//   chunks and placement, F/B/W per chunk with loss, recompute and frozen parameters, their
//   costs).
//
// Out: a TrainerPlan, and the options the Trainer runs under. Errors are UserErrors naming the
// config key and its YAML line.
#pragma once

#include "cli/args.h"
#include "cli/config.h"
#include "train/trainer.h"

namespace pt {

// Runs f; a UserError from it is raised again naming the config key (and its YAML line) first.
template <class F>
auto at_key(const TrainConfig& cfg, const std::string& key, F&& f) -> decltype(f()) {
  return located(cfg.where(key), std::forward<F>(f));
}

// Prints a line for each choice it makes that the config did not spell out (plan: auto's plan,
// a --set schedule that takes other chunks), unless quiet.
TrainerPlan plan_training(const TrainConfig& cfg, bool quiet);

// The optimizer as the config sets it; a run shorter than its cosine warm-up keeps a tenth of
// its steps for warm-up, and `note` says so.
OptimizerConfig optimizer_config(const TrainConfig& cfg, std::string* note);

TrainerOptions trainer_options(const TrainConfig& cfg, const TrainArgs& args, const OptimizerConfig& optimizer);

}  // namespace pt
