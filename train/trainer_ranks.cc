// The Trainer across processes and devices (train/trainer.h): the plan compared between ranks,
// the parameters' owners and their sharing, device-side updates, and the times every rank's
// devices took, gathered for the trace.
#include <algorithm>

#include "core/error.h"
#include "schedule/action.h"
#include "train/trainer.h"

namespace pt {

namespace {
constexpr const char* kCollectiveNames[] = {"gradients: sum over replicas", "ZeRO-1: parameters from the other replicas"};
}  // namespace

// Every rank must run the same plan: the lowered schedule's actions and each chunk's nodes and
// parameters, hashed and compared before the first step.
void Trainer::check_plan_across_processes() const {
  if (ranks_.alone()) return;
  std::string text = lowered_.kind + "/" + std::to_string(lowered_.micro_batches);
  for (const auto& list : lowered_.devices)
    for (const Action& a : list) text += format_action(a) + ";";
  for (const BackwardGraphs& c : chunks_) {
    for (const Node& n : c.forward.nodes) text += n.op_type + ",";
    for (const std::string& p : c.params) text += p + ",";
  }
  ranks_.check_same(fnv1a(text), "the plan (schedule, stages and their parameters)");
}

int Trainer::owner_of(const std::string& param) const {
  return rank_of_[static_cast<size_t>(first_device_.at(param))];
}

bool Trainer::holds(const std::string& param) const {
  if (owner_of(param) == ranks_.rank()) return true;
  for (const TiedParameter& t : ties_)
    if (t.parameter == param) return t.mirror_device.count(ranks_.rank()) > 0;
  return false;
}

void Trainer::bind_device_updates(const std::vector<int>& placement) {
  if (ranks_.replicas() > 1 || !sites_.empty()) return;
  for (size_t d = 0; d < devices_.backends.size(); ++d)
    if (here(d) && !devices_.backends[d]->updates_parameters()) return;
  std::map<std::string, int> device_of;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (const std::string& p : chunks_[c].params) {
      const auto [it, fresh] = device_of.emplace(p, placement[c]);
      if (!fresh && it->second != placement[c]) return;  // read on two devices
    }
  std::vector<std::vector<const float*>> grads(optimizers_.size());
  std::vector<std::vector<float*>> params(optimizers_.size());
  for (size_t d = 0; d < optimizers_.size(); ++d) {
    if (!here(d)) continue;  // another process's device
    Backend& b = *devices_.backends[d];
    for (const OptimizerParam& p : whole_[d]) {
      const float* g = executor_->device_gradient(p.name, b);
      if (!g) return;
      grads[d].push_back(g);
      params[d].push_back(static_cast<float*>(const_cast<void*>(b.device_constant(*p.value))));
    }
  }
  for (size_t d = 0; d < optimizers_.size(); ++d)
    if (here(d)) optimizers_[d]->bind_device(*devices_.backends[d], std::move(params[d]));
  device_grads_ = std::move(grads);
  executor_->keep_gradients_on_device();
}

void Trainer::pull_parameters() {
  if (!device_updates()) return;
  for (size_t d = 0; d < whole_.size(); ++d) {
    if (!here(d)) continue;
    Backend& b = *devices_.backends[d];
    for (const OptimizerParam& p : whole_[d]) b.copy(p.value->data.data(), b.device_constant(*p.value), p.value->data.size());
  }
}

void Trainer::trace_step(int64_t s, double at, const std::vector<std::vector<ActionTime>>& times,
                         const std::vector<TraceSpan>& collectives) {
  const int D = ranks_.replicas();
  if (D == 1) {
    trace_.add_step(s, at, lowered_, times, device_names_, collectives);
    return;
  }
  // Each rank its devices' times in its replica's slot, zeros elsewhere; summed over every rank.
  const std::vector<std::vector<ActionTime>> mine = executor_->action_times();
  size_t per = 0;
  for (const auto& list : mine) per += 2 * list.size();
  std::vector<double> all(per * static_cast<size_t>(D), 0.0);
  size_t at_slot = per * static_cast<size_t>(ranks_.replica());
  for (size_t d = 0; d < mine.size(); ++d)
    for (const ActionTime& t : mine[d]) {
      if (here(d)) {
        all[at_slot] = t.start;
        all[at_slot + 1] = t.end;
      }
      at_slot += 2;
    }
  ranks_.sum(all);
  const int ranks_per_replica = ranks_.size() / D, devices = schedule_.stages;
  const std::vector<int> rank_in_replica = rank_of_devices(devices, ranks_per_replica);
  size_t i = 0;
  for (int k = 0; k < D; ++k) {
    std::vector<std::vector<ActionTime>> replica(mine.size());
    std::vector<std::string> names;
    for (size_t d = 0; d < mine.size(); ++d) {
      for (size_t a = 0; a < mine[d].size(); ++a, i += 2) replica[d].push_back({all[i], all[i + 1]});
      names.push_back("device " + std::to_string(d) + " of replica " + std::to_string(k) + " (rank " +
                      std::to_string(k * ranks_per_replica + rank_in_replica[d]) + ")");
    }
    trace_.add_step(s, at, lowered_, replica, names, k + 1 == D ? collectives : std::vector<TraceSpan>{},
                    static_cast<size_t>(k * devices));
  }
}

std::vector<TraceSpan> Trainer::collective_spans(const std::vector<double>& spans) const {
  if (ranks_.replicas() == 1) return {};
  const size_t per = spans.size();
  std::vector<double> all(per * static_cast<size_t>(ranks_.size()), 0.0);
  std::copy(spans.begin(), spans.end(), all.begin() + static_cast<std::ptrdiff_t>(per * static_cast<size_t>(ranks_.rank())));
  ranks_.sum(all);  // each rank's slot from that rank alone: exact
  std::vector<TraceSpan> out;
  for (int r = 0; r < ranks_.size(); ++r)
    for (int k = 0; k < kCollectives; ++k) {
      const size_t at = per * static_cast<size_t>(r) + 2 * static_cast<size_t>(k);
      if (k == 1 && !sharded()) continue;
      out.push_back({"rank " + std::to_string(r) + ": across replicas", kCollectiveNames[k], all[at], all[at + 1]});
    }
  return out;
}

std::vector<std::vector<ActionTime>> Trainer::step_times() const {
  std::vector<std::vector<ActionTime>> times = executor_->action_times();
  if (ranks_.alone()) return times;
  std::vector<double> flat;
  for (size_t d = 0; d < times.size(); ++d)
    for (const ActionTime& t : times[d]) {
      const bool mine = rank_of_[d] == ranks_.rank();
      flat.push_back(mine ? t.start : 0.0);
      flat.push_back(mine ? t.end : 0.0);
      flat.push_back(mine ? t.cpu : 0.0);
    }
  ranks_.sum(flat, Over::kReplica);
  size_t i = 0;
  for (auto& list : times)
    for (ActionTime& t : list) {
      t.start = flat[i++];
      t.end = flat[i++];
      t.cpu = flat[i++];
    }
  return times;
}

}  // namespace pt
