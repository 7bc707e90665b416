// train/evaluator.h: the held-out evaluation of a training run. In: the model as imported (the
// graph whose initializers the training updates in place), the loss, the loader's held-out
// micro-batches, and where the pipeline cuts the model: each chunk's forward graph (its inputs
// and outputs by name), its device, and whether this process runs that device. Out: the mean
// loss over the held-out batches and, for cross-entropy, the accuracy, on the process that runs
// the last chunk.
//
// It runs the model as evaluation does, compiled once on the CPU: BatchNorm on its running
// statistics (also where the file exported it in training mode), Dropout the identity
// (autodiff/training_mode.h), a file's Bernoulli the same draw at every evaluation.
//
// A forward-only pipeline over the training's chunks: eval chunk c is the part of the model that
// makes what eval chunk c + 1 reads (the last: the loss's input) from what training chunk c
// receives, so it reads the parameters and BatchNorm buffers of training chunk c alone, on the
// process that holds them. Each process runs its own chunks one held-out batch after another,
// chunk after chunk, taking a chunk's inputs from the feeds, from the chunk before on this process,
// or from the Comm, and sending its outputs on where the next chunk is another process's
// (the messages message_names() lists, each batch's in order). No process reads another's
// parameters. The programs are training programs (exec/stage_program.h: where a tensor is
// computed never changes a bit), so the loss has the bits of the whole model in one program, and
// it is summed in one process's order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autodiff/loss.h"
#include "core/ir.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/stage_program.h"
#include "train/comm.h"
#include "train/data.h"

namespace pt {

struct EvalResult {
  double loss = 0;
  double accuracy = -1;  // < 0: not a classification loss
  int64_t samples = 0;
};

// Where the pipeline cuts the model: chunk c takes the values named forwards[c]->inputs (the
// training form's chunk graph) and runs on device placement[c], this process's where local[d].
struct EvalCut {
  std::vector<const Graph*> forwards;
  std::vector<int> placement;
  std::vector<bool> local;
};

class Evaluator {
 public:
  // The whole model, on this process.
  Evaluator(const Graph& model, const LossSpec& loss, int threads);
  // Cut as `cut` says; `comm` carries what crosses between processes (unused where every chunk is
  // this process's), each message once per held-out batch under micro-batch 0, so it must hand a
  // message's repeats over in the order sent (MpiComm does: MPI never reorders two messages of one
  // tag between two ranks). The programs are compiled at the first run().
  Evaluator(const Graph& model, const LossSpec& loss, const EvalCut& cut, Comm* comm, int threads);
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // The held-out batches through the chunks. The result where this process runs the last chunk
  // (reports()); zeros elsewhere.
  EvalResult run(const DataLoader& data);
  bool reports() const;
  // What crosses between processes, by message name (Comm::plan), one message each per batch.
  std::vector<std::string> message_names() const;

 private:
  struct Chunk;
  void compile();
  void run_chunk(size_t c, const FeedMap& feeds);

  LossSpec loss_;
  CpuBackend backend_;
  Comm* comm_ = nullptr;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  size_t output_ = 0;  // the loss's input among the last chunk's outputs
};

}  // namespace pt
