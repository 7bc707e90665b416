// onnx_import/sequence_fold.h: the sequence ops an export without its optimizer writes
// (torch.onnx.export(..., dynamo=True, optimize=False) writes torch.split as SplitToSequence and
// one SequenceAt per part), folded into tensor ops once import knows the split input's shape and
// the positions: part of import's fold loop (onnx_import/import.cc), after dims are bound.
//   SplitToSequence(X, split, axis, keepdims) -> Split(X, sizes, axis); split a scalar s: parts of
//                                 s, the last smaller; 1-D: those sizes; omitted: parts of 1,
//                                 each Squeezed on axis when keepdims = 0
//   SequenceConstruct(X0, ..., Xn-1)          -> the parts X0 ... Xn-1
//   SequenceAt(S, p), p constant               -> part p itself (its readers read the part)
//   ConcatFromSequence(S, axis, new_axis)     -> Concat(parts, axis), each part Unsqueezed on
//                                 axis first when new_axis = 1
//   SequenceLength(S)                          -> an int64 scalar constant
// A sequence is folded whole (its producer and every reader) or not at all; what is left after
// the last round is refused by check_sequences_folded.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <string>

#include "core/ir.h"

namespace pt {

// Folds every sequence of g whose parts are known; returns how many. The int64 constants it adds
// (split sizes, squeeze axes, lengths) join `types` and `constants`. Split sizes that do not sum
// to the axis, or a position out of range, are a UserError naming `path` and the node.
int fold_sequences(onnx::GraphProto* g, std::map<std::string, TensorType>* types,
                   std::map<std::string, Tensor>* constants, const std::string& path, int64_t opset);

// A UserError naming the first sequence op left in g (its split sizes or positions are computed
// at run time, or a reader is not one of the above).
void check_sequences_folded(const onnx::GraphProto& g, const std::string& path, int64_t opset);

}  // namespace pt
