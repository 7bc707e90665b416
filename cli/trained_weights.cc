#include "cli/trained_weights.h"

#include "exec/safetensors.h"

namespace pt {
namespace {

// output.start_state's tensors, where it applies (a model file without a record), their bytes left
// in the file until each is asked for.
std::vector<std::pair<std::string, Tensor>> start_tensors(const std::optional<ModuleState>& module,
                                                          const TrainedState& trained) {
  if (module || trained.start_state.empty()) return {};
  return open_safetensors(trained.start_state);
}

}  // namespace

WeightsWritten write_trained_weights(const std::string& model_path, const std::optional<ModuleState>& module,
                                     const TrainedState& trained, const std::map<std::string, std::string>& metadata,
                                     const std::string& out) {
  const StateDict d = trained_state_dict(model_path, module, trained, start_tensors(module, trained));
  std::vector<StreamedTensor> tensors;
  for (const StateTensor& t : d.tensors) tensors.push_back({t.key, t.type, t.bytes});
  stream_safetensors(out, tensors, metadata, "choose another output.safetensors");
  return {static_cast<int64_t>(tensors.size()), d.missing, d.completed, d.not_in_start};
}

void check_start_state(const TrainedState& trained) {
  if (!trained.start_state.empty()) trained_state_dict("", std::nullopt, trained, start_tensors(std::nullopt, trained));
}

}  // namespace pt
