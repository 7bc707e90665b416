#include "cli/train_memory.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <ostream>

#include "core/bytes.h"
#include "core/error.h"
#include "train/host_memory.h"
#include "train/ranks.h"
#include "train/train_devices.h"

namespace pt {
namespace {

std::string list(const std::vector<int>& xs) {
  std::string s;
  for (int x : xs) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// "parameters 449 MiB, gradients 898 MiB, optimizer state 898 MiB, activations 570 MiB": the parts
// that are not zero; `gradients` names what the gradients' figure holds.
std::string parts_text(const DeviceMemory& p, const char* gradients = "gradients") {
  std::string s;
  for (const auto& [name, bytes] : {std::pair<const char*, int64_t>{"parameters", p.parameters},
                                    {gradients, p.gradients},
                                    {"optimizer state", p.optimizer},
                                    {"activations", p.activations},
                                    {"arena", p.arena}})
    if (bytes > 0) s += (s.empty() ? "" : ", ") + std::string(name) + " " + format_bytes(bytes);
  return s;
}

// What would fit in `have` where `need` does not: a micro-batch of fewer rows (activations scale
// with them), recompute, or the plan spread over more places (`where`: hosts, GPUs) of `have`
// each. `fixed` of `need` is the processes' overhead, `per_place` of it what a place keeps
// however far the rest spreads (one process's: a host holds at least one).
std::string what_fits(const TrainConfig& cfg, int64_t rows, int64_t need, int64_t have, int64_t activations,
                      int64_t fixed, int64_t per_place, const char* where) {
  std::vector<std::string> ways;
  const int64_t room = have - (need - activations);
  if (activations > 0 && room > 0 && rows > 1) {
    const int64_t fewer = rows * room / activations;
    if (fewer >= 1) ways.push_back("dims.batch: " + std::to_string(fewer) + " (activations scale with its rows)");
  }
  if (activations > 0 && cfg.pipeline.recompute != "full")
    ways.push_back("pipeline.recompute: full (F keeps only each chunk's inputs)");
  if (have > per_place) {
    const int64_t spread = (need - fixed + (have - per_place) - 1) / (have - per_place);
    if (spread >= 2)
      ways.push_back("pipeline.stages spread over " + std::to_string(spread) + " " + where +
                     " or more (each holds its stages' parameters and state)");
  }
  std::string s = ways.empty() ? "" : "to fit: ";
  for (size_t i = 0; i < ways.size(); ++i)
    s += (i == 0 ? "" : i + 1 == ways.size() ? ", or " : ", ") + ways[i];
  return s + (s.empty() ? "" : "; ") + "--set memory.check=off runs it anyway";
}

// The ranks on this host: host_ranks' ranks, or this one alone.
std::vector<int> ranks_here(const TrainRanks& ranks) {
  std::vector<int> out;
  for (const auto& [rank, pid] : ranks.host_ranks()) out.push_back(rank);
  if (out.empty()) out.push_back(ranks.rank());
  std::sort(out.begin(), out.end());
  return out;
}

void check_host(const TrainConfig& cfg, const TrainMemory& m, const TrainRanks& ranks) {
  const HostMemory have = available_host_memory();
  if (have.bytes < 0) return;
  const std::vector<int> here = ranks_here(ranks);
  std::vector<int> devices;
  for (int r : here) {
    const std::vector<int>& d = m.devices_of_rank[static_cast<size_t>(r)];
    devices.insert(devices.end(), d.begin(), d.end());
  }
  const DeviceMemory part = m.needs.host_part(devices, m.on_gpu);
  const int64_t fixed = m.needs.overhead * static_cast<int64_t>(here.size());
  const int64_t need = part.total() + fixed;
  if (need <= have.bytes) return;
  const std::string who = ranks.alone() ? "this run" : "ranks " + list(here) + " on this host";
  throw UserError("host memory",
                  who + (ranks.alone() ? " needs " : " need ") + format_bytes(need) + " (" + parts_text(part, m.on_gpu ? "gradients' host copy" : "gradients") + ", " + format_bytes(m.needs.overhead) +
                      " per process), more than the " + format_bytes(have.bytes) + " it has available (" + have.source + ")",
                  what_fits(cfg, m.rows, need, have.bytes, part.activations, fixed, m.needs.overhead, "hosts"));
}

void check_gpus(const TrainConfig& cfg, const TrainMemory& m, const TrainRanks& ranks) {
  TrainDeviceOptions o{cfg.device, cfg.gpus, cfg.precision, cfg.threads, cfg.where("device")};
  const std::vector<GpuFree> free = free_gpu_memory(o, ranks.rank_of_devices(static_cast<int>(m.needs.devices.size())), ranks);
  std::map<int, std::vector<int>> on_gpu;  // GPU -> this rank's devices on it
  for (size_t d = 0; d < free.size(); ++d)
    if (free[d].gpu >= 0) on_gpu[free[d].gpu].push_back(static_cast<int>(d));
  for (const auto& [gpu, devices] : on_gpu) {
    DeviceMemory part;
    for (int d : devices) {
      const DeviceMemory& x = m.needs.devices[static_cast<size_t>(d)];
      part.parameters += x.parameters;
      part.gradients += x.gradients;
      part.optimizer += x.optimizer;
      part.activations += x.activations;
      part.arena += x.arena;
    }
    const int64_t have = free[static_cast<size_t>(devices.front())].bytes;
    if (part.total() <= have) continue;
    throw UserError("GPU " + std::to_string(gpu) + " memory",
                    std::string(devices.size() > 1 ? "devices " : "device ") + list(devices) + " need " +
                        format_bytes(part.total()) + " (" + parts_text(part) + "), more than its " + format_bytes(have) +
                        " free",
                    what_fits(cfg, m.rows, part.total(), have, part.activations, 0, 0, "GPUs"));
  }
}

}  // namespace

TrainMemory planned_memory(const TrainConfig& cfg, const TrainerPlan& plan, const TrainRanks& ranks) {
  TrainMemory m;
  MemoryOptions o;
  o.moments = optimizer_moments(cfg.optimizer.kind, cfg.optimizer.momentum);
  o.shards = cfg.parallel.zero == 1 ? ranks.replicas() : 1;
  const int per_replica = ranks.size() / ranks.replicas();
  const std::vector<int> position = rank_of_devices(plan.lowered.stages, per_replica);
  m.needs = memory_needs(device_loads(plan.chunks, plan.lowered, plan.planned, position), o);
  m.on_gpu = cfg.device == "cuda";
  m.devices_of_rank.resize(static_cast<size_t>(ranks.size()));
  for (int r = 0; r < ranks.size(); ++r)
    for (int d = 0; d < plan.lowered.stages; ++d)
      if (position[static_cast<size_t>(d)] == r % per_replica) m.devices_of_rank[static_cast<size_t>(r)].push_back(d);
  m.rows = plan.rows;
  return m;
}

// Across processes every rank of a host finds the same shortage: the lowest rank that finds one
// says it (its error ends the job, train_cmd.cc), the others wait in a collective for that end,
// so that the job prints one line.
void check_memory(const TrainConfig& cfg, const TrainMemory& m, const TrainRanks& ranks) {
  if (!cfg.memory.check) return;
  std::optional<UserError> failure;
  try {
    check_host(cfg, m, ranks);
    if (m.on_gpu) check_gpus(cfg, m, ranks);
  } catch (const UserError& e) {
    failure = e;
  }
  if (ranks.alone()) {
    if (failure) throw *failure;
    return;
  }
  std::vector<int64_t> lowest = {failure ? ranks.size() - ranks.rank() : 0};
  ranks.max(lowest);
  if (lowest[0] == 0) return;
  if (ranks.size() - lowest[0] == ranks.rank()) throw *failure;
  std::vector<int64_t> never = {0};
  ranks.max(never);  // the reporting rank never joins: its TrainRanks::abort ends this one
}

void print_memory_plan(std::ostream& os, const TrainMemory& m, const TrainRanks& ranks) {
  const std::vector<int> here = ranks_here(ranks);
  int64_t need = 0;
  for (int r : here) need += m.rank_bytes(r);
  const HostMemory have = available_host_memory();
  os << "memory: " << (ranks.alone() ? "this run plans " : "the ranks on rank 0's host (" + list(here) + ") plan ")
     << format_bytes(need) << " of host memory";
  if (have.bytes >= 0) os << " (" << format_bytes(have.bytes) << " available, " << have.source << ")";
  os << "\n";
}

void print_memory_summary(std::ostream& os, const TrainMemory& m, const TrainRanks& ranks) {
  std::vector<int64_t> rss(static_cast<size_t>(ranks.size()), 0);
  rss[static_cast<size_t>(ranks.rank())] = peak_rss_bytes();
  ranks.max(rss);
  os << "memory per device, planned: parameters + gradients + optimizer state + peak activations + programs' arena\n";
  for (size_t d = 0; d < m.needs.devices.size(); ++d) {
    const DeviceMemory& x = m.needs.devices[d];
    os << "  device " << d << ": " << format_bytes(x.parameters) << " + " << format_bytes(x.gradients) << " + "
       << format_bytes(x.optimizer) << " + " << format_bytes(x.activations) << " + " << format_bytes(x.arena)
       << " = " << format_bytes(x.total()) << "\n";
  }
  os << "peak RSS, measured / planned host memory ("
     << (m.on_gpu ? "its GPU devices' parameters and gradients' host copy, " : "its devices, ")
     << format_bytes(m.needs.overhead) << " per process):\n";
  for (int r = 0; r < ranks.size(); ++r) {
    const int64_t planned = m.rank_bytes(r), measured = rss[static_cast<size_t>(r)];
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2fx", static_cast<double>(measured) / static_cast<double>(planned));
    os << "  " << (ranks.alone() ? "process" : "rank " + std::to_string(r)) << ": " << format_bytes(measured) << " / "
       << format_bytes(planned) << " (" << ratio << ")\n";
  }
}

}  // namespace pt
