// train/ranks.h: how the pipeline's devices spread over processes, without MPI itself (a build
// without MPI reads the same rules): whether this process is one of several ranks, and which
// rank runs each device.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace pt {

// Data parallelism: the ranks form `replicas` replicas of the pipeline; rank r is position
// r % (size / replicas) of replica r / (size / replicas). A collective runs over every rank, over
// the ranks of this rank's replica, or over the ranks at this rank's position in every replica.
enum class Over { kWorld, kReplica, kPosition };

// Whether mpirun's or Slurm's environment says this process is one of several ranks.
inline bool launched_as_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    const char* s = std::getenv(v);
    if (s && std::atoi(s) > 1) return true;
  }
  return false;
}

// The rank of each of `devices` pipeline devices on `ranks` processes: contiguous blocks, rank r
// runs devices [r * devices / ranks, (r + 1) * devices / ranks).
inline std::vector<int> rank_of_devices(int devices, int ranks) {
  std::vector<int> out;
  for (int d = 0; d < devices; ++d) out.push_back(static_cast<int>(int64_t{d} * ranks / devices));
  return out;
}

}  // namespace pt
