// autodiff/backward.h: a chunk's forward graph -> the three graphs a pipeline runs per
// micro-batch. In: a chunk Graph (partition/cut.h), with the loss appended on the last chunk
// (autodiff/loss.h). Out: F, B and W graphs and the names of the tensors passed between them.
//
//   F  inputs: the chunk's inputs.  outputs: the chunk's outputs, then the kept tensors.
//   B  inputs: "grad.<y>" per chunk output y that carries a gradient (none on the last chunk: its
//      loss is seeded with 1), then the kept tensors B reads.  outputs: "grad.<x>" per chunk
//      input x that wants a gradient, then the tensors passed to W. Recomputed forward nodes run
//      inside B just before the first backward node that reads them.
//   W  inputs: the passed tensors, the kept tensors W reads, then "grad_acc.<p>" per parameter.
//      outputs: "grad.<p>" = grad_acc.<p> + this micro-batch's gradient, per parameter p.
// B never reads anything W makes. Backward nodes whose results feed only parameter gradients are
// W's; the rest (everything an input gradient depends on) are B's.
#pragma once

#include <string>
#include <vector>

#include "autodiff/recompute.h"
#include "core/ir.h"

namespace pt {

struct BackwardOptions {
  std::vector<std::string> grad_inputs;  // chunk inputs whose gradient B returns
  std::string loss_output;               // seeded with 1; empty: every differentiable output
                                         // gets a "grad.<name>" input
  RecomputePolicy recompute;
  std::vector<std::string> frozen;       // parameters that get no gradient
};

struct BackwardGraphs {
  Graph forward, backward_input, backward_weight;
  std::vector<std::string> kept;             // F -> B and W, in F's output order
  std::vector<std::string> kept_for_weight;  // the part of `kept` W reads
  std::vector<std::string> passed;           // B -> W
  std::vector<std::string> output_grads;     // B's gradient inputs (names: see next_grad_name)
  std::vector<std::string> output_grad_of;   // the chunk output each output_grads entry is for
  std::vector<std::string> input_grads;      // B's gradient outputs
  std::vector<std::string> params;           // parameters with a gradient, W's order
  std::vector<std::string> recomputed;       // names of the forward nodes B re-runs
  int64_t kept_bytes = 0;                    // per micro-batch, F -> B/W
  int64_t passed_bytes = 0;                  // per micro-batch, B -> W
  int64_t recompute_flops = 0;               // forward FLOPs of `recomputed`, run inside B
};

BackwardGraphs build_backward(const Graph& chunk, const BackwardOptions& options);

// "grad.<name>" and "grad_acc.<name>": the names every stage and the executor agree on.
std::string grad_name(const std::string& value);
std::string grad_acc_name(const std::string& param);
// "grad.<name>@next": B's input for the gradient of a tensor that the chunk both reads and passes
// on to later chunks (a residual, a mask). The next chunk returns it as grad.<name>; this chunk's
// own grad.<name> output adds what its nodes contribute. Every other output gradient comes in as
// grad.<name>.
std::string next_grad_name(const std::string& value);

// Whether W computes its output `out` (grad.<param>) as `grad_acc.<param> + g`, the accumulator
// read by that Add alone: then a kernel working in place can write the sum over the accumulator
// itself (train/executor.h places it there, plan/memory.h gives it no room in W's arena).
bool adds_into_accumulator(const Graph& w, ValueId out, const std::string& param);

}  // namespace pt
