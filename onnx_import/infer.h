// onnx_import/infer.h: pipetrain's own type and shape inference, one rule per op the backends run
// (the op table's kRun ops, in their opset-17 form: opset_adapt has rewritten newer forms), so
// that what import knows about a model does not depend on the onnx library's version. Fold-only
// ops need no rule: folding computes their outputs, types included. In: a node, its input types
// (nullptr: unknown or omitted) and the values of the inputs that are constant (nullptr where
// not). Out: one type per output (kUndefined for an omitted output). Checked against onnx 1.23's
// shape inference on every sample and fixture (tests/oracle/shapes_vs_onnx.py).
#pragma once

#include <optional>
#include <vector>

#include "core/ir.h"

namespace pt {

// No tensor holds more elements: 48-bit virtual addresses reach 2^48 bytes (256 TiB). Import
// refuses larger shapes (initializers, inputs, every inferred output), which keeps every size
// product in int64.
constexpr int64_t kMaxTensorElements = int64_t{1} << 48;

// nullopt when an input the rule needs is unknown (inference runs again after folding) or the op
// has no rule. UserError at `where` (the file, node, op and opset) when the inputs contradict the
// op (shapes that do not broadcast, an axis out of range, a reshape that does not fit).
std::optional<std::vector<TensorType>> infer_types(const Node& node,
                                                   const std::vector<const TensorType*>& types,
                                                   const std::vector<const Tensor*>& constants,
                                                   const std::string& where);

}  // namespace pt
