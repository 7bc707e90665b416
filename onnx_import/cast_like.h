// onnx_import/cast_like.h: CastLike(X, like) -> Cast(X, to = like's dtype), once import's
// inference knows like's dtype: part of import's fold loop (onnx_import/import.cc). Exports
// without their optimizer (torch.onnx.export(..., optimize=False)) cast every scalar constant
// like the tensor it meets (`CastLike(Constant 0.25, scores)`); the Cast then folds when X is a
// constant and runs as a Cast otherwise, so the value `like` computes is no longer read here.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <string>

#include "core/ir.h"

namespace pt {

// Rewrites each CastLike of g whose second input's type is in `types`; returns how many.
int cast_like_to_cast(onnx::GraphProto* g, const std::map<std::string, TensorType>& types);

}  // namespace pt
