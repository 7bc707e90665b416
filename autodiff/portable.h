// autodiff/portable.h: the last pass before backward graphs leave pipetrain for another runtime
// (`pipetrain partition --backward --portable`). In: a Graph whose nodes may be of the
// "pipetrain" domain (core/pipetrain_ops.h). Out: the same graph computed by standard ONNX ops
// only (default-domain opset >= 17), so that onnxruntime can run it.
#pragma once

#include "core/ir.h"

namespace pt {

// Rewrites, in place and in topological order, every "pipetrain" node into standard ONNX nodes
// that produce the same output values (same names and types). New values, constants and nodes
// are named after the node they replace ("<node>/<stem>"). Afterwards the "pipetrain" opset
// import is gone (no such node is left), the default opset is at least 17 and the IR version at
// least 8. Throws UserError naming the node for an op or attribute outside the spec.
void lower_to_standard(Graph& g);

}  // namespace pt
