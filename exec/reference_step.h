// exec/reference_step.h: one training step's gradients the plain way. In: every chunk's F, B and
// W graphs (autodiff/chunk_backward.h) and a backend. Per micro-batch it runs F of every chunk in
// order, then B and W of every chunk in reverse, passing tensors by name; parameter gradients
// accumulate over micro-batches in order. The reference that scheduled runs are compared with.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autodiff/backward.h"
#include "core/ir.h"
#include "exec/backend.h"

namespace pt {

class StageProgram;

class ReferenceStep {
 public:
  ReferenceStep(const std::vector<BackwardGraphs>& chunks, Backend& backend);
  ~ReferenceStep();

  // feeds: every model input, plus "target" and "loss_scale", of one micro-batch.
  void run_micro_batch(const std::map<std::string, Tensor>& feeds);
  // Sum of the micro-batch losses so far (the global mean when loss_scale is set as loss.h says).
  double loss() const { return loss_; }
  // Accumulated gradient per parameter name ("grad.<p>" values, keyed by p).
  const std::map<std::string, Tensor>& grads() const { return grads_; }
  // Bytes F kept per chunk in the last micro-batch (what the recompute policy promises).
  const std::vector<int64_t>& kept_bytes() const { return kept_bytes_; }

 private:
  struct Chunk;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::map<std::string, Tensor> grads_;
  std::vector<int64_t> kept_bytes_;
  double loss_ = 0;
};

}  // namespace pt
