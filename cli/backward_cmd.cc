// `pipetrain partition --backward` (per-stage F/B/W report and export) and `pipetrain grad` (one
// step's loss and parameter gradients, written as .npy).
#include <array>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include <nlohmann/json.hpp>

#include "autodiff/chunk_backward.h"
#include "autodiff/portable.h"
#include "autodiff/training_mode.h"
#include "cli/driver.h"

#include "cli/npy_files.h"
#include "core/bytes.h"
#include "core/error.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/npy.h"
#include "train/reference_step.h"
#include "onnx_import/attention_fusion.h"
#include "onnx_import/export.h"
#include "onnx_import/import.h"
#include "partition/cost_model.h"
#include "plan/backward_report.h"
#include "plan/pipeline.h"

namespace pt {

namespace {

LossSpec loss_spec(const BackwardArgs& a) {
  LossSpec loss;
  loss.kind = LossSpec::parse_kind(a.loss, "--loss");
  loss.output = a.loss_output;
  loss.ignore_index = a.ignore_index;
  return loss;
}

}  // namespace

ChunkBackwardOptions chunk_backward_options(const BackwardArgs& a, int devices, int chunks) {
  return backward_options(loss_spec(a), a.recompute, a.frozen, devices, chunks);
}

namespace {

// Rows [m*rows, (m+1)*rows) of t along axis 0.
Tensor slice_rows(const Tensor& t, int64_t m, int64_t rows) {
  Tensor out;
  out.type = t.type;
  out.type.shape[0] = rows;
  const size_t bytes = static_cast<size_t>(out.type.bytes());
  out.data.assign(t.data.begin() + static_cast<long>(static_cast<size_t>(m) * bytes),
                  t.data.begin() + static_cast<long>(static_cast<size_t>(m + 1) * bytes));
  return out;
}

}  // namespace

void report_backward(std::ostream& os, nlohmann::json* json, const Graph& g, const PartitionPlan& plan,
                     const PartitionArgs& a) {
  const std::vector<BackwardGraphs> chunks =
      build_chunk_backward(g, plan, chunk_backward_options(a.bwd, plan.devices, static_cast<int>(plan.chunks.size())));
  if (!a.export_dir.empty()) {
    std::vector<std::pair<std::string, Graph>> files;
    for (size_t k = 0; k < chunks.size(); ++k) {
      const std::string stem = "stage_" + std::to_string(k);
      std::array<std::pair<const char*, Graph>, 3> parts = {
          std::pair<const char*, Graph>{"_fwd", chunks[k].forward},
          {"_bwd_input", chunks[k].backward_input},
          {"_bwd_weight", chunks[k].backward_weight}};
      for (auto& [suffix, graph] : parts) {
        if (a.portable) lower_to_standard(graph);
        files.emplace_back(stem + suffix + ".onnx", std::move(graph));
      }
    }
    export_graphs(files, a.export_dir);
  }
  const std::vector<std::vector<BackwardGraphs>> runs = compared_runs(g, plan, loss_spec(a.bwd), a.bwd.frozen);
  if (json) (*json)["backward"] = backward_json(plan, chunks, runs, a.bwd.recompute);
  else print_backward(os, plan, chunks, runs, a.bwd.recompute);
}

int run_grad(const GradArgs& a) {
  if (a.threads < 1) throw UserError("--threads", "must be at least 1", "");
  if (a.micro_batches < 1) throw UserError("--micro-batches", "must be at least 1", "");
  std::map<std::string, Tensor> inputs = read_named_npy(a.inputs);
  if (inputs.empty()) throw UserError("--input", "no input given", "pass --input NAME=FILE.npy");
  const Tensor target = read_npy(a.target);
  const int64_t global = target.type.shape.empty() ? 1 : target.type.shape[0];
  if (global % a.micro_batches != 0)
    throw UserError("--micro-batches", std::to_string(a.micro_batches) + " does not divide the batch of " + std::to_string(global),
                    "choose a divisor of the batch size");
  const int64_t rows = global / a.micro_batches;
  for (const auto& [name, t] : inputs)
    if (t.type.shape.empty() || t.type.shape[0] != global)
      throw UserError("--input " + name, "has batch " + (t.type.shape.empty() ? std::string("none") : std::to_string(t.type.shape[0])) +
                                             " but the target has " + std::to_string(global),
                      "give inputs and target with the same first axis");
  ImportOptions io;
  io.batch = rows;
  io.dims = model_dims(a.model, a.dims);
  Graph g = import_model(a.model, io);
  // The form train differentiates: BatchNorm on the micro-batch's statistics, Dropout the
  // identity, a file's Bernoulli a seeded draw (autodiff/training_mode.h).
  const TrainingForm form = to_training_mode(g, TrainingModeOptions{false});
  fuse_attention(g, a.fuse_attention_from);  // a CPU program: attention as one kernel
  PartitionArgs pa;
  pa.stages = a.stages;
  pa.link.preset = "none";
  const PartitionPlan plan = plan_partition(g, estimate_costs(g), partition_options(pa, flag_name));
  const ChunkBackwardOptions co = chunk_backward_options(a.bwd, plan.devices, static_cast<int>(plan.chunks.size()));
  const std::vector<BackwardGraphs> chunks = build_chunk_backward(g, plan, co);

  CpuBackend backend(a.threads);
  ReferenceStep step(chunks, backend);
  std::vector<Tensor> targets;
  for (int m = 0; m < a.micro_batches; ++m) targets.push_back(slice_rows(target, m, rows));
  std::vector<const Tensor*> target_ptrs;
  for (const Tensor& t : targets) target_ptrs.push_back(&t);
  const float scale = loss_scale(*co.loss, target_ptrs, "--target");
  for (int m = 0; m < a.micro_batches; ++m) {
    std::map<std::string, Tensor> feeds;
    for (const auto& [name, t] : inputs) feeds[name] = slice_rows(t, m, rows);
    feeds[kLossTarget] = targets[static_cast<size_t>(m)];
    feeds[kLossScale] = scalar_tensor(scale);
    if (form.dropout_key) feeds[kDropoutKey] = scalar_tensor(dropout_key_for(0, 0, m));
    for (ValueId v : chunks.front().forward.inputs) {
      const Value& val = chunks.front().forward.value(v);
      if (val.name == kLossTarget || val.name == kLossScale) continue;  // checked below
      auto it = feeds.find(val.name);
      if (it == feeds.end())
        throw UserError(a.model + ": input '" + val.name + "'", "is not given",
                        "pass --input " + val.name + "=FILE.npy");
      if (!(it->second.type == val.type))
        throw UserError("--input " + val.name, "holds " + it->second.type.str() + " per micro-batch, but the model takes " + val.type.str(),
                        "give an array of that dtype and shape");
    }
    const Graph& last = chunks.back().forward;
    const ValueId t = last.find(kLossTarget);
    if (!(feeds[kLossTarget].type == last.value(t).type))
      throw UserError("--target", "holds " + feeds[kLossTarget].type.str() + " per micro-batch, but the loss takes " + last.value(t).type.str(),
                      "give class indices (int64) for cross_entropy, or floats shaped like the output for mse");
    step.run_micro_batch(feeds);
  }
  namespace fs = std::filesystem;
  fs::create_directories(a.output_dir);
  write_npy(scalar_tensor(static_cast<float>(step.loss())), (fs::path(a.output_dir) / "loss.npy").string());
  for (const auto& [name, t] : step.grads())
    write_npy(t, (fs::path(a.output_dir) / npy_file_name(name)).string());
  std::cout << "loss " << std::setprecision(8) << step.loss() << "\n";
  std::cout << step.grads().size() << " parameter gradients -> " << a.output_dir << "\n";
  for (size_t c = 0; c < chunks.size(); ++c)
    std::cout << "chunk " << c << " kept " << format_bytes(step.kept_bytes()[c]) << " per micro-batch ("
              << chunks[c].recomputed.size() << " nodes recomputed)\n";
  return 0;
}

}  // namespace pt
