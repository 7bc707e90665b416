// train/train_devices.h: the devices a training run puts its pipeline on. In: the device kind,
// GPUs and precision (TrainDeviceOptions: the config's `device:`, `precision:` and `threads:`),
// and the lowered schedule (its sends fix the links).
// Out: one Backend per pipeline device, and the Comm between them.
//
//   cpu   a CpuBackend per pipeline device (`threads:` each); InProcessComm.
//   cuda  a CudaBackend per pipeline device on its GPU (stage d on GPU d mod G, or as
//         `cuda:I,J,...` names them); stages sharing a GPU get a backend (stream) each.
//         NcclComm when every pipeline device has a GPU of its own and NCCL starts on them;
//         otherwise PeerComm (cudaMemcpyPeerAsync, device to device on one GPU).
//
// Across processes (mpirun): the devices of this rank only, MpiComm between ranks. A GPU tensor
// for another process goes over NCCL where the other end is another GPU (NcclRankComm), through
// host memory and MPI where both ranks use one GPU (MpiComm's staging: NCCL refuses that); between
// the GPUs of this process the GPU Comm above carries it. `device: cuda` puts this rank's k-th device on GPU
// (local_rank x its devices + k) mod G, local_rank counting the ranks of its host.
//
// A UserError naming the `device:` line when this build has no CUDA backend, when no GPU is
// found, or when a named GPU does not exist.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "train/train_ranks.h"
#include "exec/backend.h"
#include "train/comm.h"
#include "schedule/schedule.h"

namespace pt {

struct TrainDeviceOptions {
  std::string kind = "cpu";        // cpu | cuda
  std::vector<int> gpus;           // cuda: the GPU of each stage, or one for every stage; empty: d mod G
  std::string precision = "fp32";  // fp32 | bf16 (cuda: GEMM inputs rounded to bf16)
  int threads = 1;                 // per CPU device
  std::string where = "device";    // the config's line, for errors
};

struct TrainDevices {
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> backends;  // [pipeline device]
  std::unique_ptr<Comm> comm;      // declared last: goes before the backends it uses
  std::string summary;             // "cpu" or "cuda: GPUs 0,1, NCCL", for the start line

  // After the optimizer updated the parameters on the host: every device copy follows.
  void refresh_constants() {
    for (Backend* b : backends)
      if (b) b->refresh_constants();
  }
  void refresh_constant(const Tensor& t) {
    for (Backend* b : backends)
      if (b) b->refresh_constant(t);
  }
};

// here[d]: this process runs pipeline device d (train/train_ranks.h); the others get a null
// backend, and the Comm reaches them over MPI. All true: one process, as before.
TrainDevices make_train_devices(const TrainDeviceOptions& options, const Schedule& lowered, const std::vector<int>& rank_of_device,
                                const TrainRanks& ranks);

// device: cuda, before any backend is made: per pipeline device the GPU make_train_devices will
// put it on (-1: another process's) and that GPU's free memory now. Empty on the CPU and in a
// build without CUDA (make_train_devices says so).
struct GpuFree {
  int gpu = -1;
  int64_t bytes = 0;
};
std::vector<GpuFree> free_gpu_memory(const TrainDeviceOptions& options, const std::vector<int>& rank_of_device,
                                     const TrainRanks& ranks);

// A Comm for host tensors between the processes of the pipeline devices, beside the step's (the
// held-out evaluation, the trained tensors to rank 0): across processes an MpiComm on a
// communicator of its own (every rank makes it at the same point); alone, none.
std::unique_ptr<Comm> make_host_comm(const std::vector<int>& rank_of_device, const TrainRanks& ranks);

}  // namespace pt
