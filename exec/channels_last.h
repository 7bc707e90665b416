// exec/channels_last.h: which 4-D tensors of a program are stored channels-last. In: a graph;
// out: per value, true where the tensor lives in memory as (N, H, W, C) while its shape stays
// the logical (N, C, H, W).
//
// oneDNN's convolutions run fastest on channels-last data (its depthwise kernel takes nothing
// else without a reorder, and a 1x1 conv on it is one GEMM over N x H x W rows), and a chain of
// convs that hands such tensors from one to the next pays no reorder between them. A value is
// chosen when its producer is a Conv or a pointwise op of the chain, every reader is a Conv or a
// GlobalAveragePool (as its X) or a pointwise op of the chain, and it is neither a graph input
// nor a graph output (what callers see is always the plain layout). A pointwise op of the chain (Clip, Relu, Add
// ...) has every full-size input of its output's shape; its other inputs hold one element. Its
// output and full-size inputs are chosen together or not at all: an elementwise kernel reads
// them element by element in the same order, whatever the layout. A BatchNormalization joins as
// one too, its X and Y together (its kernel normalises either layout to the same bits), so a
// ResNet's conv, BatchNormalization, Relu and residual Add hand channels-last data on.
#pragma once

#include <vector>

#include "core/ir.h"

namespace pt {

std::vector<bool> channels_last_values(const Graph& g);

}  // namespace pt
