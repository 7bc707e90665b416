// onnx_import/gather_rewrite.h: GatherElements and GatherND whose indices are constant once the
// dims are bound and folding is done (the position ids and masks today's exporters build) but
// whose data is computed at run time, rewritten as a Gather over the data viewed flat: the form
// every backend runs and autodiff differentiates (GatherGrad adds dY back at the same offsets).
//   GatherElements(D, I, axis) = Gather(Reshape(D, [numel]), J),           J[o] = offset of D's
//                                element that element o of I picks
//   GatherND(D, I, batch_dims b) = Reshape(Gather(Reshape(D, [rows, slice]), J, axis 0), out)
//                                with rows = prod(D.shape[:b+k]), slice = prod(D.shape[b+k:]),
//                                J = the row of each index tuple, out = I.shape[:-1] + D.shape[b+k:]
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <string>

#include "core/ir.h"

namespace pt {

// Rewrites each such node of g in place; returns how many. The int64 constants it adds (offsets,
// shapes) join `constants` and `types`. Index values out of range are a UserError naming `path`
// and the node.
int rewrite_constant_gathers(onnx::GraphProto* g, std::map<std::string, TensorType>* types,
                             std::map<std::string, Tensor>* constants, const std::string& path);

}  // namespace pt
