// autodiff/training_mode.h: an imported model -> the form it trains in. In: a Graph as imported
// (models are usually exported in eval mode). Out: the same graph with its BatchNormalization
// and Dropout nodes in training form, and what the driver must do around each micro-batch.
//
//   BatchNormalization (any training_mode)
//       -> pipetrain::BatchNormTraining(X, Scale, B) -> (Y, batch_mean, batch_var)
//          (core/pipetrain_ops.h): Y from the micro-batch's own statistics. batch_mean and
//          batch_var (unbiased) become graph outputs "<node>.batch_mean" and "<node>.batch_var",
//          appended after the model's outputs (so the first output stays the model's own).
//          The running mean and variance initializers are read by no node any more; they stay
//          in g.initializers marked constant, so they are no trainable parameter (no gradient, no
//          optimizer state, not in parameter_count); the driver keeps them as buffers.
//   Dropout, options.dropout on and ratio > 0
//       -> pipetrain::SeededDropout(X, dropout_key) -> (Y, mask?), attributes ratio and stream
//          (a 64-bit hash of the node name): the mask is a pure function of (key, stream,
//          element), so recompute and every schedule reproduce it. "dropout_key" (int64 scalar)
//          is added once as a graph input.
//   Dropout otherwise
//       -> inference Dropout (the identity): ratio and training_mode inputs dropped.
//   Bernoulli(P) the file holds (Graph::file_draws), in every form, and the stochastic-depth
//   mask (onnx_import/random_rewrite.h) with options.dropout on
//       -> pipetrain::SeededBernoulli(P, dropout_key) -> Y, attribute stream as for Dropout:
//          the same pure function of (key, stream, element). float32 only.
//   the stochastic-depth mask otherwise
//       -> its expected value: Cast(P) to its dtype (Identity when P has it already), so that
//          a branch x * mask / p is x exactly, as PyTorch's eval() computes it.
// Node names and every other value stay as they were.
//
// What the driver does per micro-batch m of step s:
//   feed   dropout_key = dropout_key_for(seed, s, m) when TrainingForm::dropout_key
//   after  F of the chunk that makes them, for every BatchNormStats in order:
//          update_running_statistics(running_mean, running_var, batch_mean, batch_var, momentum)
//          (micro-batches in order, so every schedule ends with the same buffers), and the eval
//          graph (the model as imported) reads the running buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

inline constexpr const char* kDropoutKey = "dropout_key";

struct TrainingModeOptions {
  bool dropout = false;  // training-mode dropout; off: every Dropout is the identity and every
                         // Bernoulli draw its expected value (stochastic depth the identity)
};

// One BatchNormalization turned into BatchNormTraining.
struct BatchNormStats {
  std::string node;          // the node's name (unchanged)
  std::string running_mean;  // initializer names: buffers the eval graph reads
  std::string running_var;
  std::string batch_mean;    // graph outputs of the training form, float32 [C]
  std::string batch_var;     // unbiased
  float momentum = 0.9f;     // ONNX's: running = running * momentum + batch * (1 - momentum)
};

struct TrainingForm {
  std::vector<BatchNormStats> batch_norms;  // in node order
  bool dropout_key = false;                 // kDropoutKey was added as a graph input
  int dropouts = 0;                         // SeededDropout nodes made
  int draws = 0;                            // SeededBernoulli nodes made
};

// Rewrites g in place (see above) and calls rebuild_uses(). UserError naming the node for a
// BatchNormalization whose running statistics are not initializers, whose running-statistics
// outputs something reads, or that sees fewer than two values per channel; for a Dropout whose
// ratio or training_mode is not a constant or whose ratio is outside [0, 1); for a training
// Bernoulli draw that is not float32; and when the names it adds are taken.
TrainingForm to_training_mode(Graph& g, const TrainingModeOptions& options);

// The inference form of g, as PyTorch's eval() runs the module: every Dropout the identity, whatever
// its training_mode says (an export made in training mode writes training_mode true), every
// stochastic-depth mask its expected value, and every Bernoulli the file holds a seeded draw (the
// graph then takes kDropoutKey, as in training). For `run` and evaluation. UserError as
// to_training_mode for a ratio or training_mode that is not constant, or a draw not float32.
void dropout_as_identity(Graph& g);

// The key of micro-batch `micro_batch` of step `step`: a hash of the three, the same on every
// device and for every schedule.
int64_t dropout_key_for(uint64_t seed, int64_t step, int64_t micro_batch);

// running = running * momentum + batch * (1 - momentum), element-wise over float32 [C] tensors.
void update_running_statistics(Tensor& running_mean, Tensor& running_var, const Tensor& batch_mean,
                               const Tensor& batch_var, float momentum);

// The stream attribute of a SeededDropout made from the node `node_name`: FNV-1a 64 of the name.
int64_t dropout_stream(const std::string& node_name);

}  // namespace pt
