#include "train/host_memory.h"

#include <sys/resource.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/bytes.h"

namespace pt {
namespace {

// "MemAvailable:   22154948 kB" -> bytes; -1 without the line.
int64_t meminfo_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

// This process's cgroup v2 folder ("0::/path" in /proc/self/cgroup), under /sys/fs/cgroup.
std::string cgroup_folder() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  return "";
}

// memory.max - memory.current of the cgroup; -1 without a limit ("max", or no such files).
int64_t cgroup_room() {
  const std::string folder = cgroup_folder();
  if (folder.empty()) return -1;
  std::ifstream max(folder + "/memory.max"), current(folder + "/memory.current");
  std::string limit;
  int64_t used = 0;
  if (!(max >> limit) || limit == "max" || !(current >> used)) return -1;
  std::istringstream text(limit);
  int64_t bytes = 0;
  if (!(text >> bytes)) return -1;
  return bytes > used ? bytes - used : 0;
}

}  // namespace

HostMemory available_host_memory() {
  if (const char* given = std::getenv("PT_MEMAVAILABLE"); given && *given)
    return {parse_bytes(given, "PT_MEMAVAILABLE"), "PT_MEMAVAILABLE"};
  HostMemory m{meminfo_available(), "MemAvailable"};
  const int64_t room = cgroup_room();
  if (room >= 0 && (m.bytes < 0 || room < m.bytes)) m = {room, "the cgroup's memory.max"};
  return m;
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux: kilobytes
}

}  // namespace pt
