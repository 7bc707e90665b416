// tests/plan/weight_products.h: the closed form of what a model's weight gradients compute, for
// checking the W the cost model counts on the derived graphs. Header-only.
#pragma once

#include <cstdint>

#include "core/ir.h"

namespace pt::testing {

// Sum over every MatMul or Gemm whose second operand is a 2-D trainable parameter, read as it is
// or through a Transpose (a weight stored [out, in], as torch.nn.Linear keeps it), of the product
// its weight gradient takes: dW = X2^T @ dY2 over rows = numel(Y) / out, 2 * rows * in * out
// FLOPs. The embedding's scatter-add, biases, norms and the accumulation are left out.
inline int64_t weight_gradient_products(const Graph& g) {
  int64_t total = 0;
  for (const Node& n : g.nodes) {
    if ((n.op_type != "MatMul" && n.op_type != "Gemm") || n.inputs.size() < 2) continue;
    ValueId w = n.inputs[1];
    const int producer = g.value(w).producer;
    if (producer >= 0 && g.nodes[static_cast<size_t>(producer)].op_type == "Transpose")
      w = g.nodes[static_cast<size_t>(producer)].inputs[0];
    const Value& weight = g.value(w);
    if (!weight.is_parameter() || weight.type.shape.size() != 2) continue;
    const TensorType& y = g.value(n.outputs[0]).type;
    const int64_t out = y.shape.back();
    const int64_t rows = y.numel() / out;
    const int64_t in = weight.type.numel() / out;
    total += 2 * rows * in * out;
  }
  return total;
}

}  // namespace pt::testing
