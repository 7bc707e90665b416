// onnx_import/random_rewrite.h: the uniform draws PyTorch exports for a Bernoulli mask, rewritten
// as the ONNX Bernoulli op, the one form the rest of pipetrain knows (autodiff/training_mode.h
// seeds it for training and takes its expected value for run and evaluation). In: the graph
// inside import's fold loop, with the types and constants known so far. Out: the same graph with
// each such chain replaced.
//
// torchvision's StochasticDepth (`noise.bernoulli_(survival)` on a [N, 1, ...] or [1, ...]
// tensor) exports, by both exporters and with or without the default exporter's optimizer, as
//   R = RandomUniformLike(T) {low, high}      T: any tensor, only its shape and dtype matter
//   B = Less(R, p)                            (or LessOrEqual, Greater, GreaterOrEqual, either
//                                              operand order) p a constant scalar
//   M = Cast(B) {to}  or  CastLike(B, ref)    a floating dtype
// which is rewritten as
//   M = Bernoulli(P) {dtype}                  P = float32 of T's shape filled with the chance q
//                                              that the comparison holds: for Less(R, p),
//                                              q = clamp((p - low) / (high - low), 0, 1)
// named after the RandomUniformLike node. A chain whose constants are not known yet is left for
// a later round of the loop.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <string>

#include "core/ir.h"

namespace pt {

// Rewrites each chain of g in place; returns how many. The probability tensors it adds join
// `constants` and `types`. p may also be a float initializer of the file (`path` names it in
// the errors of reading it).
int rewrite_uniform_draws(onnx::GraphProto* g, std::map<std::string, TensorType>* types,
                          std::map<std::string, Tensor>* constants, const std::string& path);

// After the loop: a UserError naming `path`, the node and the opset for a RandomUniformLike no
// chain above took.
void check_uniform_draws_rewritten(const onnx::GraphProto& g, const std::string& path,
                                   int64_t opset);

}  // namespace pt
