// onnx_import/fold.h: evaluates one node on constant inputs, for the shape-computing subgraphs
// exporters emit (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Range, ConstantOfShape,
// Expand, Where over constants, ...). Import folds such nodes into initializers until every
// tensor has a concrete shape.
#pragma once

#include <optional>
#include <vector>

#include "core/ir.h"

namespace pt {

// The largest tensor folding builds (an output, or a table of element offsets): a bigger constant
// stays a node, so that a shape of 2^45 elements costs no memory at import.
constexpr int64_t kMaxFoldBytes = 64ll << 20;

// inputs[i] is the constant value of node.inputs[i] (nullptr for an omitted optional input).
// Returns one Tensor per node output, or nullopt where the op, an attribute or a dtype is outside
// what folding handles, or where a tensor it would build passes kMaxFoldBytes: the node then
// stays in the graph for the backend to run. Throws
// UserError (naming the node) on inputs that break the op's contract (an index out of range,
// shapes that do not broadcast).
std::optional<std::vector<Tensor>> evaluate_constant(const Node& node,
                                                     const std::vector<const Tensor*>& inputs,
                                                     int64_t opset);

}  // namespace pt
