// train/reference_step.h: one training step's gradients the plain way. In: every chunk's F, B and
// W graphs (autodiff/chunk_backward.h) and a backend. Per micro-batch it runs F of every chunk in
// order, then B and W of every chunk in reverse, passing tensors by name; parameter gradients
// accumulate over micro-batches in order. The reference that scheduled runs are compared with.
//
// Cut across processes (ReferenceCut: the non-finite hunt of a run on several ranks), each process
// runs its own chunks in that same order and no other's; a tensor a chunk of another process
// makes comes on the Comm, and one this process makes goes to the processes that read it. So no
// process holds another's parameters, and the run is the one-process run's, bit for bit.
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
class Comm;

// Where each chunk runs, for a step cut across processes: chunk c on device device_of_chunk[c],
// of process rank_of_device[d]; this process is `rank`. Tensors between processes travel on
// `comm`, each under micro-batch 0 in the order made (Comm::plan: message_names()).
struct ReferenceCut {
  std::vector<int> device_of_chunk;
  std::vector<int> rank_of_device;
  int rank = 0;
  Comm* comm = nullptr;
};

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
  ReferenceStep(const std::vector<BackwardGraphs>& chunks, Backend& backend, bool watch = false,
                const ReferenceCut* cut = nullptr);
  ~ReferenceStep();
  // Every message a cut step sends, by name: the same in every process.
  static std::vector<std::string> message_names(const std::vector<BackwardGraphs>& chunks, const ReferenceCut& cut);

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
  // Its place in that order: micro-batch x (3 x chunks) + the pass's index in the micro-batch
  // (the forwards, then B and W per chunk in reverse); what makes the first of several
  // processes' finds the one a single process would have met.
  int64_t first_nonfinite_at() const { return found_at_; }

 private:
  struct Chunk;
  struct Pass;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // null: another process's
  std::vector<Pass> passes_;                    // one micro-batch's, in order
  static std::vector<Pass> plan_passes(const std::vector<BackwardGraphs>& chunks, const ReferenceCut* cut);
  Comm* comm_ = nullptr;
  int64_t micro_batches_ = 0;
  int64_t found_at_ = -1;
  std::map<std::string, Tensor> grads_;
  std::vector<int64_t> kept_bytes_;
  double loss_ = 0;
  bool watch_ = false;
  std::optional<NonFinite> found_;
  void check(const Graph& g, size_t chunk, const char* pass, const std::map<std::string, Tensor>& store, int64_t at);
};

}  // namespace pt
