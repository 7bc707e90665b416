// cli/plan_cmd.cc: `pipetrain plan`. The model as `train` would train it -> every plan the
// planner tries (plan/planner.h) -> the best, the runner-ups and why each lost, and with --write
// a train config that runs the plan as is.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "cli/args.h"
#include "cli/config.h"
#include "cli/model_inputs.h"
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
  c->add_option("--write", a->write, "write the plan as a train config (YAML) that `pipetrain train` runs as is");
  c->add_flag("--json", a->json, "print one JSON object");
}

namespace {

nlohmann::json candidate_json(const PlanCandidate& c) {
  return {{"kind", c.kind},           {"chunks", c.chunks},        {"recompute", c.recompute},
          {"cut_after", c.cut_after},
          {"grid", c.grid},           {"step_s", c.step_s},        {"bubble", c.bubble},
          {"state_bytes", c.state_bytes}, {"kept_bytes", c.kept_bytes}, {"fits", c.fits},
          {"note", c.note}};
}

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  return buf;
}

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", x * 100);
  return buf;
}

// The best candidate of every (kind, chunks) but the winner's, in the search's order.
std::vector<const PlanCandidate*> runner_ups(const PlanSearch& s) {
  std::vector<const PlanCandidate*> out;
  std::map<std::pair<std::string, int>, bool> seen{{{s.best().kind, s.best().chunks}, true}};
  for (const PlanCandidate& c : s.candidates)
    if (!seen[{c.kind, c.chunks}]) {
      seen[{c.kind, c.chunks}] = true;
      out.push_back(&c);
    }
  return out;
}

void print_plan(std::ostream& os, const PlanArgs& a, const PlanRequest& r, const PlanSearch& s) {
  const PlanCandidate& b = s.best();
  os << "plan for " << a.model.model << ": " << r.devices << " devices, " << r.micro_batches
     << " micro-batches of " << a.model.micro_batch << " (global batch " << r.micro_batches * a.model.micro_batch
     << "), memory cap " << format_bytes(r.memory) << " per device\n"
     << "link " << describe_link(r.link) << "\n"
     << "searched " << s.candidates.size() << " plans in " << std::fixed << std::setprecision(2) << s.seconds
     << " s, " << s.fitting << " fit\n\n"
     << "best: " << b.name() << (b.note.empty() ? "" : " (" + b.note + ")") << "\n"
     << "  simulated step " << ms(b.step_s) << ", bubble " << percent(b.bubble) << "\n"
     << "  device   parameters+state   kept activations      total\n";
  for (int d = 0; d < r.devices; ++d) {
    char line[128];
    std::snprintf(line, sizeof line, "  %6d %18s %18s %10s\n", d, format_bytes(b.state_bytes[d]).c_str(),
                  format_bytes(b.kept_bytes[d]).c_str(), format_bytes(b.memory(d)).c_str());
    os << line;
  }
  os << "\nrunner-ups (the best of each other kind and chunking):\n";
  for (const PlanCandidate* c : runner_ups(s)) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-44s %12s  ", c->name().c_str(), ms(c->step_s).c_str());
    os << line;
    if (c->fits)
      os << "+" << percent(c->step_s / b.step_s - 1) << " slower, largest device " << format_bytes(c->largest_memory())
         << "\n";
    else
      os << "does not fit: " << c->note << "\n";
  }
  if (const PlanCandidate* g = s.best_grid())
    os << "\nbest hand-made plan (a kind x one policy for every device, balanced cuts): " << g->name() << ", "
       << ms(g->step_s) << (g == &b ? ": the plan itself\n" : "; the plan is " + percent(1 - b.step_s / g->step_s) + " faster\n");
  else
    os << "\nno hand-made plan (a kind x one policy for every device) fits the cap\n";
}

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
    << b.name() << "; simulated step " << ms(b.step_s) << ", largest device " << format_bytes(b.largest_memory())
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
  if (p.link.preset.empty()) p.link.preset = c.device == "cuda" ? "nvlink" : "cpu";  // as train
  p.frozen = c.frozen;
  p.dropout = c.dropout;
  return p;
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
  r.link = link_model(a.link, [](const std::string& key) { return "--" + key; });
  LossSpec loss;
  loss.kind = LossSpec::parse_kind(a.loss, "--loss");
  loss.output = a.loss_output;
  r.backward.loss = loss;

  // The graph `train` trains: training mode, each parameter site its own copy (train_cmd.cc).
  ImportOptions io;
  io.batch = a.model.micro_batch;
  io.dims = model_dims(a.model.model, a.model.dims);
  io.parameters = {a.model.tied, a.model.untied, a.model.trained};
  Graph g = import_model(a.model.model, io);
  if (!loss.output.empty() && g.find(loss.output) == kNoValue)
    throw UserError("--loss-output " + loss.output, "the model has no such output", "name one of the model's outputs");
  to_training_mode(g, TrainingModeOptions{true});
  fuse_attention(g);  // as train on the CPU runs it (onnx_import/attention_fusion.h)
  split_parameter_sites(g, frozen_parameters(g, a.frozen));
  r.backward.frozen = a.frozen;
  const PlanSearch s = search_plans(g, estimate_costs(g), r);

  if (!a.write.empty()) write_plan(a, r, s);
  if (a.json) {
    nlohmann::json ups = nlohmann::json::array();
    for (const PlanCandidate* c : runner_ups(s)) ups.push_back(candidate_json(*c));
    const PlanCandidate* g_best = s.best_grid();
    std::cout << nlohmann::json{{"devices", r.devices},
                                {"micro_batches", r.micro_batches},
                                {"memory", r.memory},
                                {"searched", s.candidates.size()},
                                {"fitting", s.fitting},
                                {"seconds", s.seconds},
                                {"best", candidate_json(s.best())},
                                {"best_grid", g_best ? candidate_json(*g_best) : nlohmann::json()},
                                {"runner_ups", ups}}
                     .dump(2)
              << "\n";
  } else {
    print_plan(std::cout, a, r, s);
    if (!a.write.empty()) std::cout << "wrote " << a.write << " (train it: pipetrain train " << a.write << ")\n";
  }
  return 0;
}

}  // namespace pt
