// `pipetrain run`: forward inference on the CPU backend, every graph output written as .npy.
// The batch is bound from the inputs in the graph's order (batch_of); --input names are checked
// against the model's inputs before anything is imported.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>

#include "autodiff/training_mode.h"
#include "cli/driver.h"

#include "cli/npy_files.h"
#include "core/error.h"
#include "exec/cpu/cpu_backend.h"
#include "onnx_import/attention_fusion.h"
#include "onnx_import/fold_batch_norm.h"
#include "exec/npy.h"
#include "exec/stage_program.h"
#include "onnx_import/import.h"
#include "partition/linear_partition.h"  // format_bytes

namespace pt {
namespace {

// Every --input names an input of the model; otherwise one line listing the model's inputs.
void check_input_names(const std::map<std::string, Tensor>& given, const std::vector<onnx::ValueInfoProto>& declared) {
  for (const auto& [name, t] : given) {
    bool known = false;
    std::string all;
    for (const auto& in : declared) {
      known = known || in.name() == name;
      all += (all.empty() ? "" : ", ") + declared_str(in);
    }
    if (!known)
      throw UserError("--input " + name, "the model has no input of that name (its inputs: " + all + ")",
                      "name one of them");
  }
}

// The batch (the symbolic first axis, import.h) is the first axis of the first input, in the
// graph's order, whose first axis is symbolic and not bound by --dim; 1 when none is (a model
// with only static shapes).
int64_t batch_of(const std::map<std::string, Tensor>& given, const std::vector<onnx::ValueInfoProto>& declared,
                 const std::map<std::string, int64_t>& dims) {
  for (const auto& in : declared) {
    if (!batch_is_symbolic(in, dims)) continue;
    auto it = given.find(in.name());
    if (it == given.end() || it->second.type.shape.empty()) continue;
    const int64_t rows = it->second.type.shape[0];
    if (rows < 1)
      throw UserError("--input " + in.name(), "holds " + it->second.type.str() + ": its first axis binds the batch and has 0 rows",
                      "give at least one row");
    return rows;
  }
  return 1;
}

// The most elements an input read as a shape argument has (a shape, axes, pads: a few dozen).
constexpr int64_t kMaxShapeArgument = 1024;

}  // namespace

int run_forward(const RunArgs& a) {
  if (a.threads < 1) throw UserError("--threads", "must be at least 1", "");
  std::map<std::string, Tensor> inputs = read_named_npy(a.inputs);
  const std::vector<onnx::ValueInfoProto> declared = declared_inputs(a.model);
  check_input_names(inputs, declared);
  ImportOptions options;
  options.dims = parse_dims(a.dims);
  check_dims_named(options.dims, declared);
  options.batch = batch_of(inputs, declared, options.dims);
  for (const auto& [name, t] : inputs)  // shape arguments given as inputs are read now (import.h)
    if (t.type.numel() <= kMaxShapeArgument) options.given_inputs[name] = t;
  Graph g = import_model(a.model, options);
  dropout_as_identity(g);  // run is inference: Dropout is the identity, as in PyTorch's eval()
  fuse_attention(g, a.fuse_attention_from);  // a CPU program: attention as one kernel
  fold_batch_norms(g);     // and BatchNormalization after a Conv is that Conv's scale and shift

  std::vector<Buffer> feeds;
  // A Bernoulli draw of the file takes a key: the same draws on every run.
  if (g.find(kDropoutKey) != kNoValue) inputs[kDropoutKey] = scalar_tensor(dropout_key_for(0, 0, 0));
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
  CpuBackend backend(a.threads);
  StageProgram program(g, backend, ProgramUse::kInference);
  std::vector<double> times;  // seconds per forward pass, the program compiled before the first
  for (int r = 0; r < a.repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    program.run(feeds);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());

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
  std::cout << "arena " << format_bytes(program.planned_peak_bytes()) << " planned\n";
  std::cout << "forward " << std::fixed << std::setprecision(3) << times[times.size() / 2] * 1e3 << " ms"
            << (a.repeats > 1 ? " (median of " + std::to_string(a.repeats) + " runs)" : "") << "\n";
  return 0;
}

}  // namespace pt
