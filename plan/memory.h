// plan/memory.h: the memory a plan needs, per device and per process, before anything is loaded.
// In: what the plan puts on each device (DeviceLoad: the bytes of the parameters its chunks read,
// of those that train, and the peak of the activations its chunks keep under the schedule and
// the recompute policy) and the optimizer. Out: per device its parameters, gradients, optimizer
// state and activations; per process the sum over its devices plus a fixed overhead.
//
//   parameters   every parameter its chunks read, frozen ones too (one read on two devices: on
//                each; a tied parameter's sites: once per process); not the constants (shapes,
//                folded tensors: bytes, not megabytes)
//   gradients    1 x the trained bytes: the accumulators W adds into (a tied parameter: one per
//                site, in every process holding it)
//   optimizer    moments x the trained bytes / shards: AdamW 2, SGD with momentum 1, plain SGD 0;
//                ZeRO-1 keeps 1/replicas of it per replica (by whole parameters: about that)
//   activations  the schedule's simulated peak of what F keeps until B and B passes to W
//                (schedule/simulate.h), which is what train measures as peak kept activations
//   arena        the one arena the device's F, B and W programs share (they run one at a time):
//                the largest program's tensors (core/graph_arena.h), no room for an output the
//                executor places on every run (train/executor.h arena_bytes): equal to what train
//                allocates on a backend that fuses nothing, but for the kernels' scratch
//
// A trained parameter's gradient and optimizer state count on the first device that reads it
// (where train keeps them). A process adds kProcessOverhead (the program, its libraries, thread
// stacks, the graphs). On the CPU a gradient is held once: its accumulator is the host tensor
// the optimizer reads. A GPU device keeps its parameters, gradients, state, activations and
// arena in GPU memory; the host then holds the parameters and a copy of the gradients.
//
// Not counted (measured in docs/training.md "Memory"): the slots of chunk outputs, received
// tensors and gradients, the feeds' staging, the kernels' scratch, and, on rank 0 at the end,
// the trained model it gathers and writes. The partitioner's and the planner's loads (no F, B
// and W graphs yet) count no arena.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autodiff/backward.h"
#include "partition/partitioner.h"
#include "schedule/costs.h"
#include "schedule/schedule.h"

namespace pt {

// 300 MiB per process: the program, its libraries and threads; measured at 25-45 MiB for a
// one-process CPU run of a small sample, so the rest is margin (a CUDA context takes more).
constexpr int64_t kProcessOverhead = int64_t{300} << 20;

// What a plan puts on one device.
struct DeviceLoad {
  int64_t parameter_bytes = 0;   // every parameter its chunks read
  int64_t trained_bytes = 0;     // the parameters whose gradient and state it keeps
  int64_t activation_bytes = 0;  // planned peak of kept activations
  int64_t arena_bytes = 0;       // the programs' shared arena
  // The accumulators of a tied parameter's other sites, beside trained_bytes' one: gradients,
  // without optimizer state.
  int64_t site_gradient_bytes = 0;
};

struct MemoryOptions {
  int moments = 2;  // optimizer state per trained parameter: optimizer_moments()
  int shards = 1;   // ZeRO-1: data-parallel replicas sharing the optimizer state
  int64_t overhead = kProcessOverhead;
};

// State tensors per parameter of optimizer `kind` ("adamw" | "sgd", as train's config names
// it): AdamW 2 (exp_avg, exp_avg_sq), SGD 1 with momentum (momentum_buffer), 0 without.
int optimizer_moments(const std::string& kind, double momentum);

struct DeviceMemory {
  int64_t parameters = 0, gradients = 0, optimizer = 0, activations = 0, arena = 0;
  int64_t total() const { return parameters + gradients + optimizer + activations + arena; }
};

struct MemoryNeeds {
  std::vector<DeviceMemory> devices;
  int64_t overhead = kProcessOverhead;
  int moments = 2, shards = 1;

  // What the host holds for `devices`, summed: on CPU devices everything (a gradient once: its
  // accumulator is the host tensor the optimizer reads); for GPU devices their parameters and
  // the gradients' host copy.
  DeviceMemory host_part(const std::vector<int>& devices, bool on_gpu = false) const;
  // Host memory of a process holding `devices`: host_part plus the overhead.
  int64_t process_bytes(const std::vector<int>& devices, bool on_gpu = false) const {
    return host_part(devices, on_gpu).total() + overhead;
  }
  // GPU memory of device d: its total.
  int64_t device_bytes(int d) const { return devices[static_cast<size_t>(d)].total(); }
};

MemoryNeeds memory_needs(const std::vector<DeviceLoad>& loads, const MemoryOptions& options);

// The arena of chunk c's F, B and W programs as train plans each (the largest of the three):
// their tensors, without the outputs the executor places on every run (F's that the next
// chunk reads or B or W keep, B's, W's gradients added into their accumulators), views sharing
// their tensor's room; no fusion, no scratch.
int64_t chunk_arena_bytes(const std::vector<BackwardGraphs>& chunks, size_t c);

// Per device of `schedule` (compute-only or lowered: its placement), the loads of the chunks it
// runs (F, B and W graphs; a parameter's gradient on the first device reading it), activations
// the simulated peak of the lowered schedule on `planned` (plan/chunk_costs.h), the arena the
// largest of its chunks' (chunk_arena_bytes).
// process_of_device: the process (rank of the replica) of each device; empty: one process.
std::vector<DeviceLoad> device_loads(const std::vector<BackwardGraphs>& chunks, const Schedule& lowered,
                                     const Costs& planned, const std::vector<int>& process_of_device = {});

// The same from a partition alone (`pipetrain partition`: no schedule): the partitioner's own
// account (partition/linear_partition.h MemoryModel), chunk k of K keeping K - k micro-batches of
// its activation_bytes (1F1B's in-flight count); every parameter trained.
std::vector<DeviceLoad> device_loads(const PartitionPlan& plan);

// The same from a planner candidate's per-device state (4 x parameter bytes) and kept bytes.
std::vector<DeviceLoad> device_loads(const std::vector<int64_t>& state_bytes, const std::vector<int64_t>& kept_bytes);

// {"optimizer_moments", "zero_shards", "process_overhead_bytes", "devices": [{"device",
// "parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes", "arena_bytes",
// "total_bytes"}],
// "process_bytes"} where process_bytes is one process holding every device on the CPU.
nlohmann::json memory_json(const MemoryNeeds& m);

// A row per device: parameters, gradients, optimizer state, activations, arena, total; then what one
// process holding every device on the CPU needs. Each line starts with `indent`.
void print_memory_table(std::ostream& os, const MemoryNeeds& m, const std::string& indent = "");

}  // namespace pt
