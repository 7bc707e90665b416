// train/cuda/nccl_ranks.h: GPU tensors between processes over NCCL (Comm, train/comm.h), for the
// links of the pipeline that join a GPU of this rank to a GPU of another rank: one two-rank NCCL
// communicator per link, its id made by the sender's rank and handed to the receiver's through
// the caller's `share` (MPI; NCCL's own bootstrap then connects them), all of them made before
// the first step in one NCCL group.
//
// NCCL matches a link's receives with its sends in order, and a device may receive a link's
// messages in another order than its peer sent them; the receiver knows the sender's order from
// the executor's plan (Comm::plan_order), and a message received ahead of its turn lands in a
// buffer of its own until it is asked for. send() copies the bytes into a staging buffer on the
// link's stream (the sender's compute stream waits for that copy only) and enqueues ncclSend;
// recv() enqueues the receives on the link's stream, and the receiver's compute stream waits for
// them: neither blocks the host.
//
// NCCL refuses two ranks on one GPU: those links go elsewhere (train/train_devices.cc sends them
// through host memory and MPI). abort() aborts every communicator; a step after an abort is not
// possible (the job ends: an error on one rank ends every rank).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/cuda/cuda_backend.h"
#include "train/comm.h"

namespace pt::cuda {

class NcclRankComm final : public Comm {
 public:
  // devices[d]: pipeline device d's backend here, null for another rank's; links: every ordered
  // device pair between two ranks of the pipeline that NCCL carries (the same list, in the same
  // order, on every rank of the pipeline; this rank makes those with an end here);
  // share(data, bytes, mine): the bytes of the rank for which `mine` is true, on every rank of
  // the pipeline (a collective: every rank calls it alike).
  NcclRankComm(std::vector<CudaBackend*> devices, std::vector<std::pair<int, int>> links,
               const std::function<void(void*, size_t, bool)>& share);
  ~NcclRankComm() override;
  void send(std::string_view name, int micro_batch, int from, int to, const void* data,
            size_t bytes) override;
  void recv(std::string_view name, int micro_batch, int from, int to, void* data,
            size_t bytes) override;
  void abort() override;
  void reset() override;
  void plan_order(const std::vector<PlannedMessage>& sends) override;

 private:
  struct Link;
  Link& link(int from, int to);
  std::vector<CudaBackend*> devices_;
  std::map<std::pair<int, int>, std::unique_ptr<Link>> links_;
  bool aborted_ = false;
};

// A GPU's identity across hosts ("<host>/<PCI bus id>"): two pipeline devices with the same one
// share a GPU, which NCCL does not allow between ranks.
std::string gpu_identity(int gpu);

}  // namespace pt::cuda
