// onnx_import/load.h: a model file -> a checked ModelProto with every tensor's data inline.
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

// Reads and parses `path` and inlines external data; no other check. Throws UserError naming the
// file when it is missing, not a model, or its external data is missing or short.
onnx::ModelProto read_model(const std::string& path);

// Every node whose op is outside the op table, as "node 'name' (Op)"; empty when all are in.
std::vector<std::string> unsupported_ops(const onnx::ModelProto& m);

// read_model, then (paths relative to the model's folder), runs the onnx
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
