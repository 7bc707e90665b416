// autodiff/loss.h: the training loss appended to the last chunk. In: the chunk Graph and the
// config's loss. Out: the same graph with inputs "target" and "loss_scale" and a scalar output
// "loss" first among its outputs.
//
// The mean is over the whole global batch: each micro-batch's loss is its sum times loss_scale,
// which the caller sets to 1 / (counted elements in the global batch), so the micro-batch losses
// add up to the global mean and their gradients need no further scaling.
//   cross_entropy  logits [..., C] (classes on the last axis), target int64 [...]; targets equal
//                  to ignore_index count neither in the sum nor in the global count
//   mse            prediction and target of one shape; sum of squared differences
//   model          the output already is the loss (a scalar, e.g. a mean over the micro-batch);
//                  loss = output * loss_scale (loss_scale = 1 / micro-batches gives the mean)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

struct LossSpec {
  enum class Kind { kCrossEntropy, kMse, kModel };
  Kind kind = Kind::kCrossEntropy;
  std::string output;          // the model output the loss reads; empty: the first output
  int64_t ignore_index = -100;

  // "cross_entropy", "mse", "model"; UserError naming `where` otherwise.
  static Kind parse_kind(const std::string& text, const std::string& where);
};

inline constexpr const char* kLossOutput = "loss";
inline constexpr const char* kLossTarget = "target";
inline constexpr const char* kLossScale = "loss_scale";

// Appends the loss; UserError naming the output when its type does not fit the kind.
void add_loss(Graph& g, const LossSpec& spec);

// The loss_scale input of every micro-batch of one global batch, given each micro-batch's
// target: 1 / counted target elements (cross_entropy: those not equal to ignore_index; mse:
// all), or 1 / micro-batches for `model`. UserError naming `where` when no target counts.
float loss_scale(const LossSpec& spec, const std::vector<const Tensor*>& targets,
                 const std::string& where);

}  // namespace pt
