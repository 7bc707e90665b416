#include "partition/partitioner.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace pt {
namespace {

constexpr int kGraphInput = -1;

// Where each non-constant value is made (node index, -1 for graph inputs) and last needed
// (node index, or n for graph outputs, which travel to the last chunk).
struct Lifetimes {
  std::vector<int> def, last_use;
};

Lifetimes lifetimes(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  Lifetimes L;
  L.def.assign(g.values.size(), kGraphInput);
  L.last_use.assign(g.values.size(), kGraphInput - 1);  // never used
  for (size_t v = 0; v < g.values.size(); ++v) {
    L.def[v] = g.values[v].producer;
    if (!g.values[v].consumers.empty()) L.last_use[v] = g.values[v].consumers.back();
  }
  for (ValueId v : g.outputs) L.last_use[static_cast<size_t>(v)] = n;
  return L;
}

bool travels(const Graph& g, ValueId v) { return !g.value(v).is_initializer(); }

// The nodes a chunk may not go without: those with forward FLOPs (not a Reshape, Transpose,
// Slice or Gather alone). Empty when none has any: then every node counts.
std::vector<char> computing_nodes(const std::vector<NodeCost>& costs) {
  std::vector<char> out(costs.size());
  for (size_t i = 0; i < costs.size(); ++i) out[i] = costs[i].flops_fwd > 0;
  if (std::find(out.begin(), out.end(), 1) == out.end()) out.clear();
  return out;
}

// Balanced cuts: every chunk holds a node that computes, so at most that many chunks; more is
// one line naming the most stages that fit at this many chunks per stage.
void check_chunks_compute(const std::vector<NodeCost>& costs, int stages, int per_stage) {
  const int n = static_cast<int>(costs.size());
  const int most = most_chunks(costs);
  const int parts = stages * per_stage;
  if (parts <= most) return;
  const std::string asked = per_stage > 1 ? std::to_string(stages) + " stages x " + std::to_string(per_stage) +
                                                " chunks = " + std::to_string(parts) + " chunks"
                                          : std::to_string(stages) + " stages";
  const std::string what = "cannot cut the graph into " + asked + " that each hold a node with FLOPs: it has " +
                           std::to_string(most) + " such nodes (of " + std::to_string(n) + ")";
  if (most / per_stage < 1)
    throw UserError("partition", what, "use a schedule with fewer chunks per stage");
  throw UserError("partition", what,
                  "use at most " + std::to_string(most / per_stage) + (most / per_stage == 1 ? " stage" : " stages") +
                      (per_stage > 1 ? " at " + std::to_string(per_stage) + " chunks per stage" : ""));
}

std::vector<int64_t> balance_cost(const Graph& g, const std::vector<NodeCost>& costs,
                                  Strategy s) {
  std::vector<int64_t> out(costs.size());
  for (size_t i = 0; i < costs.size(); ++i) {
    switch (s) {
      case Strategy::kParams: out[i] = costs[i].param_bytes; break;
      case Strategy::kUniform: out[i] = 1; break;
      default: out[i] = costs[i].cost(); break;
    }
  }
  if (s == Strategy::kParams) {
    // A shared parameter counts once, where it is first read.
    std::set<ValueId> seen;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      out[i] = 0;
      for (ValueId v : g.nodes[i].inputs)
        if (v != kNoValue && g.value(v).is_parameter() && seen.insert(v).second)
          out[i] += g.value(v).type.bytes();
    }
  }
  return out;
}

std::vector<int> manual_cuts(const Graph& g, const std::vector<std::string>& names, int parts) {
  if (static_cast<int>(names.size()) != parts - 1)
    throw UserError("--cut-after", "names " + std::to_string(names.size()) + " nodes for " +
                                       std::to_string(parts) + " chunks",
                    "name exactly " + std::to_string(parts - 1) + " nodes to cut after");
  std::map<std::string, int> index;
  for (size_t i = 0; i < g.nodes.size(); ++i) index[g.nodes[i].name] = static_cast<int>(i);
  std::vector<int> cuts;
  for (const std::string& name : names) {
    auto it = index.find(name);
    if (it == index.end())
      throw UserError("--cut-after", "no node is named '" + name + "'",
                      "`pipetrain inspect --nodes` lists the node names");
    cuts.push_back(it->second + 1);
  }
  return cuts;
}

int device_of(int chunk, int chunks, int devices) {
  if (chunks == devices) return chunk;
  if (chunks == 2 * devices) return chunk < devices ? chunk : chunks - 1 - chunk;
  return chunk % devices;
}

void fill_chunk(const Graph& g, const std::vector<NodeCost>& costs, const Lifetimes& L,
                bool last, ChunkPlan* c) {
  std::set<ValueId> params;
  for (int i = c->begin; i < c->end; ++i) {
    const NodeCost& nc = costs[static_cast<size_t>(i)];
    c->flops_fwd += nc.flops_fwd;
    c->flops_bwd += nc.flops_bwd();
    c->activation_bytes += nc.saved_bytes;
    c->cost += nc.cost();
    for (ValueId v : g.nodes[static_cast<size_t>(i)].inputs)
      if (v != kNoValue && g.value(v).is_parameter()) params.insert(v);
  }
  c->params.assign(params.begin(), params.end());
  for (ValueId v : c->params) {
    c->param_count += g.value(v).type.numel();
    c->param_bytes += g.value(v).type.bytes();
  }
  // Crossing tensors, ordered by where they are made, then by id: deterministic.
  std::vector<std::pair<int, ValueId>> in, out;
  for (size_t vi = 0; vi < g.values.size(); ++vi) {
    const ValueId v = static_cast<ValueId>(vi);
    if (!travels(g, v) || L.last_use[vi] < c->begin) continue;
    const int def = L.def[vi];
    const bool made_before = def < c->begin;
    const bool made_here = def >= c->begin && def < c->end;
    if (made_before && L.last_use[vi] >= c->begin) in.push_back({def, v});
    if (!last && (made_before || made_here) && L.last_use[vi] >= c->end) out.push_back({def, v});
  }
  std::sort(in.begin(), in.end());
  std::sort(out.begin(), out.end());
  for (auto& p : in) {
    c->inputs.push_back(p.second);
    c->activation_bytes += g.value(p.second).type.bytes();
  }
  for (auto& p : out) c->outputs.push_back(p.second);
  if (last) c->outputs = g.outputs;
}

}  // namespace

Strategy parse_strategy(const std::string& name) {
  if (name == "balanced") return Strategy::kBalanced;
  if (name == "params") return Strategy::kParams;
  if (name == "uniform") return Strategy::kUniform;
  if (name == "manual") return Strategy::kManual;
  throw UserError("--strategy", "unknown strategy '" + name + "'",
                  "use balanced, params, uniform or manual");
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kBalanced: return "balanced";
    case Strategy::kParams: return "params";
    case Strategy::kUniform: return "uniform";
    case Strategy::kManual: return "manual";
  }
  return "?";
}

int most_chunks(const std::vector<NodeCost>& costs) {
  const std::vector<char> computes = computing_nodes(costs);
  return computes.empty() ? static_cast<int>(costs.size()) : static_cast<int>(std::count(computes.begin(), computes.end(), 1));
}

int64_t PartitionPlan::device_cost(int device) const {
  int64_t c = 0;
  for (const ChunkPlan& ch : chunks)
    if (ch.device == device) c += ch.cost;
  return c;
}

int64_t PartitionPlan::device_time(int device) const {
  int64_t t = 0;
  for (const ChunkPlan& ch : chunks)
    if (ch.device == device) t += ch.cost + ch.link_in + ch.link_out;
  return t;
}

LinearProblem linear_problem(const Graph& g, const std::vector<NodeCost>& costs,
                             const LinkModel& link) {
  const int n = static_cast<int>(g.nodes.size());
  LinearProblem p;
  p.cost.resize(static_cast<size_t>(n));
  p.param_bytes.assign(static_cast<size_t>(n), 0);
  p.activation_bytes.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    p.cost[static_cast<size_t>(i)] = costs[static_cast<size_t>(i)].cost();
    p.activation_bytes[static_cast<size_t>(i)] = costs[static_cast<size_t>(i)].saved_bytes;
  }
  p.computes = computing_nodes(costs);
  std::map<ValueId, std::vector<int>> readers;  // parameter -> the positions reading it, ascending
  for (int i = 0; i < n; ++i)
    for (ValueId v : g.nodes[static_cast<size_t>(i)].inputs)
      if (v != kNoValue && g.value(v).is_parameter() && (readers[v].empty() || readers[v].back() != i)) {
        if (readers[v].empty()) p.param_bytes[static_cast<size_t>(i)] += g.value(v).type.bytes();
        readers[v].push_back(i);
      }
  for (auto& [v, at] : readers)
    if (at.size() > 1) p.shared.push_back({g.value(v).type.bytes(), std::move(at)});
  // cut_bytes[i]: tensors made before position i and needed at or after it; cut_cost[i] what
  // moving them costs (their bytes and their count).
  const Lifetimes L = lifetimes(g);
  std::vector<int64_t> diff(static_cast<size_t>(n) + 2, 0), count(static_cast<size_t>(n) + 2, 0);
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (!travels(g, static_cast<ValueId>(v))) continue;
    const int from = L.def[v] + 1, to = std::min(L.last_use[v], n);
    if (to < from) continue;
    diff[static_cast<size_t>(from)] += g.values[v].type.bytes();
    diff[static_cast<size_t>(to) + 1] -= g.values[v].type.bytes();
    ++count[static_cast<size_t>(from)];
    --count[static_cast<size_t>(to) + 1];
  }
  p.cut_bytes.resize(static_cast<size_t>(n) + 1);
  int64_t run = 0, tensors = 0;
  for (int i = 0; i <= n; ++i) {
    p.cut_bytes[static_cast<size_t>(i)] = run += diff[static_cast<size_t>(i)];
    tensors += count[static_cast<size_t>(i)];
    if (link.priced()) p.cut_cost.push_back(link.cost(run, tensors));
  }
  return p;
}

PartitionPlan plan_partition(const Graph& g, const std::vector<NodeCost>& costs,
                             const PartitionOptions& opts) {
  PT_CHECK(costs.size() == g.nodes.size());
  if (opts.stages < 1)
    throw UserError("--stages", "must be at least 1, got " + std::to_string(opts.stages), "");
  if (opts.chunks_per_stage < 1)
    throw UserError("--chunks-per-stage", "must be at least 1", "");
  const int parts = opts.stages * opts.chunks_per_stage;
  const int n = static_cast<int>(g.nodes.size());
  if (opts.strategy != Strategy::kManual) check_chunks_compute(costs, opts.stages, opts.chunks_per_stage);
  if (parts > n)
    throw UserError("partition", "cannot cut a graph of " + std::to_string(n) + " nodes into " +
                                     std::to_string(parts) + " chunks",
                    "use at most " + std::to_string(n / opts.chunks_per_stage) + " stages");
  // Parameter bytes and node counts are not times: only the balanced and manual splits see links.
  const bool timed = opts.strategy == Strategy::kBalanced || opts.strategy == Strategy::kManual;
  LinearProblem problem = linear_problem(g, costs, timed ? opts.link : LinkModel{});
  // A device holding v chunks shares its limit between them.
  MemoryModel per_chunk = opts.memory;
  per_chunk.limit = opts.memory.limit / opts.chunks_per_stage;
  std::vector<PartRange> ranges;
  if (opts.strategy == Strategy::kManual) {
    ranges = split_at(problem, manual_cuts(g, opts.cut_after, parts), per_chunk);
  } else {
    problem.cost = balance_cost(g, costs, opts.strategy);
    ranges = solve_min_bottleneck(problem, parts, per_chunk, SolveOptions{opts.slack});
  }
  PartitionPlan plan;
  plan.strategy = opts.strategy;
  plan.devices = opts.stages;
  plan.chunks_per_stage = opts.chunks_per_stage;
  plan.link = timed ? opts.link : LinkModel{};
  const Lifetimes L = lifetimes(g);
  for (int c = 0; c < parts; ++c) {
    ChunkPlan ch;
    ch.index = c;
    ch.device = device_of(c, parts, opts.stages);
    ch.begin = ranges[static_cast<size_t>(c)].begin;
    ch.end = ranges[static_cast<size_t>(c)].end;
    ch.memory = ranges[static_cast<size_t>(c)].memory;
    if (!problem.cut_cost.empty()) {
      ch.link_in = c > 0 ? problem.cut_cost[static_cast<size_t>(ch.begin)] : 0;
      ch.link_out = c < parts - 1 ? problem.cut_cost[static_cast<size_t>(ch.end)] : 0;
    }
    fill_chunk(g, costs, L, c == parts - 1, &ch);
    plan.total_cost += ch.cost;
    plan.chunks.push_back(std::move(ch));
  }
  int64_t worst = 0, total_time = 0;
  for (int d = 0; d < plan.devices; ++d) {
    worst = std::max(worst, plan.device_time(d));
    total_time += plan.device_time(d);
  }
  const double mean = static_cast<double>(total_time) / plan.devices;
  plan.imbalance = mean > 0 ? static_cast<double>(worst) / mean : 1.0;
  return plan;
}

}  // namespace pt
