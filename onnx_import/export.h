// onnx_import/export.h: ir::Graph -> ModelProto -> file. The last link of import's mirror: stage
// subgraphs and trained models leave pipetrain through here.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

#include "core/ir.h"

namespace pt {

// Every value gets its concrete type as value_info; initializers carry their data inline.
onnx::ModelProto to_model_proto(const Graph& g);

// Writes to `path` atomically (a temporary file renamed into place): a failed write leaves no
// half-written model. Throws UserError when the folder cannot be written.
void save_model(const onnx::ModelProto& m, const std::string& path);

}  // namespace pt
