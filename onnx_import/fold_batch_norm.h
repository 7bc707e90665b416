// onnx_import/fold_batch_norm.h: an inference graph with each BatchNormalization that follows a
// Conv folded into that Conv's weights and bias, as inference runtimes do. In: a graph that is run
// forward only (`pipetrain run`, forward_bench); out: the same graph with fewer nodes.
//
// A BatchNormalization in its inference form (one output; scale, B, mean and var float32
// constants) whose X is a Conv's output that nothing else reads (nor the caller: not a graph
// output), where the Conv's W and B (if any) are float32 constants, goes: with
// s = scale / sqrt(var + epsilon), the Conv takes W'[o] = W[o] * s[o] and
// B'[o] = (B[o] - mean[o]) * s[o] + beta[o] (computed in double, rounded once) as new
// constants, and writes the BatchNormalization's output itself. One pass fewer over the tensor,
// and the Conv's output can stay in a conv chain's layout (exec/channels_last.h), which the
// BatchNormalization between a ResNet's convs kept plain. The outputs differ from the unfolded
// graph's by rounding only. Training never folds: its BatchNormalization uses the batch's
// statistics and trains scale and B.
#pragma once

#include "core/ir.h"

namespace pt {

// Folds in place; returns how many BatchNormalizations went.
int fold_batch_norms(Graph& g);

}  // namespace pt
