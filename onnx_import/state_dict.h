// onnx_import/state_dict.h: a training run's parameters and buffers -> the module's state_dict,
// which cli/trained_weights.h writes as a .safetensors file, the last output of `pipetrain train`.
//
// In: the model file and its record of the module (onnx_import/module_state.h; written by
// samples/export_model.py), the tensors training changed by initializer name, the
// training-mode forwards each BatchNorm ran, and the module's state_dict at the start where one
// is given. Out: the state_dict's tensors in order, and the keys it lacks.
//
// With a record, each state_dict entry is written under its key, in state_dict order: from the
// trained tensor of its initializer, else from the file's initializer (a frozen parameter, a
// buffer), transposed back where the file stores it transposed; an integer or bool buffer from
// its recorded start, plus the forwards for BatchNorm's num_batches_tracked (PyTorch adds one
// per training-mode forward). A key with none of these is reported missing. Without a record
// (any other exporter) the trained tensors are written under their initializer names, which the
// default exporter makes the state_dict keys, or under the module parameter import found for
// them (a weight the default exporter's optimizer stored transposed as val_N, transposed back).
//
// A file without a record may lack state_dict entries the module has (a tied twin's key, rows of
// a position table the export never gathered, buffers). Given the module's state_dict at the
// start (`output.start_state`, a .safetensors file), the output has exactly its keys, in its
// order: each from the trained tensor of that name (or of its module parameter), a tensor of
// which the file holds only the leading elements (a table's first rows) as the start with those
// elements trained, a tied twin (its start equal to a trained key's, bit for bit, and not one
// value throughout) as that key's trained tensor, anything else as it started. Trained tensors
// the start does not name are written too and reported.
//
// A model whose weights the file holds in float16 or bfloat16 trained in float32: its tensors
// are written in the file's dtypes, or all in float32 (TrainedState::float32).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/ir.h"
#include "core/tensor_fetch.h"
#include "onnx_import/module_state.h"

namespace pt {

struct TrainedState {
  // By initializer: parameters, running statistics. Their types; their bytes too unless `fetch`
  // is set (across processes, rank 0 holds its own alone: fetch brings the others').
  std::map<std::string, const Tensor*> tensors;
  TensorFetch fetch;
  std::set<std::string> counted;  // running_mean initializers of BatchNorms run in training mode
  int64_t forwards = 0;           // training-mode forwards each of those ran
  // Without a record: the module parameter an initializer holds where import found its name
  // (onnx_import/module_params.h: a weight stored transposed under a generated name).
  std::map<std::string, ModuleName> module_names;
  std::string start_state;  // without a record: the module's state_dict at the start, or ""
  // The float16/bfloat16 dtype in the file of each initializer import widened
  // (Graph::file_dtypes): its trained tensor is written rounded to it (core/half_floats.h). With
  // float32 (config output.dtype: fp32) every tensor is written in float32 instead: the trained
  // ones as they are, the file's, the record's and start_state's half ones widened.
  std::map<std::string, DType> file_dtypes;
  bool float32 = false;
};

// One state_dict entry: its key and type, and its bytes made when the writer comes to them (a
// trained tensor fetched, transposed back or completed; a file's initializer read), valid until
// the next entry's are asked for: the writer holds one at a time.
struct StateTensor {
  std::string key;
  TensorType type;
  std::function<const Tensor&()> bytes;
};

struct StateDict {
  std::vector<StateTensor> tensors;  // in state_dict order
  std::deque<Tensor> owned;  // made here: integer buffers, the start state
  std::vector<std::string> missing;       // state_dict keys the file could not give
  std::vector<std::string> completed;     // start_state keys of which training changed only a part
  std::vector<std::string> not_in_start;  // trained tensors start_state does not name, written too
};

// start: the tensors of trained.start_state as its file holds them, in order (opened by the
// caller: open_safetensors leaves their bytes in the file); used only without a record. UserError
// naming the file or the key where they do not fit.
StateDict trained_state_dict(const std::string& model_path, const std::optional<ModuleState>& module,
                             const TrainedState& trained, std::vector<std::pair<std::string, Tensor>> start);

}  // namespace pt
