#include "plan/memory.h"

#include <cmath>
#include <cstdio>
#include <ostream>
#include <set>

#include "core/bytes.h"
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
    m.gradients = l.trained_bytes;
    m.optimizer = (o.moments * l.trained_bytes + o.shards - 1) / o.shards;
    m.activations = l.activation_bytes;
    out.devices.push_back(m);
  }
  return out;
}

// Per device: the parameters its chunks' graphs read, each once; the trained ones on the first
// device reading them, as the Trainer keeps their gradients and optimizer state.
std::vector<DeviceLoad> device_loads(const std::vector<BackwardGraphs>& chunks, const Schedule& lowered,
                                     const Costs& planned) {
  std::vector<DeviceLoad> loads(static_cast<size_t>(lowered.stages));
  std::vector<std::set<std::string>> held(loads.size());
  std::set<std::string> trained;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const size_t d = static_cast<size_t>(lowered.device_of(static_cast<int>(c)));
    for (const Graph* g : {&chunks[c].forward, &chunks[c].backward_input, &chunks[c].backward_weight})
      for (const Value& v : g->values)
        if (v.is_parameter() && held[d].insert(v.name).second) loads[d].parameter_bytes += v.type.bytes();
    for (const std::string& p : chunks[c].params) {
      if (!trained.insert(p).second) continue;
      const ValueId v = chunks[c].forward.find(p);
      if (v != kNoValue) loads[d].trained_bytes += chunks[c].forward.value(v).type.bytes();
    }
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
                       {"total_bytes", x.total()}});
  }
  return {{"optimizer_moments", m.moments},
          {"zero_shards", m.shards},
          {"process_overhead_bytes", m.overhead},
          {"devices", devices},
          {"process_bytes", m.process_bytes(every_device(m))}};
}

void print_memory_table(std::ostream& os, const MemoryNeeds& m, const std::string& indent) {
  char line[192];
  std::snprintf(line, sizeof line, "%s%6s %12s %12s %12s %12s %12s\n", indent.c_str(), "device", "parameters",
                "gradients", "optimizer", "activations", "total");
  os << line;
  for (size_t d = 0; d < m.devices.size(); ++d) {
    const DeviceMemory& x = m.devices[d];
    std::snprintf(line, sizeof line, "%s%6zu %12s %12s %12s %12s %12s\n", indent.c_str(), d,
                  format_bytes(x.parameters).c_str(), format_bytes(x.gradients).c_str(),
                  format_bytes(x.optimizer).c_str(), format_bytes(x.activations).c_str(),
                  format_bytes(x.total()).c_str());
    os << line;
  }
  os << indent << "one process holding every device on the CPU: " << format_bytes(m.process_bytes(every_device(m)))
     << " (the devices, "
     << format_bytes(m.overhead) << " for the process)\n";
}

}  // namespace pt
