// onnx_import/gelu_fusion.h: GELU as the exporters below opset 20 write it (torch.onnx.export of
// nn.GELU at opset 17: five element-wise nodes), made one Gelu node again, as onnxruntime's
// optimizer does: Gelu's own kernel makes one pass over the tensor instead of five, and autodiff
// gives one GeluGrad instead of the five nodes' gradients.
//   y = Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)   ->   y = Gelu(x), approximate "none"
// (either operand order of the Adds and Muls). Only where each tensor between the five is read
// by the next alone and is no graph output, and the constants are float scalars within float
// rounding of sqrt 2, 1 and 0.5. The Gelu computes 0.5 x (1 + erf(x / sqrt 2)), the same
// function, to within float rounding of the five.
#pragma once

#include "core/ir.h"

namespace pt {

// Rewrites each such pattern of g in place (the constants it no longer reads leave its
// initializers); returns how many.
int fuse_gelu(Graph& g);

}  // namespace pt
