#include "cli/train_devices.h"

#include <set>
#include <utility>

#include "core/error.h"
#include "exec/cpu/cpu_backend.h"
#ifdef PT_HAVE_MPI
#include "exec/mpi_comm.h"
#endif
#ifdef PT_HAVE_CUDA
#include "exec/cuda/cuda_backend.h"
#include "exec/cuda/gpu_comm.h"
#endif

namespace pt {
namespace {

TrainDevices cpu_devices(const TrainConfig& cfg, int stages, const std::vector<int>& rank_of, int rank) {
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
// The GPU of each pipeline device (cli/config.h), checked against the GPUs found.
std::vector<int> gpu_of_device(const TrainConfig& cfg, int stages) {
  const int found = cuda::device_count();
  if (found == 0)
    throw UserError(cfg.where("device"), "no GPU was found (" + cuda::no_device_reason() + ")",
                    "set device: cpu, or run on a machine with a GPU");
  std::vector<int> gpus;
  for (int d = 0; d < stages; ++d) {
    const int g = cfg.gpus.empty() ? d % found : cfg.gpus[cfg.gpus.size() == 1 ? 0 : static_cast<size_t>(d)];
    if (g >= found)
      throw UserError(cfg.where("device"), "GPU " + std::to_string(g) + " does not exist (" +
                                               std::to_string(found) + " found)",
                      "name GPUs 0 to " + std::to_string(found - 1));
    gpus.push_back(g);
  }
  return gpus;
}

// The ordered device pairs the schedule sends over.
std::vector<std::pair<int, int>> links_of(const Schedule& s) {
  std::set<std::pair<int, int>> links;
  for (const auto& list : s.devices)
    for (const Action& a : list) {
      if (a.op == Op::kSendF) links.insert({s.device_of(a.chunk), s.device_of(a.chunk + 1)});
      if (a.op == Op::kSendB) links.insert({s.device_of(a.chunk), s.device_of(a.chunk - 1)});
    }
  return {links.begin(), links.end()};
}

TrainDevices cuda_devices(const TrainConfig& cfg, const Schedule& lowered) {
  const std::vector<int> gpus = gpu_of_device(cfg, lowered.stages);
  TrainDevices t;
  std::vector<cuda::CudaBackend*> cuda;
  const cuda::Precision precision = cfg.precision == "bf16" ? cuda::Precision::kBf16 : cuda::Precision::kFloat32;
  for (int g : gpus) {
    auto b = std::make_unique<cuda::CudaBackend>(cuda::CudaOptions{g, precision});
    cuda.push_back(b.get());
    t.backends.push_back(b.get());
    t.owned.push_back(std::move(b));
  }
  t.summary = "cuda: GPU";
  for (size_t d = 0; d < gpus.size(); ++d) t.summary += (d ? "," : " ") + std::to_string(gpus[d]);
  if (cfg.precision == "bf16") t.summary += ", bf16 GEMMs";
  const std::vector<std::pair<int, int>> links = links_of(lowered);
  if (links.empty()) {  // one pipeline device: nothing is ever sent
    t.comm = std::make_unique<cuda::PeerComm>(cuda, links);
    return t;
  }
  const bool distinct = std::set<int>(gpus.begin(), gpus.end()).size() == gpus.size();
  const std::string why_not_nccl = distinct ? cuda::nccl_unusable(gpus) : "stages share a GPU";
  if (why_not_nccl.empty()) {
    t.comm = std::make_unique<cuda::NcclComm>(cuda, links);
    t.summary += ", NCCL";
  } else {
    t.comm = std::make_unique<cuda::PeerComm>(cuda, links);
    t.summary += ", peer copies (" + why_not_nccl + ")";
  }
  return t;
}
#endif

}  // namespace

TrainDevices make_train_devices(const TrainConfig& cfg, const Schedule& lowered, const std::vector<int>& rank_of_device,
                                int rank) {
  if (cfg.device == "cpu") return cpu_devices(cfg, lowered.stages, rank_of_device, rank);
  for (int r : rank_of_device)
    if (r != rank)
      throw UserError(cfg.where("device"), "runs on one process only so far (GPU tensors between processes need NCCL across ranks)",
                      "set device: cpu for a run across processes, or start one process");
#ifdef PT_HAVE_CUDA
  return cuda_devices(cfg, lowered);
#else
  throw UserError(cfg.where("device"), "this build has no CUDA backend",
                  "set device: cpu, or build with -DPT_CUDA=ON (needs nvcc)");
#endif
}

}  // namespace pt
