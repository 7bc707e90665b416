// onnx_import/module_state.h: what a model file records of the module it was exported from (the
// pipetrain.* metadata_props that samples/export_model.py writes). In: the file's ModelProto.
// Out: the module's state_dict entries in order, each with where its value lives in the file;
// cli/trained_weights.h turns them into the trained state_dict.
//
//   pipetrain.format        "1"
//   pipetrain.state_dict    [{"key": str, "dtype": "float32" | "int64" | ..., "shape": [int]}]
//   pipetrain.initializers  {initializer: [{"key": str, "transposed": bool}]}: the keys each
//                           initializer holds (several for a tied parameter); transposed: a 2-D
//                           entry stored as its transpose
//   pipetrain.int_buffers   {key: {"start": [int], "counts_forwards_of": key?}}: an integer or
//                           bool entry's values at export; counts_forwards_of names the
//                           running_mean of the BatchNorm whose training-mode forwards it counts
//                           (num_batches_tracked)
#pragma once

#include <onnx/onnx_pb.h>

#include <optional>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

struct StateEntry {
  std::string key;
  TensorType type;               // as the module holds it
  std::string initializer;       // empty: the file holds no initializer with this entry
  bool transposed = false;       // the initializer is the 2-D transpose of the entry
  bool has_start = false;        // an integer or bool buffer recorded by value
  std::vector<int64_t> start;    // its values, row-major
  std::string counts_forwards_of;  // key of a BatchNorm's running_mean; empty: a constant
};

struct ModuleState {
  std::vector<StateEntry> entries;  // state_dict order
};

// nullopt when the file records no module (no pipetrain.state_dict). UserError naming the file
// and the metadata key when the record is malformed or does not match the file's initializers
// (a name that is no initializer, a shape or dtype that differs), with what to do.
std::optional<ModuleState> read_module_state(const onnx::ModelProto& m, const std::string& path);

// The same from the model file; external data is not read.
std::optional<ModuleState> read_module_state(const std::string& path);

}  // namespace pt
