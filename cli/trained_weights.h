// cli/trained_weights.h: the trained state_dict (onnx_import/state_dict.h) as a .safetensors
// file (exec/safetensors.h), the last output of `pipetrain train`; output.start_state, when
// given, is read here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "onnx_import/module_state.h"
#include "onnx_import/state_dict.h"

namespace pt {

struct WeightsWritten {
  int64_t tensors = 0;
  std::vector<std::string> missing;       // state_dict keys the file could not give
  std::vector<std::string> completed;     // start_state keys of which training changed only a part
  std::vector<std::string> not_in_start;  // trained tensors start_state does not name, written too
};

// Without a record: the errors write_trained_weights would meet in trained.start_state (a file
// that does not read, a key whose shape is not the trained tensor's nor a whole of its leading
// rows), met before training, on the tensors' start values.
void check_start_state(const TrainedState& trained);

WeightsWritten write_trained_weights(const std::string& model_path, const std::optional<ModuleState>& module,
                                     const TrainedState& trained, const std::map<std::string, std::string>& metadata,
                                     const std::string& out);

}  // namespace pt
