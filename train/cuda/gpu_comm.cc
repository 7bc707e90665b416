#include "train/cuda/gpu_comm.h"

#include <string>

#include "core/error.h"
#include "exec/cuda/cuda_check.h"
#include "train/cuda/nccl_check.h"

namespace pt::cuda {

struct GpuComm::Message {
  bool full = false;
  int from = -1;
  size_t bytes = 0;
  bool landed = false;         // NCCL: received ahead of its turn into `landing`
  void* staging = nullptr;     // the sender's copy (on the sender's GPU)
  size_t staging_bytes = 0;
  int staging_owner = -1;      // pipeline device whose backend allocated it
  void* landing = nullptr;     // NCCL: the receiver's buffer for early arrivals
  size_t landing_bytes = 0;
  int landing_owner = -1;
  cudaEvent_t ready = nullptr;  // peer path: staging filled (sender's GPU)
  cudaEvent_t done = nullptr;   // peer path: staging read (receiver's GPU)
};

struct GpuComm::Link {
  int from = -1, to = -1;
  bool nccl = false;
  cudaStream_t send_stream = nullptr;  // on the sender's GPU
  cudaStream_t recv_stream = nullptr;  // on the receiver's GPU
  cudaEvent_t send_after = nullptr;    // the sender's compute stream reached the send
  cudaEvent_t send_copied = nullptr;   // the staging copy is done: the sender's buffer is free
  cudaEvent_t recv_after = nullptr;    // the receiver's compute stream reached the receive
  cudaEvent_t recv_done = nullptr;     // the copy into the receiver's buffer is finished
  ncclComm_t comm_send = nullptr;      // rank 0, the sender
  ncclComm_t comm_recv = nullptr;      // rank 1, the receiver
  std::deque<Message*> in_flight;      // NCCL: sent and not yet received, in send order
};

namespace {

cudaEvent_t make_event() {
  cudaEvent_t e = nullptr;
  PT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

cudaStream_t make_stream() {
  cudaStream_t s = nullptr;
  PT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

}  // namespace

std::string nccl_unusable(const std::vector<int>& gpus) {
  if (gpus.size() < 2) return "one GPU";
  std::vector<ncclComm_t> comms(gpus.size(), nullptr);
  const ncclResult_t st = ncclCommInitAll(comms.data(), static_cast<int>(gpus.size()), gpus.data());
  for (ncclComm_t c : comms)
    if (c) ncclCommDestroy(c);
  return st == ncclSuccess ? "" : std::string("NCCL does not start: ") + ncclGetErrorString(st);
}

GpuComm::GpuComm(std::vector<CudaBackend*> devices, bool nccl,
                 std::vector<std::pair<int, int>> links)
    : devices_(std::move(devices)), use_nccl_(nccl) {
  PT_CHECK(!devices_.empty(), "a GPU comm needs devices");
  if (links.empty())
    for (int a = 0; a < static_cast<int>(devices_.size()); ++a)
      for (int b = 0; b < static_cast<int>(devices_.size()); ++b)
        if (a != b) links.emplace_back(a, b);
  make_links(links);
}

void GpuComm::make_links(const std::vector<std::pair<int, int>>& links) {
  const int n = static_cast<int>(devices_.size());
  for (const auto& [from, to] : links) {
    PT_CHECK(from >= 0 && from < n && to >= 0 && to < n && from != to, "bad link");
    auto l = std::make_unique<Link>();
    l->from = from;
    l->to = to;
    {
      DeviceGuard g(devices_[from]->device());
      l->send_stream = make_stream();
      l->send_after = make_event();
      l->send_copied = make_event();
    }
    {
      DeviceGuard g(devices_[to]->device());
      l->recv_stream = make_stream();
      l->recv_after = make_event();
      l->recv_done = make_event();
    }
    l->nccl = use_nccl_ && devices_[from]->device() != devices_[to]->device();
    if (l->nccl) init_nccl(*l);
    links_[{from, to}] = std::move(l);
  }
}

void GpuComm::init_nccl(Link& l) {
  int devs[2] = {devices_[l.from]->device(), devices_[l.to]->device()};
  ncclComm_t comms[2] = {nullptr, nullptr};
  PT_NCCL_CHECK(ncclCommInitAll(comms, 2, devs));
  l.comm_send = comms[0];
  l.comm_recv = comms[1];
}

void GpuComm::destroy_nccl() {
  for (auto& [key, l] : links_) {
    if (l->comm_send) ncclCommDestroy(l->comm_send);
    if (l->comm_recv) ncclCommDestroy(l->comm_recv);
    l->comm_send = l->comm_recv = nullptr;
  }
}

GpuComm::~GpuComm() {
  for (auto& [key, l] : links_) {
    cudaStreamSynchronize(l->send_stream);
    cudaStreamSynchronize(l->recv_stream);
  }
  cudaGetLastError();
  for (auto& [key, m] : box_) {
    if (m->staging) devices_[m->staging_owner]->release(m->staging);
    if (m->landing) devices_[m->landing_owner]->release(m->landing);
    if (m->ready) cudaEventDestroy(m->ready);
    if (m->done) cudaEventDestroy(m->done);
  }
  destroy_nccl();
  for (auto& [key, l] : links_) {
    cudaEventDestroy(l->send_after);
    cudaEventDestroy(l->send_copied);
    cudaEventDestroy(l->recv_after);
    cudaEventDestroy(l->recv_done);
    cudaStreamDestroy(l->send_stream);
    cudaStreamDestroy(l->recv_stream);
  }
}

GpuComm::Link& GpuComm::link(int from, int to) {
  auto it = links_.find({from, to});
  PT_CHECK(it != links_.end(), "no link from device " + std::to_string(from) + " to device " +
                                   std::to_string(to) + " was set up");
  return *it->second;
}

GpuComm::Message& GpuComm::entry(std::string_view name, int micro_batch, int to) {
  auto it = box_.find(std::tuple<int, int, std::string_view>(micro_batch, to, name));
  if (it == box_.end())
    it = box_.emplace(Key(micro_batch, to, std::string(name)), std::make_unique<Message>()).first;
  return *it->second;
}

void GpuComm::send(std::string_view name, int micro_batch, int from, int to, const void* data,
                   size_t bytes) {
  Link& l = link(from, to);
  CudaBackend& src = *devices_[from];
  Message* m = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_ || broken_) throw CommAborted();
    m = &entry(name, micro_batch, to);
    PT_CHECK(!m->full, "message '" + std::string(name) + "' of micro-batch " +
                           std::to_string(micro_batch) + " to device " + std::to_string(to) +
                           " sent twice");
  }
  DeviceGuard guard(src.device());
  if (m->staging_bytes < bytes) {  // first use of this message (or it grew)
    PT_CUDA_CHECK(cudaStreamSynchronize(l.send_stream));
    if (m->done) PT_CUDA_CHECK(cudaEventSynchronize(m->done));
    if (m->staging) devices_[m->staging_owner]->release(m->staging);
    m->staging = src.allocate(bytes);
    m->staging_bytes = bytes;
    m->staging_owner = from;
  }
  if (!m->ready) m->ready = make_event();
  // The staging copy follows the kernels that wrote `data`, and (peer path) the previous
  // receive of this message, which read the staging buffer.
  PT_CUDA_CHECK(cudaEventRecord(l.send_after, src.stream()));
  PT_CUDA_CHECK(cudaStreamWaitEvent(l.send_stream, l.send_after, 0));
  if (!l.nccl && m->done) PT_CUDA_CHECK(cudaStreamWaitEvent(l.send_stream, m->done, 0));
  if (bytes)
    PT_CUDA_CHECK(cudaMemcpyAsync(m->staging, data, bytes, cudaMemcpyDeviceToDevice, l.send_stream));
  // Later kernels on the sender's stream may overwrite `data` once it is copied.
  PT_CUDA_CHECK(cudaEventRecord(l.send_copied, l.send_stream));
  PT_CUDA_CHECK(cudaStreamWaitEvent(src.stream(), l.send_copied, 0));
  if (l.nccl) {
    PT_NCCL_CHECK(ncclSend(m->staging, bytes, ncclChar, 1, l.comm_send, l.send_stream));
  } else {
    PT_CUDA_CHECK(cudaEventRecord(m->ready, l.send_stream));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    m->full = true;
    m->from = from;
    m->bytes = bytes;
    m->landed = false;
    if (l.nccl) l.in_flight.push_back(m);
  }
  arrived_.notify_all();
}

// NCCL: messages the sender sent on this link before `m` are received first, into their
// landing buffers; then `m` itself, straight into dst (or out of its landing buffer).
void GpuComm::receive_into(Link& l, Message& m, void* dst) {
  CudaBackend& to = *devices_[l.to];
  while (!m.landed) {
    Message* next = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      PT_CHECK(!l.in_flight.empty(), "NCCL link has no message in flight");
      next = l.in_flight.front();
      l.in_flight.pop_front();
    }
    if (next == &m) {
      PT_NCCL_CHECK(ncclRecv(dst, m.bytes, ncclChar, 0, l.comm_recv, l.recv_stream));
      return;
    }
    if (next->landing_bytes < next->bytes) {
      PT_CUDA_CHECK(cudaStreamSynchronize(l.recv_stream));
      if (next->landing) devices_[next->landing_owner]->release(next->landing);
      next->landing = to.allocate(next->bytes);
      next->landing_bytes = next->bytes;
      next->landing_owner = l.to;
    }
    PT_NCCL_CHECK(ncclRecv(next->landing, next->bytes, ncclChar, 0, l.comm_recv, l.recv_stream));
    next->landed = true;
  }
  if (m.bytes)
    PT_CUDA_CHECK(cudaMemcpyAsync(dst, m.landing, m.bytes, cudaMemcpyDeviceToDevice, l.recv_stream));
  m.landed = false;
}

void GpuComm::recv(std::string_view name, int micro_batch, int from, int to, void* data,
                   size_t bytes) {
  Link& l = link(from, to);
  CudaBackend& dst = *devices_[to];
  Message* m = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    m = &entry(name, micro_batch, to);
    arrived_.wait(lock, [&] { return m->full || aborted_; });
    if (!m->full || broken_) throw CommAborted();
    PT_CHECK(m->from == from && m->bytes == bytes,
             "message '" + std::string(name) + "' came from device " + std::to_string(m->from) +
                 " with " + std::to_string(m->bytes) + " bytes; expected device " +
                 std::to_string(from) + " and " + std::to_string(bytes));
  }
  DeviceGuard guard(dst.device());
  // The copy into `data` follows the kernels that used it before.
  PT_CUDA_CHECK(cudaEventRecord(l.recv_after, dst.stream()));
  PT_CUDA_CHECK(cudaStreamWaitEvent(l.recv_stream, l.recv_after, 0));
  if (l.nccl) {
    receive_into(l, *m, data);
  } else {
    if (!m->done) m->done = make_event();
    PT_CUDA_CHECK(cudaStreamWaitEvent(l.recv_stream, m->ready, 0));
    if (bytes)
      PT_CUDA_CHECK(cudaMemcpyPeerAsync(data, dst.device(), m->staging,
                                        devices_[from]->device(), bytes, l.recv_stream));
    PT_CUDA_CHECK(cudaEventRecord(m->done, l.recv_stream));
  }
  // Every later kernel on the receiver's compute stream sees the bytes.
  PT_CUDA_CHECK(cudaEventRecord(l.recv_done, l.recv_stream));
  PT_CUDA_CHECK(cudaStreamWaitEvent(dst.stream(), l.recv_done, 0));
  std::lock_guard<std::mutex> lock(mu_);
  m->full = false;
}

void GpuComm::abort_nccl() {
  for (auto& [key, l] : links_) {
    if (!l->nccl || !l->comm_send) continue;
    ncclCommAbort(l->comm_send);
    ncclCommAbort(l->comm_recv);
    l->comm_send = l->comm_recv = nullptr;
    broken_ = true;
  }
}

void GpuComm::abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    // A send waiting in NCCL for a receive that will never come would hang its stream.
    abort_nccl();
  }
  arrived_.notify_all();
}

void GpuComm::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  bool undelivered = false;
  for (auto& [key, l] : links_) undelivered = undelivered || (l->nccl && !l->in_flight.empty());
  if (undelivered && !broken_) abort_nccl();  // the link's NCCL order is lost: start it afresh
  for (auto& [key, l] : links_) {
    cudaStreamSynchronize(l->send_stream);
    cudaStreamSynchronize(l->recv_stream);
    l->in_flight.clear();
  }
  cudaGetLastError();  // an aborted NCCL operation may leave an error behind
  if (broken_) {
    for (auto& [key, l] : links_)
      if (l->nccl) init_nccl(*l);
    broken_ = false;
  }
  for (auto& [key, m] : box_) {
    m->full = false;
    m->landed = false;
  }
  aborted_ = false;
}

}  // namespace pt::cuda
