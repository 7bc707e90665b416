#include "train/train_devices.h"

#include <algorithm>
#include <functional>
#include <set>
#include <utility>

#include "core/error.h"
#include "exec/cpu/cpu_backend.h"
#ifdef PT_HAVE_MPI
#include "train/mpi_comm.h"
#endif
#ifdef PT_HAVE_CUDA
#include "exec/cuda/cuda_backend.h"
#include "train/cuda/gpu_comm.h"
#include "train/cuda/nccl_ranks.h"
#endif

namespace pt {
namespace {

TrainDevices cpu_devices(const TrainDeviceOptions& cfg, int stages, const std::vector<int>& rank_of, int rank) {
  TrainDevices t;
  bool alone = true;
  for (int d = 0; d < stages; ++d) {
    if (rank_of[static_cast<size_t>(d)] != rank) {
      alone = false;
      t.backends.push_back(nullptr);  // another process runs it
      continue;
    }
    t.owned.push_back(std::make_unique<CpuBackend>(cfg.threads));
    t.backends.push_back(t.owned.back().get());
  }
  t.summary = "cpu";
  if (alone) {
    t.comm = std::make_unique<InProcessComm>();
    return t;
  }
#ifdef PT_HAVE_MPI
  t.comm = std::make_unique<MpiComm>(rank_of, rank);
  return t;
#else
  PT_CHECK(false, "devices of other processes in a build without MPI");
  return t;
#endif
}

#ifdef PT_HAVE_CUDA
// The GPU of each of this process's pipeline devices (TrainDeviceOptions), checked against the GPUs
// found; -1 for another process's. `device: cuda` counts this process's devices from
// local_rank x (its devices): one process per GPU on every host, as mpirun places ranks.
std::vector<int> gpu_of_device(const TrainDeviceOptions& cfg, const std::vector<int>& rank_of, int rank, int local_rank) {
  const int found = cuda::device_count();
  if (found == 0)
    throw UserError(cfg.where, "no GPU was found (" + cuda::no_device_reason() + ")",
                    "set device: cpu, or run on a machine with a GPU");
  const int mine = static_cast<int>(std::count(rank_of.begin(), rank_of.end(), rank));
  std::vector<int> gpus;
  int k = local_rank * mine;
  for (size_t d = 0; d < rank_of.size(); ++d) {
    if (rank_of[d] != rank) {
      gpus.push_back(-1);
      continue;
    }
    const int g = cfg.gpus.empty() ? k++ % found : cfg.gpus[cfg.gpus.size() == 1 ? 0 : d];
    if (g >= found)
      throw UserError(cfg.where, "GPU " + std::to_string(g) + " does not exist (" +
                                               std::to_string(found) + " found)",
                      "name GPUs 0 to " + std::to_string(found - 1));
    gpus.push_back(g);
  }
  return gpus;
}

// The ordered device pairs the schedule sends over, those `keep` accepts.
std::vector<std::pair<int, int>> links_of(const Schedule& s, const std::function<bool(int, int)>& keep) {
  std::set<std::pair<int, int>> links;
  auto add = [&](int from, int to) {
    if (keep(from, to)) links.insert({from, to});
  };
  for (const auto& list : s.devices)
    for (const Action& a : list) {
      if (a.op == Op::kSendF) add(s.device_of(a.chunk), s.device_of(a.chunk + 1));
      if (a.op == Op::kSendB) add(s.device_of(a.chunk), s.device_of(a.chunk - 1));
    }
  return {links.begin(), links.end()};
}

#ifdef PT_HAVE_MPI
// Between ranks: NCCL where the two ends are different GPUs, host memory and MPI where two ranks
// share a GPU (NCCL refuses that); `local` carries this rank's own links.
std::unique_ptr<Comm> across_ranks(const Schedule& lowered, const std::vector<int>& rank_of, const TrainRanks& ranks,
                                   const std::vector<int>& gpus, const std::vector<cuda::CudaBackend*>& cuda,
                                   std::unique_ptr<Comm> local, TrainDevices& t) {
  auto mpi = std::make_unique<MpiComm>(rank_of, ranks.rank(), std::move(local), t.backends);
  // Every device's GPU identity, from its rank: each rank fills its own entries, the OR of the
  // disjoint entries is the whole list.
  std::vector<uint64_t> gpu(gpus.size(), 0);
  for (size_t d = 0; d < gpus.size(); ++d)
    if (gpus[d] >= 0) gpu[d] = fnv1a(cuda::gpu_identity(gpus[d]));
  ranks.share(gpu.data(), gpu.size() * sizeof(uint64_t), true, Over::kReplica);
  bool shared_gpu = false;
  const std::vector<std::pair<int, int>> nccl = links_of(lowered, [&](int a, int b) {
    const size_t x = static_cast<size_t>(a), y = static_cast<size_t>(b);
    if (rank_of[x] == rank_of[y]) return false;
    shared_gpu = shared_gpu || gpu[x] == gpu[y];
    return gpu[x] != gpu[y];
  });
  if (nccl.empty()) {
    t.summary += ", MPI through host memory to other processes";
    return mpi;
  }
  t.summary += shared_gpu ? ", NCCL to other processes' GPUs (MPI through host memory where they share one)"
                          : ", NCCL to other processes' GPUs";
  auto direct = std::make_unique<cuda::NcclRankComm>(
      cuda, nccl, [&](void* p, size_t n, bool mine) { ranks.share(p, n, mine, Over::kReplica); });
  return std::make_unique<RoutedComm>(std::move(mpi), std::move(direct),
                                      std::set<std::pair<int, int>>(nccl.begin(), nccl.end()));
}
#endif

TrainDevices cuda_devices(const TrainDeviceOptions& cfg, const Schedule& lowered, const std::vector<int>& rank_of,
                          const TrainRanks& ranks) {
  const int rank = ranks.rank();
  const std::vector<int> gpus = gpu_of_device(cfg, rank_of, rank, ranks.local_rank());
  TrainDevices t;
  std::vector<cuda::CudaBackend*> cuda;
  std::vector<int> used;
  const cuda::Precision precision = cfg.precision == "bf16"   ? cuda::Precision::kBf16
                                    : cfg.precision == "fp16" ? cuda::Precision::kFp16
                                                              : cuda::Precision::kFloat32;
  for (int g : gpus) {
    if (g < 0) {  // another process runs it
      cuda.push_back(nullptr);
      t.backends.push_back(nullptr);
      continue;
    }
    auto b = std::make_unique<cuda::CudaBackend>(cuda::CudaOptions{g, precision});
    cuda.push_back(b.get());
    t.backends.push_back(b.get());
    t.owned.push_back(std::move(b));
    used.push_back(g);
  }
  t.summary = "cuda: GPU";
  for (size_t i = 0; i < used.size(); ++i) {
    t.summary += i ? "," : " ";
    t.summary += std::to_string(used[i]);
  }
  if (cfg.precision != "fp32") t.summary += ", " + cfg.precision + " GEMMs";
  const std::vector<std::pair<int, int>> links = links_of(lowered, [&](int a, int b) {
    return rank_of[static_cast<size_t>(a)] == rank && rank_of[static_cast<size_t>(b)] == rank;
  });
  std::unique_ptr<Comm> local;
  if (links.empty()) {  // no message between two devices of this process
    local = std::make_unique<InProcessComm>();
  } else {
    const bool distinct = std::set<int>(used.begin(), used.end()).size() == used.size();
    const std::string why_not_nccl = distinct ? cuda::nccl_unusable(used) : "stages share a GPU";
    if (why_not_nccl.empty()) {
      local = std::make_unique<cuda::NcclComm>(cuda, links);
      t.summary += ", NCCL";
    } else {
      local = std::make_unique<cuda::PeerComm>(cuda, links);
      t.summary += ", peer copies (" + why_not_nccl + ")";
    }
  }
  if (used.size() == gpus.size()) {
    t.comm = std::move(local);
    return t;
  }
#ifdef PT_HAVE_MPI
  t.comm = across_ranks(lowered, rank_of, ranks, gpus, cuda, std::move(local), t);
  return t;
#else
  PT_CHECK(false, "devices of other processes in a build without MPI");
  return t;
#endif
}
#endif

}  // namespace

TrainDevices make_train_devices(const TrainDeviceOptions& cfg, const Schedule& lowered, const std::vector<int>& rank_of_device,
                                const TrainRanks& ranks) {
  if (cfg.kind == "cpu") return cpu_devices(cfg, lowered.stages, rank_of_device, ranks.rank());
#ifdef PT_HAVE_CUDA
  return cuda_devices(cfg, lowered, rank_of_device, ranks);
#else
  throw UserError(cfg.where, "this build has no CUDA backend",
                  "set device: cpu, or build with -DPT_CUDA=ON (needs nvcc)");
#endif
}

std::vector<GpuFree> free_gpu_memory(const TrainDeviceOptions& cfg, const std::vector<int>& rank_of_device,
                                     const TrainRanks& ranks) {
  std::vector<GpuFree> out;
#ifdef PT_HAVE_CUDA
  if (cfg.kind != "cuda") return out;
  for (int g : gpu_of_device(cfg, rank_of_device, ranks.rank(), ranks.local_rank()))
    out.push_back({g, g < 0 ? 0 : cuda::free_memory(g)});
#endif
  return out;
}

std::unique_ptr<Comm> make_host_comm(const std::vector<int>& rank_of_device, const TrainRanks& ranks) {
  if (ranks.alone()) return nullptr;
#ifdef PT_HAVE_MPI
  return std::make_unique<MpiComm>(rank_of_device, ranks.rank(), nullptr, std::vector<Backend*>{}, true);
#else
  PT_CHECK(false, "devices of other processes in a build without MPI");
  return nullptr;
#endif
}

}  // namespace pt
