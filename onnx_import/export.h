// onnx_import/export.h: ir::Graph -> ModelProto -> file. The last link of import's mirror: stage
// subgraphs and trained models leave pipetrain through here.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/ir.h"
#include "core/tensor_fetch.h"
#include "onnx_import/module_params.h"

namespace pt {

// Every value gets its concrete type as value_info; initializers carry their data inline.
onnx::ModelProto to_model_proto(const Graph& g);

// Writes to `path` atomically (a temporary file renamed into place): a failed write leaves no
// half-written model. Throws UserError when the folder cannot be written.
void save_model(const onnx::ModelProto& m, const std::string& path);

// Writes each (file name, graph) into dir. Every model is built and checked by the onnx checker
// before the first file is written, and each file is written atomically. A folder that cannot be
// made is a UserError whose advice names `flag` (the option that gave the folder).
void export_graphs(const std::vector<std::pair<std::string, Graph>>& files, const std::string& dir,
                   const std::string& flag = "--export");

// The model file at `source`, unchanged but for the named initializers' data (a trained model:
// the same graph, new weights) and the module parameters import restored with the same
// `choices` (module_params.h: untied copies, restored biases and ties). A float32 weight of a float16/bfloat16 initializer is rounded to that dtype
// (core/half_floats.h), so the graph computes in its own precision as before; with `float32`
// (config output.dtype: fp32) the graph is written as import widened it (widen_halves.h) and
// every weight in float32. UserError naming the source when a name is not an initializer there
// or its type differs, before anything is written.
//
// Where the weights go: a source that keeps float initializers in external data gives a trained
// model that keeps the same ones there (integer ones come back inline), in `path`.data (their
// external data's location: that file's name, relative to the model), the bytes back to back in
// the model's initializer order; the others stay inline. A source that keeps none gives an
// inline model, unless that would pass 2 GiB: then every float initializer of 1 KiB or more goes
// to `path`.data. The data file is written first, then the model, each atomically; a failed model
// write removes the new data file.
//
// The file is streamed: each initializer's bytes are brought as the writer comes to it (a
// weight through `fetch`, by name; without one, the weight's own bytes; the file's other
// initializers from their external data), so no more than one is held besides the graph. The
// bytes (of an inline model) are those save_model writes for the whole model.
void save_model_with_weights(const std::string& source,
                             const std::map<std::string, const Tensor*>& weights,
                             const std::string& path, const ParameterChoices& choices = {},
                             bool float32 = false, const TensorFetch& fetch = {});

}  // namespace pt
