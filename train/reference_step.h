// train/reference_step.h: one training step's gradients the plain way. In: every chunk's F, B and
// W graphs (autodiff/chunk_backward.h) and a backend. Per micro-batch it runs F of every chunk in
// order, then B and W of every chunk in reverse, passing tensors by name; parameter gradients
// accumulate over micro-batches in order. The reference that scheduled runs are compared with.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autodiff/backward.h"
#include "core/ir.h"
#include "exec/backend.h"

namespace pt {

class StageProgram;

// Where a value first stopped being finite (ReferenceStep's watch): the node that made it.
struct NonFinite {
  size_t chunk = 0;
  std::string pass;   // "forward", "input gradient" (B) or "weight gradient" (W)
  std::string node, op, value;
  std::string what;   // "nan" or "inf"
};

class ReferenceStep {
 public:
  // watch: every node's float outputs are kept and checked as they are made (a slower run, for
  // finding where a NaN or an Inf first appears: first_nonfinite()).
  ReferenceStep(const std::vector<BackwardGraphs>& chunks, Backend& backend, bool watch = false);
  ~ReferenceStep();

  // feeds: every model input, plus "target" and "loss_scale", of one micro-batch.
  void run_micro_batch(const std::map<std::string, Tensor>& feeds);
  // Sum of the micro-batch losses so far (the global mean when loss_scale is set as loss.h says).
  double loss() const { return loss_; }
  // Accumulated gradient per parameter name ("grad.<p>" values, keyed by p).
  const std::map<std::string, Tensor>& grads() const { return grads_; }
  // Bytes F kept per chunk in the last micro-batch (what the recompute policy promises).
  const std::vector<int64_t>& kept_bytes() const { return kept_bytes_; }
  // With watch: the first non-finite node output since construction, in the order the step
  // makes them (chunk by chunk forward, then backward); nullptr while every one is finite.
  const NonFinite* first_nonfinite() const { return found_ ? &*found_ : nullptr; }

 private:
  struct Chunk;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::map<std::string, Tensor> grads_;
  std::vector<int64_t> kept_bytes_;
  double loss_ = 0;
  bool watch_ = false;
  std::optional<NonFinite> found_;
  void check(const Graph& g, size_t chunk, const char* pass, const std::map<std::string, Tensor>& store);
};

}  // namespace pt
