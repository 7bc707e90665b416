// cli/schedule_cmd.cc: `pipetrain schedule`. Costs (unit, --costs or --model) -> a schedule
// (a generator, auto, or --from-csv) -> validate, lower, simulate -> timeline, CSV, SVG, JSON.
#include <CLI/CLI.hpp>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/args.h"
#include "cli/driver.h"
#include "plan/pipeline.h"

#include "cli/schedule_args.h"
#include "cli/suggest.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/files.h"
#include "onnx_import/import.h"
#include "partition/cost_model.h"
#include "partition/linear_partition.h"  // format_bytes
#include "partition/partitioner.h"
#include "plan/schedule_choice.h"
#include "schedule/auto.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/render.h"
#include "schedule/simulate.h"
#include "schedule/simulation_json.h"
#include "schedule/validate.h"

namespace pt {

void add_schedule_options(CLI::App* c, ScheduleArgs* a) {
  c->add_option("--kind,-k", a->kind,
                "gpipe | 1f1b | interleaved | zb-h1 | zb-h2 | zb-v | v-zb | v-half | v-min | dualpipev | auto (any case)")
      ->transform([](std::string k) {
        for (char& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        return k;
      });
  c->add_option("--stages,-s", a->stages, "pipeline stages (devices)")->check(at_least_one());
  c->add_option("--micro-batches,-m", a->micro_batches, "micro-batches per step")
      ->check(at_least_one());
  c->add_option("--chunks,-v", a->chunks, "chunks per device")->check(at_least_one());
  c->add_option("--costs", a->costs,
                "F,B,W times of a whole stage (or of each stage in turn: 3 x stages numbers)")
      ->delimiter(',');
  c->add_option("--comm", a->comm, "time of one transfer between devices (with --model: instead of the link's)")
      ->check(CLI::NonNegativeNumber);
  add_link_args(c, &a->link);
  c->add_option("--w-keep", a->w_keep, "fraction of F's activations that B leaves for W")
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--model", a->model, "take costs from this ONNX model (FLOPs, saved bytes)");
  c->add_option("--micro-batch,-b", a->micro_batch, "--model: binds the batch dimension")
      ->check(at_least_one());
  c->add_option("--dim", a->dims, "--model: binds a named symbolic dimension: NAME=VALUE");
  add_fuse_attention_option(c, &a->fuse_attention_from);
  c->add_option("--memory-limit", a->memory_limit,
                "per device: micro-batches of a stage's activations, or bytes with --model");
  c->add_option("--csv", a->csv, "write the schedule as CSV");
  c->add_option("--from-csv", a->from_csv, "read, check and simulate this CSV schedule");
  CLI::Option* plan = c->add_option("--plan", a->plan,
                                    "show this plan's schedule (`plan --write`): its kind or CSV, stages, "
                                    "micro-batches, model and link");
  c->add_option("--svg", a->svg, "draw the timeline as SVG");
  c->add_flag("--lowered", a->lowered, "--csv: include sends, receives and the optimizer step");
  c->add_flag("--json", a->json, "print one JSON object");
  plan_gives(c, plan, {"--kind", "--from-csv", "--stages", "--micro-batches", "--chunks", "--model", "--micro-batch",
                       "--dim", "--fuse-attention-from", "--link", "--bandwidth", "--latency", "--device-rate"});
}

namespace {

// Per-chunk costs from the model, chunk by chunk of the partition into stages x chunks: the
// model in the form train trains on the CPU (no dropout, nothing frozen, attention fused from
// --fuse-attention-from keys), each chunk's F, B and W graphs derived (no loss, no recompute) and
// counted (plan/chunk_costs.h), kept activations in bytes.
Costs model_costs(const ScheduleArgs& a, int v) {
  ImportOptions io;
  io.batch = a.micro_batch;
  io.dims = model_dims(a.model, a.dims);
  const Graph g =
      graph_train_runs(import_model(a.model, io), {}, false, a.fuse_attention_from, a.fuse_attention_masks);
  PartitionArgs pa;
  pa.stages = a.stages;
  pa.chunks_per_stage = v;
  pa.link = a.link;
  const PartitionPlan plan = plan_partition(g, estimate_costs(g), partition_options(pa, flag_name));
  return chunk_costs(build_chunk_backward(g, plan, ChunkBackwardOptions{}), plan);
}

Costs costs_for(const ScheduleArgs& a, int stages, int v) {
  Costs costs;
  if (!a.model.empty()) {
    costs = model_costs(a, v);
  } else if (!a.costs.empty()) {
    const size_t n = a.costs.size();
    if (n != 3 && n != 3 * static_cast<size_t>(stages))
      throw UserError("--costs", "has " + std::to_string(n) + " numbers",
                      "give F,B,W (3 numbers) or F,B,W for each stage (" +
                          std::to_string(3 * stages) + ")");
    std::vector<ChunkCost> per_stage;
    for (int s = 0; s < stages; ++s) {
      const size_t i = n == 3 ? 0 : 3 * static_cast<size_t>(s);
      if (a.costs[i] < 0 || a.costs[i + 1] < 0 || a.costs[i + 2] < 0)
        throw UserError("--costs", "has a negative time", "give times >= 0");
      per_stage.push_back({a.costs[i], a.costs[i + 1], a.costs[i + 2], 1, 0, 0});
    }
    costs = split_stages(per_stage, v);
  } else {
    costs = unit_costs(stages, v);
  }
  for (ChunkCost& c : costs.chunks) {
    if (a.model.empty() || a.comm > 0) c.comm = a.comm;
    c.w_keep = a.w_keep * c.activation;
  }
  return costs;
}

double memory_limit(const ScheduleArgs& a) {
  if (a.memory_limit.empty()) return 0;
  if (!a.model.empty()) return static_cast<double>(parse_bytes(a.memory_limit, "--memory-limit"));
  try {
    size_t used = 0;
    const double x = std::stod(a.memory_limit, &used);
    if (used == a.memory_limit.size() && x > 0) return x;
  } catch (const std::exception&) {
  }
  throw UserError("--memory-limit " + a.memory_limit,
                  "is not a positive number of micro-batches",
                  "without --model the limit counts what one micro-batch leaves on a stage, e.g. 4");
}

struct Planned {
  Schedule schedule;
  Costs costs;
  std::string note;  // what auto chose
};

Planned plan(const ScheduleArgs& a) {
  if (!a.from_csv.empty() && !a.kind.empty())
    throw UserError("--from-csv", "takes the schedule from the file", "drop --kind");
  if (a.from_csv.empty() && a.kind.empty()) throw UserError("", "no schedule given", "pass --kind K or --from-csv FILE");
  if (a.from_csv.empty() && (a.stages < 1 || a.micro_batches < 1))
    throw UserError("--kind " + a.kind, "needs --stages and --micro-batches", "");
  // A CSV's stages, micro-batches and chunks are the file's.
  const bool csv = !a.from_csv.empty();
  ScheduleSpec spec{a.kind, a.from_csv, csv ? 0 : a.stages, csv ? 0 : a.micro_batches, csv ? 0 : a.chunks, 0};
  spec.memory_limit = memory_limit(a);  // auto's
  ScheduleChoice c = choose_schedule(spec, [&](int v) { return costs_for(a, a.stages, v); });
  Planned p;
  p.schedule = std::move(c.lowered_csv ? c.lowered : c.schedule);  // a lowered CSV is shown as written
  p.costs = c.costs ? *c.costs : costs_for(a, p.schedule.stages, p.schedule.chunks);
  p.note = std::move(c.note);
  return p;
}

// Activations kept, in micro-batches of a stage's activations: "8" or "3.64".
std::string format_micro_batches(double v) {
  std::ostringstream os;
  os << std::setprecision(3) << v << " micro-batch" << (v == 1 ? "" : "es") << " of activations";
  return os.str();
}

int run(const ScheduleArgs& a) {
  Planned p = plan(a);
  const std::string where = a.from_csv.empty() ? "--kind " + p.schedule.kind : a.from_csv;
  const Simulation sim = simulate(p.schedule, p.costs, where);
  const Schedule lowered = p.schedule.lowered() ? p.schedule : add_send_recv(p.schedule);
  validate(lowered, where + " (lowered)");
  const double limit = memory_limit(a);
  if (limit > 0 && a.kind != "auto")
    for (const DeviceReport& r : sim.devices) {
      const double peak = p.costs.bytes ? r.peak_bytes : r.peak_activations;
      if (peak > limit * (1 + 1e-9))
        throw UserError(where, "device " + std::to_string(r.index) + " keeps " +
                                   (p.costs.bytes ? format_bytes(static_cast<int64_t>(peak))
                                                  : format_micro_batches(peak)) +
                                   " at its peak, over --memory-limit " + a.memory_limit,
                        "choose a kind with less memory, or --kind auto");
    }
  if (!a.csv.empty()) write_file_atomic(a.csv, format_csv(a.lowered ? lowered : p.schedule), "choose another --csv");
  if (!a.svg.empty()) write_file_atomic(a.svg, svg_timeline(p.schedule, sim), "choose another --svg");
  if (a.json) {
    std::cout << simulation_json(p.schedule, sim).dump(2) << "\n";
    return 0;
  }
  std::cout << "schedule " << p.schedule.kind << ": " << p.schedule.stages << " stages, "
            << p.schedule.micro_batches << " micro-batches, " << p.schedule.chunks
            << " chunk(s) per device, placement " << placement_name(p.schedule.placement)
            << (p.costs.bytes ? "; times in GFLOP" : "") << "\n"
            << p.note << ascii_timeline(p.schedule, sim);
  return 0;
}

}  // namespace

// `schedule --plan FILE`: the plan's schedule with costs from its model and link.
ScheduleArgs with_plan(const ScheduleArgs& given) {
  const PlanFile p = read_plan_file(given.plan);
  ScheduleArgs a = given;
  (p.schedule.ends_with(".csv") ? a.from_csv : a.kind) = p.schedule;
  a.stages = p.stages;
  a.micro_batches = p.micro_batches;
  a.chunks = p.chunks;
  a.model = p.model;
  a.micro_batch = p.micro_batch;
  a.dims = p.dims;
  a.link = p.link;
  a.fuse_attention_from = p.fuse_attention_from;
  a.fuse_attention_masks = p.fuse_attention_masks;
  return a;
}

int run_schedule(const ScheduleArgs& given) {
  const ScheduleArgs a = given.plan.empty() ? given : with_plan(given);
  try {
    return run(a);
  } catch (const ScheduleError& e) {
    std::cout << e.grid();  // the grid above the one-line error
    throw;
  }
}

}  // namespace pt
