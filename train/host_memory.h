// train/host_memory.h: the host memory a training run may take and the memory it took, for
// `train`'s check before loading (cli/train_memory.h) and its summary. Plain reads of the
// operating system; nothing here knows the plan.
#pragma once

#include <cstdint>
#include <string>

namespace pt {

struct HostMemory {
  int64_t bytes = -1;  // -1: unknown (no /proc/meminfo)
  std::string source;  // "MemAvailable", "the cgroup's memory.max", "PT_MEMAVAILABLE"
};

// What this host can give a new process now: MemAvailable of /proc/meminfo, lowered to the room
// left under this process's cgroup (v2: memory.max - memory.current) where a limit is set, as
// in a container. PT_MEMAVAILABLE (a size: "64MiB", "1e9") replaces both: for tests only, it
// lets them pretend a small machine. UserError naming PT_MEMAVAILABLE when it is no size.
HostMemory available_host_memory();

// This process's peak resident set so far (getrusage: ru_maxrss), in bytes.
int64_t peak_rss_bytes();

}  // namespace pt
