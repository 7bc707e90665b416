// tests/train/trainer_plan.h: the chain `pipetrain train` runs up to the Trainer (cli/train_plan.h),
// made from the library calls alone (import, training form, plan/pipeline.h), for the tests that
// build a Trainer themselves. Header-only.
#pragma once

#include <string>
#include <utility>

#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "onnx_import/import.h"
#include "plan/pipeline.h"
#include "train/trainer.h"

namespace pt::testing {

// `model` (a path from the source root) with micro-batches of `rows`, dropout on, nothing frozen.
inline TrainerPlan trainer_plan(const std::string& model, int64_t rows, const LossSpec& loss,
                                const PipelineConfig& pipeline) {
  TrainerPlan t;
  ImportOptions io;
  io.batch = rows;
  t.rows = rows;
  t.model = import_model(model, io);
  t.loss = loss;
  t.train = t.model;
  t.form = to_training_mode(t.train, TrainingModeOptions{true});
  t.sites = split_parameter_sites(t.train, {});
  PipelineRequest r;
  r.config = pipeline;
  r.loss = t.loss;
  r.where = [](const std::string& key) { return key; };
  PipelinePlan p = plan_pipeline(t.train, r);
  t.schedule = std::move(p.schedule);
  t.lowered = std::move(p.lowered);
  t.chunks = std::move(p.chunks);
  t.planned = std::move(p.planned);
  return t;
}

}  // namespace pt::testing
