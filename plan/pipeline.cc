#include "plan/pipeline.h"

#include <iomanip>
#include <sstream>

#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "core/bytes.h"
#include "partition/cost_model.h"
#include "plan/chunk_costs.h"
#include "plan/planner.h"
#include "plan/schedule_choice.h"
#include "schedule/generators.h"
#include "schedule/lower.h"

namespace pt {
namespace {

// pipeline.chunks for `kind` (0: the kind's default). Chunks from the file belong to the file's
// schedule: a kind given on the command line alone (docs/training.md's
// `--set pipeline.schedule=1f1b` on a zb-v config) takes its own default where it does not
// allow the file's chunks, and says so.
int chunks_for(const PipelineRequest& r, const std::string& kind, std::vector<std::string>* notes) {
  const int chunks = r.config.chunks;
  const bool file_chunks = !r.chunks_for_schedule;
  if (chunks == 0 || kind == "auto") return kind == "auto" && file_chunks ? 0 : chunks;
  const KindInfo& k = located(r.where("pipeline.schedule"), [&]() -> const KindInfo& { return find_kind(kind); });
  if (chunks >= k.min_chunks && chunks <= k.max_chunks) return chunks;
  const std::string allowed = k.min_chunks == k.max_chunks ? std::to_string(k.min_chunks) : std::to_string(k.min_chunks) + " or more";
  if (!file_chunks)
    throw UserError(r.where("pipeline.chunks"), "schedule " + kind + " takes " + allowed + " chunk(s) per device, not " +
                                                    std::to_string(chunks),
                    "set pipeline.chunks to " + std::to_string(k.default_chunks) + ", or leave it out");
  notes->push_back("pipeline.schedule: " + kind + " takes " + allowed + " chunk(s) per device, not the " +
                   std::to_string(chunks) + " of " + r.where("pipeline.chunks") + "; running " +
                   std::to_string(k.default_chunks) + " (--set pipeline.chunks=N to choose)");
  return 0;
}

// The loss, recompute (pipeline.recompute for plan's devices and chunks) and frozen parameters.
ChunkBackwardOptions chunk_options(const PipelineRequest& r, const PipelineConfig& p, const PartitionPlan& plan) {
  return located(r.where("pipeline.recompute"), [&] {
    return backward_options(r.loss, p.recompute, r.frozen, plan.devices, static_cast<int>(plan.chunks.size()));
  });
}

// The cuts the config asks for, transfers priced by pipeline.link or else by the device: cpu on
// the CPU, nvlink with CUDA (partition/link.h states each preset's figures). Not by the count
// of processes: under mpirun the same config cuts where one process does and gives its bytes;
// a run across hosts over TCP says `link: tcp`.
PartitionOptions config_partition(const PipelineRequest& r, const PipelineConfig& p, int chunks_per_stage) {
  PartitionSpec s;
  s.stages = p.stages;
  s.chunks_per_stage = chunks_per_stage;
  s.strategy = p.partition;
  s.cut_after = p.cut_after;
  s.link = p.link;
  if (s.link.preset.empty()) s.link.preset = r.default_link;
  return partition_options(s, [&](const std::string& key) { return r.where("pipeline." + key); });
}

int64_t memory_limit(const PipelineRequest& r) {
  return located(r.where("pipeline.memory_limit"),
                 [&] { return parse_bytes(r.config.memory_limit, "pipeline.memory_limit"); });
}

// pipeline.plan: auto: the planner's best plan under pipeline.memory_limit (plan/planner.h), on
// the graph this run trains; its chunks, cuts and recompute written into out->chosen.
void plan_auto(const Graph& g, const std::vector<NodeCost>& costs, const PipelineRequest& r, PipelinePlan* out) {
  if (r.config.memory_limit.empty())
    throw UserError(r.where("pipeline.plan"), "needs pipeline.memory_limit, the memory of a device",
                    "set pipeline.memory_limit, e.g. 8GiB");
  PlanRequest q;
  q.devices = r.config.stages;
  q.micro_batches = r.config.micro_batches;
  q.memory = memory_limit(r);
  q.link = config_partition(r, r.config, 1).link;
  q.backward.loss = r.loss;
  q.backward.frozen = r.frozen;
  const PlanSearch s = located(r.where("pipeline.plan"), [&] { return search_plans(g, costs, q); });
  const PlanCandidate& best = s.best();
  out->schedule = best.schedule;
  out->lowered = add_send_recv(out->schedule);
  PipelineConfig& p = out->chosen;
  p.chunks = best.chunks;
  p.recompute = best.recompute_text();
  p.partition = best.cut_after.empty() ? "balanced" : "manual";
  p.cut_after = best.cut_after;
  std::ostringstream line;
  line << "plan: " << best.name() << "; simulated step " << std::fixed << std::setprecision(3) << best.step_s * 1e3
       << " ms, largest device " << format_bytes(best.largest_memory()) << " of " << format_bytes(q.memory) << " ("
       << s.candidates.size() << " plans searched)";
  out->notes.push_back(line.str());
}

// The compute schedule and the lowered one the config names (plan/schedule_choice.h).
void plan_schedule(const Graph& g, const std::vector<NodeCost>& costs, const PipelineRequest& r, PipelinePlan* out) {
  const PipelineConfig& p = r.config;
  const bool csv = is_csv_schedule(p.schedule);
  ScheduleSpec spec{csv ? "" : p.schedule, csv ? p.schedule : "", p.stages, p.micro_batches, 0, 0};
  if (!csv) spec.chunks = chunks_for(r, schedule_kind(p.schedule), &out->notes);
  else if (r.chunks_for_schedule) spec.chunks = p.chunks;
  if (!p.memory_limit.empty()) spec.memory_limit = static_cast<double>(memory_limit(r));  // auto: kept bytes per device
  // auto's costs per chunking, from the partition of each. A partition that must succeed (one
  // chunk per device, or the chunks asked for) fails with its own error, which names its key;
  // at two chunks when none were asked for, choose_schedule takes a failure as "not possible".
  struct PartitionFailed {
    UserError error;
  };
  const auto costs_at = [&](int v) {
    try {
      const PartitionPlan plan = plan_partition(g, costs, config_partition(r, p, v));
      return chunk_costs(build_chunk_backward(g, plan, chunk_options(r, p, plan)), plan);
    } catch (const UserError& e) {
      if (v == 1 || spec.chunks) throw PartitionFailed{e};
      throw;
    }
  };
  ScheduleChoice c;
  try {
    c = located(r.where("pipeline.schedule"), [&] { return choose_schedule(spec, costs_at); });
  } catch (const PartitionFailed& f) {
    throw f.error;
  }
  out->schedule = std::move(c.schedule);
  out->lowered = std::move(c.lowered);
}

}  // namespace

PipelinePlan plan_pipeline(const Graph& train, const PipelineRequest& r) {
  PipelinePlan out;
  out.chosen = r.config;
  const std::vector<NodeCost> costs = estimate_costs(train);
  if (r.config.plan == "auto") plan_auto(train, costs, r, &out);
  else plan_schedule(train, costs, r, &out);
  const PipelineConfig& p = out.chosen;
  const PartitionOptions po = config_partition(r, p, out.schedule.chunks);
  PartitionPlan plan = located(r.where(p.cut_after.empty() ? "pipeline.stages" : "pipeline.cut_after"),
                               [&] { return plan_partition(train, costs, po); });
  for (ChunkPlan& c : plan.chunks) c.device = out.schedule.device_of(c.index);
  const ChunkBackwardOptions co = chunk_options(r, p, plan);
  out.chunks = located(r.where("model"), [&] { return build_chunk_backward(train, plan, co); });
  out.planned = chunk_costs(out.chunks, plan);
  for (ChunkCost& c : out.planned.chunks) c.comm = 0;  // comm from the run's measured transfers, none planned
  return out;
}

Graph training_form(Graph g, const std::vector<std::string>& frozen, bool dropout) {
  to_training_mode(g, TrainingModeOptions{dropout});
  split_parameter_sites(g, frozen_parameters(g, frozen));
  return g;
}

ChunkBackwardOptions backward_options(const LossSpec& loss, const std::string& recompute,
                                      const std::vector<std::string>& frozen, int devices, int chunks) {
  ChunkBackwardOptions o;
  o.loss = loss;
  std::stringstream ss(recompute);
  for (std::string item; std::getline(ss, item, ',');) o.recompute.push_back(RecomputePolicy::parse(item, "--recompute"));
  const int n = static_cast<int>(o.recompute.size());
  if (n != 1 && n != devices && n != chunks)
    throw UserError("--recompute", "gives " + std::to_string(n) + " policies for " + std::to_string(devices) +
                                       " stages" + (chunks > devices ? " of " + std::to_string(chunks) + " chunks" : ""),
                    chunks > devices ? "give one policy for all stages, one per stage or one per chunk separated by commas"
                                     : "give one policy for all stages, or one per stage separated by commas");
  o.frozen = frozen;
  return o;
}

}  // namespace pt
