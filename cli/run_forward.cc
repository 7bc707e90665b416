// `pipetrain run`: forward inference on the CPU backend, every graph output written as .npy.
#include <filesystem>
#include <iostream>
#include <map>

#include "autodiff/training_mode.h"
#include "cli/driver.h"
#include "cli/npy_files.h"
#include "core/error.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/npy.h"
#include "exec/stage_program.h"
#include "onnx_import/import.h"

namespace pt {
namespace {

// The batch dimension is bound to the first axis of the inputs given.
int64_t batch_of(const std::map<std::string, Tensor>& inputs) {
  for (const auto& [name, t] : inputs)
    if (!t.type.shape.empty()) return t.type.shape[0];
  return 1;
}

}  // namespace

int run_forward(const RunArgs& a) {
  if (a.threads < 1) throw UserError("--threads", "must be at least 1", "");
  std::map<std::string, Tensor> inputs = read_named_npy(a.inputs);
  ImportOptions options;
  options.batch = batch_of(inputs);
  options.dims = parse_dims(a.dims);
  Graph g = import_model(a.model, options);
  dropout_as_identity(g);  // run is inference: Dropout is the identity, as in PyTorch's eval()

  std::vector<Buffer> feeds;
  for (ValueId v : g.inputs) {
    const Value& val = g.value(v);
    auto it = inputs.find(val.name);
    if (it == inputs.end())
      throw UserError(a.model + ": input '" + val.name + "'", "is not given",
                      "pass --input " + val.name + "=FILE.npy holding " + val.type.str());
    if (!(it->second.type == val.type))
      throw UserError("--input " + val.name, "holds " + it->second.type.str() +
                                                 " but the model takes " + val.type.str(),
                      "give an array of that dtype and shape (the batch axis may differ)");
    feeds.push_back({it->second.data.data(), &val.type});
  }
  for (const auto& [name, t] : inputs) {
    bool known = false;
    for (ValueId v : g.inputs) known = known || g.value(v).name == name;
    if (!known) throw UserError("--input " + name, "the model has no such input", "check the name with `pipetrain inspect`");
  }

  CpuBackend backend(a.threads);
  StageProgram program(g, backend);
  program.run(feeds);

  std::filesystem::create_directories(a.output_dir);
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    const Buffer out = program.output(k);
    Tensor t;
    t.type = *out.type;
    t.data.assign(static_cast<const std::byte*>(out.data),
                  static_cast<const std::byte*>(out.data) + out.type->bytes());
    const std::string path = (std::filesystem::path(a.output_dir) / npy_file_name(g.value(g.outputs[k]).name)).string();
    write_npy(t, path);
    std::cout << g.value(g.outputs[k]).name << " " << t.type.str() << " -> " << path << "\n";
  }
  std::cout << "arena " << program.planned_peak_bytes() << " bytes planned\n";
  return 0;
}

}  // namespace pt
