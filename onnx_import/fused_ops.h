// onnx_import/fused_ops.h: the fused ops of opset 23 that torch.onnx.export writes when asked for
// opset 23 or later (RMSNormalization, Attention), rewritten by opset_adapt as opset-17 subgraphs
// of ops pipetrain runs and differentiates. In: one node and what the model states about its
// inputs. Out: the nodes that compute it (and the constants they read, added to the graph).
//   RMSNormalization(X, scale; axis, epsilon):  Y = X * Reciprocal(Sqrt(ReduceMean(X*X) + eps)) * scale
//   Attention(Q, K, V, mask?; scale, is_causal), 4-D (batch, heads, seq, head size):
//     Y = Softmax(Q @ K^T * scale + mask + causal) @ V, K and V repeated over head groups when they
//     have fewer heads than Q (grouped-query attention); a bool mask adds -inf where false.
// Refused in one line (node, op, opset): the 3-D Attention form, a KV cache (past/present inputs
// or outputs), softcap, the qk output; RotaryEmbedding (not yet decomposed).
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace pt {

struct FusedFacts {
  std::string where;  // "path: node 'n' (Op, opset N)" for errors
  // The shape a value info states (unknown dims -1), nullopt when none does.
  std::function<std::optional<std::vector<int64_t>>(const std::string&)> shape;
  // The element type a value info or initializer states; 0 when unknown.
  std::function<int(const std::string&)> dtype;
};

// True when n is a fused op this file rewrites; then `out` holds its replacement.
bool decompose_fused(const onnx::NodeProto& n, const FusedFacts& facts, onnx::GraphProto* g,
                     std::vector<onnx::NodeProto>* out);

}  // namespace pt
