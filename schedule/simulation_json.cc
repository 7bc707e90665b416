#include "schedule/simulation_json.h"

namespace pt {

nlohmann::json simulation_json(const Schedule& s, const Simulation& sim) {
  nlohmann::json j;
  j["kind"] = s.kind;
  j["stages"] = s.stages;
  j["micro_batches"] = s.micro_batches;
  j["chunks"] = s.chunks;
  j["makespan"] = sim.makespan;
  j["bubble"] = sim.bubble;
  j["bubble_steps_overlapped"] = sim.span_bubble;
  j["devices"] = nlohmann::json::array();
  for (const DeviceReport& r : sim.devices)
    j["devices"].push_back({{"index", r.index},
                            {"busy", r.busy},
                            {"bubble", r.bubble},
                            {"bubble_steps_overlapped", r.span_bubble},
                            {"peak_activations", r.peak_activations},
                            {"peak_bytes", sim.bytes ? nlohmann::json(r.peak_bytes) : nlohmann::json()}});
  return j;
}

}  // namespace pt
