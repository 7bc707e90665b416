// train/evaluator.h: the held-out evaluation of a training run. In: the model as imported (the
// graph whose initializers the training updates in place), the loss, and the loader's held-out
// micro-batches. Out: the mean loss over them and, for cross-entropy, the accuracy.
//
// It runs the model as evaluation does, compiled once on the CPU: BatchNorm on its running
// statistics (also where the file exported it in training mode), Dropout the identity
// (autodiff/training_mode.h), a file's Bernoulli the same draw at every evaluation. The
// running statistics are read where the training keeps them, the initializers the model shares
// with the training form (across processes: on rank 0, after Trainer::share_parameters).
#pragma once

#include <cstdint>

#include "autodiff/loss.h"
#include "core/ir.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/stage_program.h"
#include "train/data.h"

namespace pt {

struct EvalResult {
  double loss = 0;
  double accuracy = -1;  // < 0: not a classification loss
  int64_t samples = 0;
};

class Evaluator {
 public:
  Evaluator(const Graph& model, const LossSpec& loss, int threads);
  EvalResult run(const DataLoader& data);

 private:
  Graph graph_;
  CpuBackend backend_;
  StageProgram program_;
  LossSpec loss_;
  size_t output_ = 0;
};

}  // namespace pt
