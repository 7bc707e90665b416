#include "train/cuda/nccl_ranks.h"

#include <unistd.h>

#include "core/error.h"
#include "exec/cuda/cuda_check.h"
#include "exec/cuda/cuda_context.h"
#include "train/cuda/nccl_check.h"

namespace pt::cuda {

// One link, seen from this rank: its sending end or its receiving end (never both: the other
// end is another rank's).
struct NcclRankComm::Link {
  int from = -1, to = -1;
  bool sender = false;
  CudaBackend* here = nullptr;       // this end's backend
  ncclComm_t comm = nullptr;         // rank 0: the sender, rank 1: the receiver
  cudaStream_t stream = nullptr;     // on this end's GPU
  cudaEvent_t after = nullptr;       // the compute stream reached the send or receive
  cudaEvent_t done = nullptr;        // the link's copy (send) or receive is finished
  struct Buffer {
    void* p = nullptr;
    size_t bytes = 0;
    bool landed = false;  // receiving end: arrived ahead of its turn
  };
  std::map<std::pair<std::string, int>, Buffer, std::less<>> buffers;  // staging (send), landing (receive)
  std::vector<PlannedMessage> order;  // receiving end: the sender's order
  size_t next = 0;                    // receiving end: the next message NCCL will deliver

  Buffer& buffer(std::string_view name, int micro_batch, size_t bytes) {
    Buffer& b = buffers[{std::string(name), micro_batch}];
    if (b.bytes < bytes) {
      PT_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (b.p) here->release(b.p);
      b.p = here->allocate(bytes);
      b.bytes = bytes;
    }
    return b;
  }
};

std::string gpu_identity(int gpu) {
  char bus[64] = {};
  PT_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, gpu));
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "/" + bus;
}

NcclRankComm::NcclRankComm(std::vector<CudaBackend*> devices, std::vector<std::pair<int, int>> links,
                           const std::function<void(void*, size_t, bool)>& share)
    : devices_(std::move(devices)) {
  std::vector<ncclUniqueId> ids(links.size());
  for (size_t i = 0; i < links.size(); ++i) {
    const auto [from, to] = links[i];
    const bool sender = devices_[static_cast<size_t>(from)] != nullptr, receiver = devices_[static_cast<size_t>(to)] != nullptr;
    PT_CHECK(!(sender && receiver), "an NCCL link between ranks has both ends here");
    if (sender) PT_NCCL_CHECK(ncclGetUniqueId(&ids[i]));
    share(&ids[i], sizeof(ncclUniqueId), sender);
    if (!sender && !receiver) continue;  // two other ranks' link: the id was theirs to pass
    auto l = std::make_unique<Link>();
    l->from = from;
    l->to = to;
    l->sender = sender;
    l->here = devices_[static_cast<size_t>(sender ? from : to)];
    DeviceGuard g(l->here->device());
    PT_CUDA_CHECK(cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking));
    PT_CUDA_CHECK(cudaEventCreateWithFlags(&l->after, cudaEventDisableTiming));
    PT_CUDA_CHECK(cudaEventCreateWithFlags(&l->done, cudaEventDisableTiming));
    links_[{from, to}] = std::move(l);
  }
  // Every communicator at once: a rank with several links joins them in any order its peers do.
  PT_NCCL_CHECK(ncclGroupStart());
  for (size_t i = 0; i < links.size(); ++i) {
    if (!links_.count(links[i])) continue;
    Link& l = *links_[links[i]];
    DeviceGuard g(l.here->device());
    PT_NCCL_CHECK(ncclCommInitRank(&l.comm, 2, ids[i], l.sender ? 0 : 1));
  }
  PT_NCCL_CHECK(ncclGroupEnd());
}

NcclRankComm::~NcclRankComm() {
  for (auto& [key, l] : links_) {
    DeviceGuard g(l->here->device());
    if (!aborted_) cudaStreamSynchronize(l->stream);
    for (auto& [k, b] : l->buffers)
      if (b.p) l->here->release(b.p);
    if (l->comm) aborted_ ? ncclCommAbort(l->comm) : ncclCommDestroy(l->comm);
    cudaEventDestroy(l->after);
    cudaEventDestroy(l->done);
    cudaStreamDestroy(l->stream);
  }
  cudaGetLastError();
}

NcclRankComm::Link& NcclRankComm::link(int from, int to) {
  auto it = links_.find({from, to});
  PT_CHECK(it != links_.end(), "no NCCL link from device " + std::to_string(from) + " to device " + std::to_string(to));
  if (aborted_) throw CommAborted();
  return *it->second;
}

void NcclRankComm::plan_order(const std::vector<PlannedMessage>& sends) {
  for (auto& [key, l] : links_) {
    l->order.clear();
    for (const PlannedMessage& m : sends)
      if (m.from == l->from && m.to == l->to) l->order.push_back(m);
    l->next = 0;
  }
}

void NcclRankComm::send(std::string_view name, int micro_batch, int from, int to, const void* data, size_t bytes) {
  Link& l = link(from, to);
  PT_CHECK(l.sender, "a send on the receiving end of a link");
  DeviceGuard g(l.here->device());
  Link::Buffer& staging = l.buffer(name, micro_batch, bytes);
  // The copy follows the kernels that wrote `data`; later kernels may overwrite it once copied.
  PT_CUDA_CHECK(cudaEventRecord(l.after, l.here->stream()));
  PT_CUDA_CHECK(cudaStreamWaitEvent(l.stream, l.after, 0));
  if (bytes) PT_CUDA_CHECK(cudaMemcpyAsync(staging.p, data, bytes, cudaMemcpyDeviceToDevice, l.stream));
  PT_CUDA_CHECK(cudaEventRecord(l.done, l.stream));
  PT_CUDA_CHECK(cudaStreamWaitEvent(l.here->stream(), l.done, 0));
  PT_NCCL_CHECK(ncclSend(staging.p, bytes, ncclChar, 1, l.comm, l.stream));
}

void NcclRankComm::recv(std::string_view name, int micro_batch, int from, int to, void* data, size_t bytes) {
  Link& l = link(from, to);
  PT_CHECK(!l.sender, "a receive on the sending end of a link");
  DeviceGuard g(l.here->device());
  // The receive into `data` follows the kernels that used it before.
  PT_CUDA_CHECK(cudaEventRecord(l.after, l.here->stream()));
  PT_CUDA_CHECK(cudaStreamWaitEvent(l.stream, l.after, 0));
  auto early = l.buffers.find(std::make_pair(std::string(name), micro_batch));
  if (early != l.buffers.end() && early->second.landed) {
    if (bytes) PT_CUDA_CHECK(cudaMemcpyAsync(data, early->second.p, bytes, cudaMemcpyDeviceToDevice, l.stream));
    early->second.landed = false;
  } else {
    // The messages the sender sent before this one land first, in their buffers.
    for (;;) {
      PT_CHECK(l.next < l.order.size(), "message '" + std::string(name) + "' of micro-batch " + std::to_string(micro_batch) +
                                            " is not in the plan of the link from device " + std::to_string(from));
      const PlannedMessage& m = l.order[l.next++];
      if (m.name == name && m.micro_batch == micro_batch) {
        PT_CHECK(m.bytes == bytes, "message '" + m.name + "' has " + std::to_string(m.bytes) + " bytes, expected " +
                                       std::to_string(bytes));
        PT_NCCL_CHECK(ncclRecv(data, bytes, ncclChar, 0, l.comm, l.stream));
        break;
      }
      Link::Buffer& landing = l.buffer(m.name, m.micro_batch, m.bytes);
      PT_NCCL_CHECK(ncclRecv(landing.p, m.bytes, ncclChar, 0, l.comm, l.stream));
      landing.landed = true;
    }
  }
  PT_CUDA_CHECK(cudaEventRecord(l.done, l.stream));
  PT_CUDA_CHECK(cudaStreamWaitEvent(l.here->stream(), l.done, 0));
}

void NcclRankComm::abort() {
  aborted_ = true;
  for (auto& [key, l] : links_)
    if (l->comm) {
      ncclCommAbort(l->comm);
      l->comm = nullptr;
    }
}

void NcclRankComm::reset() {
  if (aborted_) return;  // the job ends (see the header)
  for (auto& [key, l] : links_) {
    DeviceGuard g(l->here->device());
    PT_CUDA_CHECK(cudaStreamSynchronize(l->stream));
    for (auto& [k, b] : l->buffers) b.landed = false;
    l->next = 0;
  }
}

}  // namespace pt::cuda
