// cli/plan_cmd.cc: `pipetrain plan`. The model as `train` would train it -> every plan the
// planner tries (plan/planner.h) -> the best, the runner-ups and why each lost, and with --write
// a train config that runs the plan as is.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "cli/args.h"
#include "cli/config.h"
#include "cli/driver.h"
#include "plan/pipeline.h"
#include "plan/plan_report.h"
#include "plan/planner.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/files.h"
#include "onnx_import/attention_fusion.h"
#include "onnx_import/import.h"

namespace pt {

void add_plan_options(CLI::App* c, PlanArgs* a) {
  c->add_option("model", a->model.model, "ONNX model file")->required();
  c->add_option("--devices,-n", a->devices, "pipeline devices")->required()->check(CLI::PositiveNumber);
  c->add_option("--memory", a->memory, "per device: parameters with their AdamW state plus kept activations, e.g. 8GiB")
      ->required();
  c->add_option("--micro-batch,-b", a->model.micro_batch, "rows of a micro-batch (binds the batch dimension)")
      ->check(CLI::PositiveNumber);
  c->add_option("--global-batch,-g", a->global_batch,
                "rows of a step (default: 2 x devices micro-batches); a multiple of --micro-batch")
      ->check(CLI::PositiveNumber);
  c->add_option("--dim", a->model.dims, "binds a named symbolic dimension: NAME=VALUE (repeatable)");
  c->add_option("--loss", a->loss, "cross_entropy | mse | model");
  c->add_option("--loss-output", a->loss_output, "model output the loss reads (default: first)");
  c->add_option("--frozen", a->frozen, "parameters (names or globs) that get no gradient")->delimiter(',');
  add_link_args(c, &a->link);
  add_fuse_attention_option(c, &a->model.fuse_attention_from);
  c->add_option("--write", a->write, "write the plan as a train config (YAML) that `pipetrain train` runs as is");
  c->add_flag("--json", a->json, "print one JSON object");
}

namespace {

std::string yaml_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

// How a config in `folder` names `path` under relative_to: config: from the folder, or
// absolute where the two share no folder below the root (a plan in /tmp of a model in /work).
std::string from_folder(const std::filesystem::path& folder, const std::string& path) {
  const std::filesystem::path to = std::filesystem::absolute(path).lexically_normal();
  const std::filesystem::path from = std::filesystem::absolute(folder.empty() ? "." : folder).lexically_normal();
  const auto below_root = [](const std::filesystem::path& p) {
    auto it = p.begin();
    return it != p.end() && ++it != p.end() ? *it : std::filesystem::path();
  };
  const std::filesystem::path rel = to.lexically_relative(from);
  if (rel.empty() || below_root(to) != below_root(from)) return to.string();
  return rel.string();
}

// A train config running the plan: the model, its dims, the pipeline keys (an `auto` schedule as
// a CSV written beside it), the link, the loss and frozen parameters the plan assumed, and the
// trained model beside it (FILE_trained.onnx). Its paths are from its own folder
// (relative_to: config), so that `train` runs it from any folder.
void write_plan(const PlanArgs& a, const PlanRequest& r, const PlanSearch& s) {
  const PlanCandidate& b = s.best();
  const std::filesystem::path folder = std::filesystem::path(a.write).parent_path();
  std::string schedule = b.kind;
  if (b.kind == "auto") {
    std::filesystem::path csv = a.write;
    csv.replace_extension(".schedule.csv");
    schedule = from_folder(folder, csv.string());
    write_file_atomic(csv.string(), format_csv(b.schedule), "choose another --write");
  }
  std::ostringstream y;
  y << "# pipetrain plan " << a.model.model << " --devices " << r.devices << " --memory " << a.memory << ": "
    << b.name() << "; simulated step " << format_ms(b.step_s) << ", largest device " << format_bytes(b.largest_memory())
    << "\n";
  y << "relative_to: config             # the paths below are from this file's folder\n";
  y << "model: " << yaml_quote(from_folder(folder, a.model.model)) << "\n";
  y << "dims: {batch: " << a.model.micro_batch;
  for (const auto& [name, value] : parse_dims(a.model.dims)) y << ", " << name << ": " << value;
  y << "}\n";
  y << "loss: {kind: " << a.loss << (a.loss_output.empty() ? "" : ", output: " + yaml_quote(a.loss_output)) << "}\n";
  y << "pipeline:\n"
    << "  stages: " << r.devices << "\n"
    << "  chunks: " << b.chunks << "\n"
    << "  micro_batches: " << r.micro_batches << "\n"
    << "  schedule: " << yaml_quote(schedule) << "\n"
    << "  partition: " << (b.cut_after.empty() ? "balanced" : "manual") << "\n";
  if (!b.cut_after.empty()) {
    y << "  cut_after: [";
    for (size_t i = 0; i < b.cut_after.size(); ++i) y << (i ? ", " : "") << yaml_quote(b.cut_after[i]);
    y << "]\n";
  }
  y
    << "  recompute: " << yaml_quote(b.recompute_text()) << "\n"
    << "  link: " << a.link.preset << "\n";
  if (!a.link.bandwidth.empty()) y << "  bandwidth: " << yaml_quote(a.link.bandwidth) << "\n";
  if (!a.link.latency.empty()) y << "  latency: " << yaml_quote(a.link.latency) << "\n";
  if (a.link.device_rate > 0) y << "  device_rate: " << a.link.device_rate << "\n";
  std::filesystem::path trained = a.write;
  trained.replace_filename(trained.stem().string() + "_trained.onnx");
  y << "output: {model: " << yaml_quote(from_folder(folder, trained.string())) << "}\n";
  if (a.model.fuse_attention_from != kFusedAttentionMinKeys)
    y << "fuse_attention_from: " << a.model.fuse_attention_from << "\n";
  if (!a.frozen.empty()) {
    y << "parameters: {frozen: [";
    for (size_t i = 0; i < a.frozen.size(); ++i) y << (i ? ", " : "") << yaml_quote(a.frozen[i]);
    y << "]}\n";
  }
  write_file_atomic(a.write, y.str(), "choose another --write");
}

}  // namespace

PlanFile read_plan_file(const std::string& path) {
  const TrainConfig c = load_config(path);
  PlanFile p;
  p.model = c.model;
  for (const auto& [name, value] : c.dims) {
    if (name == "batch") p.micro_batch = value;
    else p.dims.push_back(name + "=" + std::to_string(value));
  }
  p.stages = c.pipeline.stages;
  p.chunks = c.pipeline.chunks ? c.pipeline.chunks : 1;
  p.micro_batches = c.pipeline.micro_batches;
  p.cut_after = c.pipeline.cut_after;
  p.schedule = c.pipeline.schedule;
  p.recompute = c.pipeline.recompute;
  p.link = c.pipeline.link;
  if (p.link.preset.empty()) p.link.preset = c.default_link();
  p.frozen = c.frozen;
  p.dropout = c.dropout;
  p.fuse_attention_from = c.attention_fused_from();
  p.fuse_attention_masks = c.attention_masks_fused();
  return p;
}

Graph graph_train_runs(Graph g, const std::vector<std::string>& frozen, bool dropout, int64_t fuse_attention_from,
                       bool masked) {
  g = training_form(std::move(g), frozen, dropout);
  if (fuse_attention_from > 0) fuse_attention(g, fuse_attention_from, masked);
  return g;
}

int run_plan(const PlanArgs& a) {
  PlanRequest r;
  r.devices = a.devices;
  r.memory = parse_bytes(a.memory, "--memory");
  if (r.memory <= 0) throw UserError("--memory " + a.memory, "must be more than 0", "give the memory of a device, e.g. 80GiB");
  const int64_t global = a.global_batch ? a.global_batch : 2 * a.devices * a.model.micro_batch;
  if (global % a.model.micro_batch != 0)
    throw UserError("--global-batch " + std::to_string(global),
                    "is not a multiple of the micro-batch (" + std::to_string(a.model.micro_batch) + ")",
                    "give a multiple of --micro-batch");
  r.micro_batches = static_cast<int>(global / a.model.micro_batch);
  r.link = link_model(a.link, flag_name);
  LossSpec loss;
  loss.kind = LossSpec::parse_kind(a.loss, "--loss");
  loss.output = a.loss_output;
  r.backward.loss = loss;

  // The graph `train` trains: training mode, each parameter site its own copy (plan/pipeline.h).
  ImportOptions io;
  io.batch = a.model.micro_batch;
  io.dims = model_dims(a.model.model, a.model.dims);
  io.parameters = {a.model.tied, a.model.untied, a.model.trained};
  Graph g = import_model(a.model.model, io);
  if (!loss.output.empty() && g.find(loss.output) == kNoValue)
    throw UserError("--loss-output " + loss.output, "the model has no such output", "name one of the model's outputs");
  g = graph_train_runs(std::move(g), a.frozen, true, a.model.fuse_attention_from);
  r.backward.frozen = a.frozen;
  const PlanSearch s = search_plans(g, estimate_costs(g), r);

  if (!a.write.empty()) write_plan(a, r, s);
  if (a.json) {
    std::cout << plan_search_json(r, s).dump(2) << "\n";
  } else {
    print_plan_search(std::cout, a.model.model, a.model.micro_batch, r, s);
    if (!a.write.empty()) std::cout << "wrote " << a.write << " (train it: pipetrain train " << a.write << ")\n";
  }
  return 0;
}

}  // namespace pt
