// onnx_import/load.h: a model file -> a checked ModelProto: every tensor's data inline, or, for
// import, float initializers' external data left in the file (each range checked against it).
// First link of the import: nothing here looks at shapes.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/ir.h"
#include "onnx_import/module_params.h"

namespace pt {

constexpr int64_t kMinOpset = 13;
constexpr int64_t kMaxOpset = 28;
// The form every later link reads: opset 18+ models are adapted to it (onnx_import/opset_adapt.h).
constexpr int64_t kCanonicalOpset = 17;

// What read_model does with external data: reads it all into the proto (kInline), or leaves
// float initializers' bytes in the file (kLeaveFloats; their external data then names the file
// by absolute path) and reads the rest.
enum class ExternalData { kInline, kLeaveFloats };

// Reads and parses `path` and places external data as `how` says; no other check. Throws
// UserError naming the file (and the tensor) when it is missing, not a model, or its external
// data is missing or short: an offset or length past the file's end fails here, before any
// tensor is read.
onnx::ModelProto read_model(const std::string& path, ExternalData how = ExternalData::kInline);

// Reads into raw_data the bytes of a tensor read_model left in its file (kLeaveFloats), as kInline
// would have (widened where widen_halves.h marked it); nothing for any other tensor.
void inline_placed(onnx::TensorProto* t);

// Every node whose op is outside the op table, as "node 'name' (Op)"; empty when all are in.
std::vector<std::string> unsupported_ops(const onnx::ModelProto& m);

// read_model (float initializers' external data left in the file), then runs the onnx
// checker, checks the opset range and that every op is in the op table. Throws UserError naming
// the file (and node, op, opset where one is at fault).
// The model comes back adapted to kCanonicalOpset; *source_opset, when given, receives the
// file's own default opset. With `choices`, the module's parameters are restored first
// (module_params.h, on the file as written) and *restored receives the report. With
// `given_inputs` (ImportOptions::given_inputs), an integer input read only as a shape argument
// becomes an initializer holding the given value.
onnx::ModelProto load_model(const std::string& path, int64_t* source_opset = nullptr,
                            const ParameterChoices* choices = nullptr, ModuleParameters* restored = nullptr,
                            const std::map<std::string, Tensor>* given_inputs = nullptr);

// Every value name a node reads or the graph outputs: what keeps an initializer alive.
std::set<std::string> names_read(const onnx::GraphProto& g);

// "path: node 'name' (Op, opset N)": where a node's error is.
std::string node_where(const std::string& path, const onnx::NodeProto& n, int64_t opset);

// The opset of the default domain; 0 when the model imports none.
int64_t default_opset(const onnx::ModelProto& m);

}  // namespace pt
