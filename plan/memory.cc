#include "plan/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>
#include <set>

#include "core/bytes.h"
#include "core/graph_arena.h"
#include "schedule/simulate.h"

namespace pt {

int optimizer_moments(const std::string& kind, double momentum) {
  if (kind == "adamw") return 2;
  return momentum > 0 ? 1 : 0;
}

DeviceMemory MemoryNeeds::host_part(const std::vector<int>& held, bool on_gpu) const {
  DeviceMemory sum;
  for (int d : held) {
    const DeviceMemory& m = devices[static_cast<size_t>(d)];
    sum.parameters += m.parameters;
    sum.gradients += m.gradients;  // CPU: the accumulators are the host tensors; GPU: their host copy
    if (on_gpu) continue;
    sum.optimizer += m.optimizer;
    sum.activations += m.activations;
    sum.arena += m.arena;
  }
  return sum;
}

MemoryNeeds memory_needs(const std::vector<DeviceLoad>& loads, const MemoryOptions& o) {
  MemoryNeeds out;
  out.overhead = o.overhead;
  out.moments = o.moments;
  out.shards = o.shards;
  for (const DeviceLoad& l : loads) {
    DeviceMemory m;
    m.parameters = l.parameter_bytes;
    m.gradients = l.trained_bytes + l.site_gradient_bytes;
    m.optimizer = (o.moments * l.trained_bytes + o.shards - 1) / o.shards;
    m.activations = l.activation_bytes;
    m.arena = l.arena_bytes;
    out.devices.push_back(m);
  }
  return out;
}

namespace {

// The arena of `g` with the outputs `placed(k, placeable)` says take no room.
template <class Placed>
int64_t arena_bytes(const Graph& g, const Placed& placed) {
  const GraphArena a = graph_arena(g);
  std::vector<char> flags(g.outputs.size(), 0);
  for (size_t k = 0; k < flags.size(); ++k) flags[k] = a.placeable[k] && placed(k);
  return a.plan(flags).arena_bytes;
}

bool listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

int64_t chunk_arena_bytes(const std::vector<BackwardGraphs>& chunks, size_t c) {
  const BackwardGraphs& ch = chunks[c];
  const Graph* next = c + 1 < chunks.size() ? &chunks[c + 1].forward : nullptr;
  const Graph& f = ch.forward;
  const int64_t forward = arena_bytes(f, [&](size_t k) {
    const std::string& name = f.value(f.outputs[k]).name;
    if (listed(ch.kept, name)) return true;
    const ValueId there = next ? next->find(name) : kNoValue;
    return there != kNoValue && std::count(next->inputs.begin(), next->inputs.end(), there) != 0;
  });
  const int64_t backward_input = arena_bytes(ch.backward_input, [](size_t) { return true; });
  const Graph& w = ch.backward_weight;
  const int64_t backward_weight = arena_bytes(w, [&](size_t k) {
    const std::string& name = w.value(w.outputs[k]).name;
    return name.rfind("grad.", 0) == 0 && adds_into_accumulator(w, w.outputs[k], name.substr(5));
  });
  return std::max({forward, backward_input, backward_weight});
}

// Per device: the parameters its chunks' graphs read, each once; the trained ones on the first
// device reading them, as the Trainer keeps their gradients and optimizer state. The sites of a
// tied parameter (autodiff/parameter_sites.h: "<parameter>@site<k>", one tensor's data under
// several names) count as one parameter and one state per process, on the first of its devices
// reading one, with every site's accumulator there: in one process each site accumulates its own,
// and across processes every holder receives the others' (train/ties.h).
std::vector<DeviceLoad> device_loads(const std::vector<BackwardGraphs>& chunks, const Schedule& lowered,
                                     const Costs& planned, const std::vector<int>& process_of_device) {
  std::vector<DeviceLoad> loads(static_cast<size_t>(lowered.stages));
  const auto process = [&](size_t d) { return d < process_of_device.size() ? process_of_device[d] : 0; };
  const auto data = [](const Value& v) -> const void* { return v.init ? v.init.get() : static_cast<const void*>(&v); };
  std::map<const void*, std::set<std::string>> sites;  // trained names by their data
  for (const BackwardGraphs& ch : chunks)
    for (const std::string& p : ch.params)
      if (const ValueId v = ch.forward.find(p); v != kNoValue) sites[data(ch.forward.value(v))].insert(p);
  std::vector<std::set<std::string>> held(loads.size());
  std::map<int, std::map<const void*, std::string>> data_held;  // per process: data -> the name first counted
  std::map<int, std::set<const void*>> stated;                  // per process: the data whose state it keeps
  for (size_t c = 0; c < chunks.size(); ++c) {
    const size_t d = static_cast<size_t>(lowered.device_of(static_cast<int>(c)));
    const int proc = process(d);
    for (const Graph* g : {&chunks[c].forward, &chunks[c].backward_input, &chunks[c].backward_weight})
      for (const Value& v : g->values) {
        if (!v.is_parameter() || !held[d].insert(v.name).second) continue;
        const auto [first, fresh] = data_held[proc].emplace(data(v), v.name);
        if (fresh || first->second == v.name) loads[d].parameter_bytes += v.type.bytes();  // not a tie's other site
      }
    for (const std::string& p : chunks[c].params) {
      const ValueId v = chunks[c].forward.find(p);
      if (v == kNoValue) continue;
      const Value& value = chunks[c].forward.value(v);
      if (!stated[proc].insert(data(value)).second) continue;
      loads[d].trained_bytes += value.type.bytes();
      loads[d].site_gradient_bytes += static_cast<int64_t>(sites[data(value)].size() - 1) * value.type.bytes();
    }
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    int64_t& arena = loads[static_cast<size_t>(lowered.device_of(static_cast<int>(c)))].arena_bytes;
    arena = std::max(arena, chunk_arena_bytes(chunks, c));
  }
  const std::vector<double> peak = peak_memory(lowered, planned);
  for (size_t d = 0; d < loads.size() && d < peak.size(); ++d) loads[d].activation_bytes = std::llround(peak[d]);
  return loads;
}

std::vector<DeviceLoad> device_loads(const PartitionPlan& plan) {
  std::vector<DeviceLoad> loads(static_cast<size_t>(plan.devices));
  const int64_t parts = static_cast<int64_t>(plan.chunks.size());
  for (const ChunkPlan& c : plan.chunks) {
    DeviceLoad& l = loads[static_cast<size_t>(c.device)];
    l.parameter_bytes += c.param_bytes;
    l.trained_bytes += c.param_bytes;
    l.activation_bytes += (parts - c.index) * c.activation_bytes;
  }
  return loads;
}

std::vector<DeviceLoad> device_loads(const std::vector<int64_t>& state_bytes, const std::vector<int64_t>& kept_bytes) {
  const int64_t factor = MemoryModel{}.state_factor;  // the planner's: weights, gradients, two moments
  std::vector<DeviceLoad> loads(state_bytes.size());
  for (size_t d = 0; d < loads.size(); ++d) {
    loads[d].parameter_bytes = loads[d].trained_bytes = state_bytes[d] / factor;
    loads[d].activation_bytes = d < kept_bytes.size() ? kept_bytes[d] : 0;
  }
  return loads;
}

namespace {

std::vector<int> every_device(const MemoryNeeds& m) {
  std::vector<int> all;
  for (size_t d = 0; d < m.devices.size(); ++d) all.push_back(static_cast<int>(d));
  return all;
}

}  // namespace

nlohmann::json memory_json(const MemoryNeeds& m) {
  nlohmann::json devices = nlohmann::json::array();
  for (size_t d = 0; d < m.devices.size(); ++d) {
    const DeviceMemory& x = m.devices[d];
    devices.push_back({{"device", d},
                       {"parameter_bytes", x.parameters},
                       {"gradient_bytes", x.gradients},
                       {"optimizer_bytes", x.optimizer},
                       {"activation_bytes", x.activations},
                       {"arena_bytes", x.arena},
                       {"total_bytes", x.total()}});
  }
  return {{"optimizer_moments", m.moments},
          {"zero_shards", m.shards},
          {"process_overhead_bytes", m.overhead},
          {"devices", devices},
          {"process_bytes", m.process_bytes(every_device(m))}};
}

void print_memory_table(std::ostream& os, const MemoryNeeds& m, const std::string& indent) {
  // The arena's column where it is counted (train's plan: the partitioner's and the planner's
  // have no programs to count).
  const bool arenas = std::any_of(m.devices.begin(), m.devices.end(), [](const DeviceMemory& x) { return x.arena > 0; });
  const auto row = [&](const std::vector<std::string>& cells) {
    char cell[32];
    std::string line = indent;
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i == 5 && !arenas) continue;
      std::snprintf(cell, sizeof cell, i == 0 ? "%6s" : " %12s", cells[i].c_str());
      line += cell;
    }
    os << line << "\n";
  };
  row({"device", "parameters", "gradients", "optimizer", "activations", "arena", "total"});
  for (size_t d = 0; d < m.devices.size(); ++d) {
    const DeviceMemory& x = m.devices[d];
    row({std::to_string(d), format_bytes(x.parameters), format_bytes(x.gradients), format_bytes(x.optimizer),
         format_bytes(x.activations), format_bytes(x.arena), format_bytes(x.total())});
  }
  os << indent << "one process holding every device on the CPU: " << format_bytes(m.process_bytes(every_device(m)))
     << " (the devices, "
     << format_bytes(m.overhead) << " for the process)\n";
}

}  // namespace pt
