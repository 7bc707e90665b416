// train/cuda/gpu_comm.h: Comm (train/comm.h) between the GPUs of one process, for the executor's
// SEND and RECV actions when every device runs a CudaBackend. `data` pointers are device memory
// of the sender's and the receiver's backend.
//
//   NcclComm  ncclSend/ncclRecv, one two-rank communicator per link (ordered device pair) on
//             distinct GPUs; pipeline devices that share a GPU use the peer path.
//   PeerComm  cudaMemcpyPeerAsync on every link (the fallback where NCCL is not wanted or a link
//             joins two stages on one GPU).
//
// The contract is InProcessComm's: send() returns at once (the bytes are first copied into a
// staging buffer of the sender, and the sender's compute stream waits for that copy, so later
// kernels may overwrite `data`); recv() returns once the copy into `data` is enqueued, ordered
// before every later kernel on the receiver's compute stream. Copies run on streams of their own (one per link and side),
// tied to the compute streams by events. Messages are matched by (name, micro_batch, to) as
// InProcessComm matches them; NCCL needs the receives of a link in the order of its sends, so a
// receive that overtakes earlier messages lands those in staging buffers first. abort() makes
// every blocked and later recv() throw CommAborted (and aborts the NCCL communicators, whose
// pending operations could otherwise hang); reset() clears undelivered messages and rebuilds
// aborted communicators. Staging buffers, events and streams are made on first use of a message
// or link and kept, so from the second step on send and recv allocate nothing.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "train/comm.h"
#include "exec/cuda/cuda_backend.h"

namespace pt::cuda {

// "" when NCCL starts one communicator over these distinct GPUs (then destroyed again);
// otherwise why not, for a message. Never aborts: pick PeerComm when it says no.
std::string nccl_unusable(const std::vector<int>& gpus);

class GpuComm : public Comm {
 public:
  ~GpuComm() override;
  void send(std::string_view name, int micro_batch, int from, int to, const void* data,
            size_t bytes) override;
  void recv(std::string_view name, int micro_batch, int from, int to, void* data,
            size_t bytes) override;
  void abort() override;
  void reset() override;

 protected:
  // devices[d]: pipeline device d's backend (several may share a GPU; null for a device of
  // another process, which no link may touch). nccl: use NCCL on links
  // between distinct GPUs; links: the ordered pairs that will carry messages (empty: all).
  GpuComm(std::vector<CudaBackend*> devices, bool nccl, std::vector<std::pair<int, int>> links);

 private:
  struct Message;
  struct Link;
  using Key = std::tuple<int, int, std::string>;  // (micro_batch, to, name)

  Link& link(int from, int to);
  Message& entry(std::string_view name, int micro_batch, int to);  // caller holds mu_
  void make_links(const std::vector<std::pair<int, int>>& links);
  void destroy_nccl();
  void abort_nccl();  // caller holds mu_: aborts every live NCCL link, sets broken_
  void init_nccl(Link& l);
  void receive_into(Link& l, Message& m, void* dst);  // `to`'s thread

  std::vector<CudaBackend*> devices_;
  bool use_nccl_;
  std::map<std::pair<int, int>, std::unique_ptr<Link>> links_;
  std::mutex mu_;
  std::condition_variable arrived_;
  std::map<Key, std::unique_ptr<Message>, std::less<>> box_;
  bool aborted_ = false;
  bool broken_ = false;  // NCCL communicators aborted: rebuilt by reset()
};

class NcclComm final : public GpuComm {
 public:
  explicit NcclComm(std::vector<CudaBackend*> devices, std::vector<std::pair<int, int>> links = {})
      : GpuComm(std::move(devices), true, std::move(links)) {}
};

class PeerComm final : public GpuComm {
 public:
  explicit PeerComm(std::vector<CudaBackend*> devices, std::vector<std::pair<int, int>> links = {})
      : GpuComm(std::move(devices), false, std::move(links)) {}
};

}  // namespace pt::cuda
