// partition/link.h: what moving tensors between neighbouring devices costs. In: a preset name
// or a bandwidth and latency as users write them. Out: seconds per transfer, and the same in
// the cost model's units (FLOP-equivalents at the device's rate), which the partitioner adds to
// the stages on either side of a cut and the schedule simulator puts between them.
//
// A transfer of `bytes` in `tensors` messages takes latency * tensors + bytes / bandwidth. The
// presets (typical figures, stated so that a user can replace them with their own):
//   none    transfers are free (the partitioner then only prefers cuts that move fewer bytes)
//   cpu     stages as threads of one process: a send copies into a queue and the receive copies
//           out, 8 GB/s through memory, 5 us per message (a lock and a thread wake-up); the
//           devices compute 100 GFLOP/s (the CPU balance of partition/cost_model.h)
//   nvlink  NCCL between GPUs over NVLink: 150 GB/s, 10 us; GPUs compute 50 TFLOP/s
//   pcie    NCCL between GPUs over PCIe 4.0 x16: 20 GB/s, 15 us; GPUs compute 50 TFLOP/s
//   tcp     MPI between CPU processes on hosts joined by 10 Gb Ethernet: 1.1 GB/s, 50 us;
//           100 GFLOP/s
#pragma once

#include <cstdint>
#include <string>

namespace pt {

struct LinkModel {
  std::string name = "none";  // the preset it started from
  double bandwidth = 0;       // bytes per second, each way; 0: bytes take no time
  double latency = 0;         // seconds per message
  double rate = 100e9;        // FLOP-equivalents per second: seconds -> the cost model's units

  bool priced() const { return bandwidth > 0 || latency > 0; }
  double seconds(int64_t bytes, int64_t tensors) const;
  int64_t cost(int64_t bytes, int64_t tensors) const;  // seconds * rate, rounded
};

// One of the presets above; UserError naming `where` for another name.
LinkModel link_preset(const std::string& name, const std::string& where = "--link");

// "10GB/s", "1.1e9", "800MiB/s" -> bytes per second (> 0). UserError naming `where`.
double parse_bandwidth(const std::string& text, const std::string& where);
// "5us", "0.05ms", "2e-6", "1s" -> seconds (>= 0). UserError naming `where`.
double parse_latency(const std::string& text, const std::string& where);

// "cpu: 8.00 GB/s, 5 us per message, devices at 100 GFLOP/s" (or "none: transfers are free").
std::string describe_link(const LinkModel& link);

// A link as users write it (flags, a config's pipeline.link): a preset, its figures adjusted.
struct LinkArgs {
  std::string preset = "cpu";      // none | cpu | nvlink | pcie | tcp
  std::string bandwidth, latency;  // empty: the preset's
  double device_rate = 0;          // GFLOP/s; 0: the preset's
};

// place(key) names where each value came from in errors: "link", "bandwidth", "latency".
template <typename Place>
LinkModel link_model(const LinkArgs& a, Place place) {
  LinkModel m = link_preset(a.preset, place("link"));
  if (!a.bandwidth.empty()) m.bandwidth = parse_bandwidth(a.bandwidth, place("bandwidth"));
  if (!a.latency.empty()) m.latency = parse_latency(a.latency, place("latency"));
  if (a.device_rate > 0) m.rate = a.device_rate * 1e9;
  if (!a.bandwidth.empty() || !a.latency.empty() || a.device_rate > 0) m.name += " (adjusted)";
  return m;
}

}  // namespace pt
