// onnx_import/declared_inputs.h: a model's runtime inputs as its file declares them (before import binds
// any dim), for the commands that bind the batch from what the user gives (`run`) or say what
// import bound it to (`partition --export`).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pt {

// The graph inputs that are not initializers, in graph order. UserError naming the file when it
// cannot be read.
std::vector<onnx::ValueInfoProto> declared_inputs(const std::string& path);

// "x float32[batch,64]": symbolic dims by name ("?" when unnamed).
std::string declared_str(const onnx::ValueInfoProto& in);

// True when the input's first axis is symbolic and `dims` (the named dims given) does not bind
// it by name: the axis import binds to the batch (onnx_import/import.h).
bool batch_is_symbolic(const onnx::ValueInfoProto& in, const std::map<std::string, int64_t>& dims);
}  // namespace pt
