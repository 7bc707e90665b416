// onnx_import/gelu_fusion.h: GELU as exporters write it in element-wise nodes, made one Gelu node
// again, as onnxruntime's optimizer does: Gelu's own kernel makes one pass over the tensor
// instead of five or eight, autodiff gives one GeluGrad instead of their gradients, and training
// keeps x alone (the tanh form's eight nodes kept x, Tanh's output and both operands of the last
// Mul).
//   y = Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)   ->   y = Gelu(x), approximate "none"
// (torch.onnx.export of nn.GELU at opset 17: five nodes), and
//   y = Mul(Mul(x, 0.5), Add(Tanh(Mul(Add(x, Mul(Pow(x, 3), 0.044715)), sqrt(2 / pi))), 1))
//                                                    ->   y = Gelu(x), approximate "tanh"
// (transformers' gelu_new, GPT-2's, through the default exporter: eight nodes); either operand
// order of the Adds and Muls. Only where each tensor between the nodes is read by the next alone
// and is no graph output, and the constants are float scalars within float rounding of the
// ones above. The Gelu computes the same function, to within float rounding of the nodes.
#pragma once

#include "core/ir.h"

namespace pt {

// Rewrites each such pattern of g in place (the constants it no longer reads leave its
// initializers); returns how many.
int fuse_gelu(Graph& g);

}  // namespace pt
