// onnx_import/fused_ops.h: the fused ops of opset 23 that torch.onnx.export writes when asked for
// opset 23 or later (RMSNormalization, Attention), rewritten by opset_adapt as opset-17 subgraphs
// of ops pipetrain runs and differentiates. In: one node and what the model states about its
// inputs. Out: the nodes that compute it (and the constants they read, added to the graph).
//   RMSNormalization(X, scale; axis, epsilon):  Y = X * Reciprocal(Sqrt(ReduceMean(X*X) + eps)) * scale
//   Attention(Q, K, V, mask?, past_key?, past_value?; scale, is_causal, softcap, windows,
//     qk_matmul_output_mode), 4-D (batch, heads, seq, head size) or 3-D (batch, seq, hidden):
//     Y = Softmax(softcap(Q @ K^T * scale) + mask + causal + window) @ V as ONNX's reference
//     computes it (fused_ops.cc says how): K and V concatenated after the cache and repeated
//     over head groups, a bool mask -inf where false, a row with no key to attend all zeros.
// Refused in one line (node, op, opset): Attention's nonpad_kv_seqlen (input 6), masks of other
// dtypes than bool and float32, the raw-product output (mode 0) with softcap.
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
