#include "cli/driver.h"

#include <filesystem>
#include <iostream>
#include <optional>
#include <set>

#include "autodiff/chunk_backward.h"
#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "cli/report.h"
#include "core/error.h"
#include "core/files.h"
#include "onnx_import/export.h"
#include "onnx_import/attention_fusion.h"
#include "onnx_import/import.h"
#include "onnx_import/load.h"
#include "partition/cost_model.h"
#include "partition/cut.h"
#include "partition/partitioner.h"
#include "plan/chunk_costs.h"
#include "plan/memory.h"
#include "plan/pipeline.h"
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

std::string flag_name(const std::string& key) { return "--" + key; }

int run_ops() {
  print_op_table(std::cout);
  return 0;
}

int run_inspect(const InspectArgs& a) {
  const std::vector<std::string> unsupported = unsupported_ops(read_model(a.model.model, ExternalData::kLeaveFloats));
  if (!unsupported.empty()) {
    std::cout << a.model.model << ": " << unsupported.size() << " unsupported node(s):\n";
    for (const std::string& u : unsupported) std::cout << "  " << u << "\n";
    throw UserError(a.model.model, unsupported.size() == 1 ? "1 node has an unsupported op (" + unsupported[0] + ")"
                                           : std::to_string(unsupported.size()) + " nodes have unsupported ops (first: " + unsupported[0] + ")",
                    "`pipetrain ops` lists the supported ops");
  }
  ImportOptions io = import_options(a.model);
  io.fuse_attention = true;  // the CPU program (the CUDA backend runs attention unfused)
  io.fuse_attention_from = a.model.fuse_attention_from;
  Graph g = import_model(a.model.model, io);
  std::vector<NodeCost> costs = estimate_costs(g);
  const ModelWork work = model_work(g);
  if (a.json) {
    nlohmann::json j = inspect_json(g, costs, work);
    j["attention"] = describe_attention(g, a.model.fuse_attention_from);
    std::cout << j.dump(2) << "\n";
  } else {
    print_inspect(std::cout, g, costs, work, a.model.model, a.model.micro_batch, a.nodes);
    for (const std::string& line : describe_attention(g, a.model.fuse_attention_from)) std::cout << "attention " << line << "\n";
  }
  return 0;
}

// `partition --plan FILE`: the model, micro-batch, stages, chunks, link and recompute of plan p.
PartitionArgs with_plan(const PartitionArgs& given, const PlanFile& p) {
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
  const std::optional<PlanFile> p = given.plan.empty() ? std::nullopt : std::optional(read_plan_file(given.plan));
  const PartitionArgs a = p ? with_plan(given, *p) : given;
  if (a.model.model.empty()) throw UserError("partition", "names no model", "pipetrain partition MODEL --stages N");
  if (a.stages == 0) throw UserError("partition", "needs --stages", "give --stages N, or --plan FILE");
  if (!a.backward && given.bwd.recompute != "none")
    throw UserError("--recompute " + a.bwd.recompute, "applies to the backward graphs, which only --backward builds",
                    "add --backward, or leave --recompute out");
  const PartitionOptions options = partition_options(a, flag_name);
  Graph g = import_model(a.model.model, import_options(a.model));
  if (p)  // as train trains
    g = graph_train_runs(std::move(g), a.bwd.frozen, p->dropout, p->fuse_attention_from, p->fuse_attention_masks);
  std::vector<NodeCost> costs = estimate_costs(g);
  PartitionPlan plan = plan_partition(g, costs, options);
  if (p) {  // the devices as the plan's schedule places the chunks
    const std::string& schedule = p->schedule;
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
  // Memory per device as train counts it (plan/memory.h), AdamW, 1F1B's micro-batches in flight.
  const MemoryNeeds memory = memory_needs(device_loads(plan), MemoryOptions{});
  if (a.json) {
    nlohmann::json j = partition_json(g, plan);
    j["memory"] = memory_json(memory);
    if (a.backward) report_backward(std::cout, &j, g, plan, a);
    std::cout << j.dump(2) << "\n";
  } else {
    print_partition_table(std::cout, g, plan, a.model.model, a.model.micro_batch);
    if (const std::string half = half_weights_line(g); !half.empty()) std::cout << half << "\n";
    std::cout << "memory per device under AdamW, chunk k of K keeping K-k micro-batches of activations (1F1B):\n";
    print_memory_table(std::cout, memory, "  ");
    if (a.backward) report_backward(std::cout, nullptr, g, plan, a);
  }
  return 0;
}

void check_dims_named(const std::map<std::string, int64_t>& dims, const std::vector<onnx::ValueInfoProto>& declared) {
  std::set<std::string> named;
  for (const auto& in : declared)
    for (const auto& d : in.type().tensor_type().shape().dim())
      if (!d.has_dim_value() && !d.dim_param().empty()) named.insert(d.dim_param());
  for (const auto& [name, value] : dims) {
    if (named.count(name)) continue;
    std::string list;
    for (const std::string& n : named) list += (list.empty() ? "" : ", ") + n;
    throw UserError("--dim " + name + "=" + std::to_string(value),
                    "the model's inputs have no symbolic dimension '" + name + "'",
                    named.empty() ? std::string("they have none, so leave --dim out")
                                  : "name one of " + list);
  }
}

std::map<std::string, int64_t> model_dims(const std::string& path, const std::vector<std::string>& dims) {
  std::map<std::string, int64_t> out = parse_dims(dims);
  if (!out.empty()) check_dims_named(out, declared_inputs(path));
  return out;
}

}  // namespace pt
