#include "cli/driver.h"

#include <filesystem>
#include <iostream>

#include <onnx/checker.h>

#include "autodiff/chunk_backward.h"
#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "cli/model_inputs.h"
#include "cli/report.h"
#include "core/error.h"
#include "core/files.h"
#include "onnx_import/attention_fusion.h"
#include "onnx_import/export.h"
#include "onnx_import/import.h"
#include "onnx_import/load.h"
#include "partition/cost_model.h"
#include "partition/cut.h"
#include "partition/partitioner.h"
#include "plan/chunk_costs.h"
#include "schedule/generators.h"
#include "schedule/schedule.h"

namespace pt {
namespace {

ImportOptions import_options(const ModelArgs& m) {
  ImportOptions o;
  o.batch = m.micro_batch;
  o.dims = model_dims(m.model, m.dims);
  o.parameters = {m.tied, m.untied, m.trained};
  return o;
}

PartitionOptions partition_options(const PartitionArgs& a) {
  PartitionOptions o;
  o.stages = a.stages;
  o.chunks_per_stage = a.chunks_per_stage;
  o.strategy = parse_strategy(a.strategy);
  o.cut_after = a.cut_after;
  o.slack = a.slack;
  o.link = link_model(a.link, [](const std::string& key) { return "--" + key; });
  if (!a.memory_limit.empty()) o.memory.limit = parse_bytes(a.memory_limit, "--memory-limit");
  if (o.strategy == Strategy::kManual && a.cut_after.empty())
    throw UserError("--strategy manual", "needs the nodes to cut after",
                    "pass --cut-after NODE,NODE,...");
  return o;
}

// `partition --export` without --micro-batch: the stage files hold concrete shapes, the batch
// bound to 1 where the model's is symbolic; one line says so and how to choose it.
void note_fixed_batch(const ModelArgs& m) {
  if (m.micro_batch_given) return;
  std::string symbolic;
  for (const onnx::ValueInfoProto& in : declared_inputs(m.model))
    if (batch_is_symbolic(in, parse_dims(m.dims))) symbolic += (symbolic.empty() ? "'" : ", '") + in.name() + "'";
  if (symbolic.empty()) return;
  std::cerr << "note: the stage files have the batch fixed at " << m.micro_batch << " (axis 0 of " << symbolic
            << " is symbolic in the model); choose it with --micro-batch N\n";
}

}  // namespace

Graph training_form(Graph g, const std::vector<std::string>& frozen, bool dropout) {
  to_training_mode(g, TrainingModeOptions{dropout});
  split_parameter_sites(g, frozen_parameters(g, frozen));
  return g;
}

Costs derived_costs(const Graph& g, const PartitionPlan& plan, const ChunkBackwardOptions& options) {
  return chunk_costs(build_chunk_backward(g, plan, options), plan);
}

namespace {

// The first node with an output that carries a gradient (the embedding, the first layer): cut
// after it, the rest of the model is a chunk whose input carries a gradient, as every chunk but
// the first of a pipeline is. -1 when there is none or it is the last node.
int first_gradient_node(const Graph& g) {
  const std::vector<bool> needs = needs_gradient(g);
  for (size_t i = 0; i + 1 < g.nodes.size(); ++i)
    for (ValueId o : g.nodes[i].outputs)
      if (o != kNoValue && needs[static_cast<size_t>(o)]) return static_cast<int>(i);
  return -1;
}

}  // namespace

InspectWork inspect_work(const Graph& imported) {
  try {
    const Graph g = training_form(imported, {}, false);
    PartitionOptions po;
    po.stages = 1;
    const int cut = first_gradient_node(g);
    if (cut >= 0) {
      po.stages = 2;
      po.strategy = Strategy::kManual;
      po.cut_after = {g.nodes[static_cast<size_t>(cut)].name};
    }
    const PartitionPlan plan = plan_partition(g, estimate_costs(g), po);
    InspectWork out;
    for (const BackwardGraphs& chunk : build_chunk_backward(g, plan, ChunkBackwardOptions{})) {
      const ChunkWork w = chunk_work(chunk);
      out.work.f = total_cost({out.work.f, w.f});
      out.work.b = total_cost({out.work.b, w.b});
      out.work.w = total_cost({out.work.w, w.w});
    }
    if (cut >= 0) out.cut_after = po.cut_after[0];
    return out;
  } catch (const UserError& e) {
    const NodeCost total = total_cost(estimate_costs(imported));
    InspectWork w;
    w.work.f.flops_fwd = total.flops_fwd;
    w.work.b.flops_fwd = total.flops_bwd_input;
    w.work.w.flops_fwd = total.flops_bwd_weight;
    w.why_estimated = e.what();
    return w;
  }
}

void export_graphs(const std::vector<std::pair<std::string, Graph>>& files,
                   const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<onnx::ModelProto> models;
  for (const auto& [name, graph] : files) {
    models.push_back(to_model_proto(graph));
    try {
      onnx::checker::check_model(models.back());
    } catch (const std::exception& e) {
      PT_CHECK(false, name + " fails the onnx checker: " + e.what());
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir, "cannot create the export folder: " + ec.message(), "choose another --export");
  for (size_t k = 0; k < models.size(); ++k)
    save_model(models[k], (fs::path(dir) / files[k].first).string());
}

int run_ops() {
  print_op_table(std::cout);
  return 0;
}

int run_inspect(const InspectArgs& a) {
  const std::vector<std::string> unsupported = unsupported_ops(read_model(a.model.model));
  if (!unsupported.empty()) {
    std::cout << a.model.model << ": " << unsupported.size() << " unsupported node(s):\n";
    for (const std::string& u : unsupported) std::cout << "  " << u << "\n";
    throw UserError(a.model.model, unsupported.size() == 1 ? "1 node has an unsupported op (" + unsupported[0] + ")"
                                           : std::to_string(unsupported.size()) + " nodes have unsupported ops (first: " + unsupported[0] + ")",
                    "`pipetrain ops` lists the supported ops");
  }
  ImportOptions io = import_options(a.model);
  io.fuse_attention = true;  // the CPU program (the CUDA backend runs attention unfused)
  Graph g = import_model(a.model.model, io);
  std::vector<NodeCost> costs = estimate_costs(g);
  const InspectWork work = inspect_work(g);
  if (a.json) {
    nlohmann::json j = inspect_json(g, costs, work);
    j["attention"] = describe_attention(g);
    std::cout << j.dump(2) << "\n";
  } else {
    print_inspect(std::cout, g, costs, work, a.model.model, a.model.micro_batch, a.nodes);
    for (const std::string& line : describe_attention(g)) std::cout << "attention " << line << "\n";
  }
  return 0;
}

// `partition --plan FILE`: the model, micro-batch, stages, chunks, link and recompute of the plan.
PartitionArgs with_plan(const PartitionArgs& given) {
  if (given.stages != 0 || !given.model.model.empty() || given.strategy != "balanced")
    throw UserError("--plan " + given.plan, "gives the model, stages, chunks and link",
                    "leave out the model, --stages and --strategy");
  const PlanFile p = read_plan_file(given.plan);
  PartitionArgs a = given;
  a.model.model = p.model;
  a.model.micro_batch = p.micro_batch;
  a.model.micro_batch_given = true;
  a.model.dims = p.dims;
  a.stages = p.stages;
  a.chunks_per_stage = p.chunks;
  a.link = p.link;
  if (!p.cut_after.empty()) a.strategy = "manual", a.cut_after = p.cut_after;
  if (a.bwd.recompute == "none") a.bwd.recompute = p.recompute;
  a.bwd.frozen = p.frozen;
  return a;
}

int run_partition(const PartitionArgs& given) {
  const PartitionArgs a = given.plan.empty() ? given : with_plan(given);
  if (a.model.model.empty()) throw UserError("partition", "names no model", "pipetrain partition MODEL --stages N");
  if (a.stages == 0) throw UserError("partition", "needs --stages", "give --stages N, or --plan FILE");
  if (!a.backward && given.bwd.recompute != "none")
    throw UserError("--recompute " + a.bwd.recompute, "applies to the backward graphs, which only --backward builds",
                    "add --backward, or leave --recompute out");
  const PartitionOptions options = partition_options(a);
  Graph g = import_model(a.model.model, import_options(a.model));
  if (!a.plan.empty()) g = training_form(std::move(g), a.bwd.frozen, read_plan_file(a.plan).dropout);  // the graph train trains, whose cuts the plan runs
  std::vector<NodeCost> costs = estimate_costs(g);
  PartitionPlan plan = plan_partition(g, costs, options);
  if (!a.plan.empty()) {  // the devices as the plan's schedule places the chunks
    const std::string schedule = read_plan_file(a.plan).schedule;
    const Placement placement = schedule.ends_with(".csv")
                                    ? parse_csv(read_file(schedule, "check the plan's schedule CSV"), schedule).placement
                                    : find_kind(schedule).placement;
    for (ChunkPlan& c : plan.chunks) c.device = device_of(placement, plan.devices, c.index);
  }
  // The backward's options (--recompute per stage or chunk, --loss) checked before anything is
  // printed or exported, so a bad one leaves no stage files and no half a report.
  if (a.backward) chunk_backward_options(a.bwd, plan.devices, static_cast<int>(plan.chunks.size()));
  if (!a.export_dir.empty()) {
    std::vector<std::pair<std::string, Graph>> files;
    for (const ChunkPlan& c : plan.chunks)
      files.emplace_back("stage_" + std::to_string(c.index) + ".onnx", cut_chunk(g, c));
    export_graphs(files, a.export_dir);
    note_fixed_batch(a.model);
  }
  if (a.json) {
    nlohmann::json j = partition_json(g, plan);
    if (a.backward) report_backward(std::cout, &j, g, plan, a);
    std::cout << j.dump(2) << "\n";
  } else {
    print_partition_table(std::cout, g, plan, a.model.model, a.model.micro_batch);
    if (a.backward) report_backward(std::cout, nullptr, g, plan, a);
  }
  return 0;
}

}  // namespace pt
