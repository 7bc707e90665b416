// tests/train/cuda/gpu_comm_test.cc: NcclComm and PeerComm under InProcessComm's contract
// (train/comm.h): bytes arrive intact, messages are matched by name and micro-batch whatever the
// receive order, send returns before the receive, abort wakes a blocked receive, reset starts a
// clean step, and two devices sending to each other at once do not deadlock. Two pipeline
// devices may share one GPU (the peer path); NCCL proper needs two GPUs. SKIPPED without them.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <thread>

#include "train/cuda/gpu_comm.h"

namespace pt::cuda {
namespace {

std::vector<float> iota(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// A device buffer holding v, freed with the fixture.
struct Devices {
  std::vector<std::unique_ptr<CudaBackend>> backends;
  std::vector<std::pair<CudaBackend*, void*>> buffers;

  explicit Devices(const std::vector<int>& gpus) {
    for (int g : gpus) backends.push_back(std::make_unique<CudaBackend>(CudaOptions{g}));
  }
  ~Devices() {
    for (auto& [b, p] : buffers) b->release(p);
  }
  std::vector<CudaBackend*> list() {
    std::vector<CudaBackend*> v;
    for (auto& b : backends) v.push_back(b.get());
    return v;
  }
  void* upload(int d, const std::vector<float>& v) {
    CudaBackend& b = *backends[static_cast<size_t>(d)];
    void* p = b.allocate(v.size() * sizeof(float));
    b.copy(p, v.data(), v.size() * sizeof(float));
    buffers.push_back({&b, p});
    return p;
  }
  std::vector<float> download(int d, const void* p, size_t n) {
    CudaBackend& b = *backends[static_cast<size_t>(d)];
    b.synchronize();
    std::vector<float> v(n);
    b.copy(v.data(), p, n * sizeof(float));
    return v;
  }
};

// Two messages 0 -> 1, received in the other order, over two steps (the second reuses every
// staging buffer); the sender overwrites its buffer right after sending.
void check_out_of_order(Comm& comm, Devices& d) {
  const size_t n = 1 << 16;
  for (int step = 0; step < 2; ++step) {
    const std::vector<float> a = iota(n, 1.f + step), b = iota(n, -5.f * (step + 1));
    void* src_a = d.upload(0, a);
    void* src_b = d.upload(0, b);
    void* dst_a = d.upload(1, std::vector<float>(n, 0.f));
    void* dst_b = d.upload(1, std::vector<float>(n, 0.f));
    comm.send("x", 0, 0, 1, src_a, n * sizeof(float));
    comm.send("x", 1, 0, 1, src_b, n * sizeof(float));
    d.backends[0]->fill(src_a, 0, n * sizeof(float));  // the sender may reuse its buffer
    comm.recv("x", 1, 0, 1, dst_b, n * sizeof(float));
    comm.recv("x", 0, 0, 1, dst_a, n * sizeof(float));
    EXPECT_EQ(d.download(1, dst_a, n), a) << "step " << step;
    EXPECT_EQ(d.download(1, dst_b, n), b) << "step " << step;
    comm.reset();
  }
}

// Devices 0 and 1 each send to the other, then receive, from their own threads, for several
// large messages (NCCL sends of this size wait for their receive).
void check_both_ways(Comm& comm, Devices& d) {
  const size_t n = 1 << 20;
  std::vector<void*> src(2), dst(2);
  for (int k = 0; k < 2; ++k) {
    src[k] = d.upload(k, iota(n, 100.f * k));
    dst[k] = d.upload(k, std::vector<float>(n, 0.f));
  }
  auto worker = [&](int me) {
    d.backends[static_cast<size_t>(me)]->bind_thread();
    for (int m = 0; m < 4; ++m) comm.send("g", m, me, 1 - me, src[me], n * sizeof(float));
    for (int m = 0; m < 4; ++m) comm.recv("g", m, 1 - me, me, dst[me], n * sizeof(float));
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(d.download(0, dst[0], n), iota(n, 100.f));
  EXPECT_EQ(d.download(1, dst[1], n), iota(n, 0.f));
  comm.reset();
}

void check_abort(Comm& comm, Devices& d) {
  void* dst = d.upload(1, std::vector<float>(4, 0.f));
  std::thread waiter([&] {
    d.backends[1]->bind_thread();
    EXPECT_THROW(comm.recv("never", 0, 0, 1, dst, 16), CommAborted);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  comm.abort();
  waiter.join();
  comm.reset();
  void* src = d.upload(0, {1, 2, 3, 4});
  comm.send("after", 0, 0, 1, src, 16);
  comm.recv("after", 0, 0, 1, dst, 16);
  EXPECT_EQ(d.download(1, dst, 4), (std::vector<float>{1, 2, 3, 4}));
}

#define PT_REQUIRE_GPUS(n)                                                               \
  do {                                                                                   \
    const std::string why = no_device_reason();                                          \
    if (!why.empty()) GTEST_SKIP() << why;                                               \
    if (device_count() < (n))                                                            \
      GTEST_SKIP() << "needs " << (n) << " GPUs, found " << device_count();              \
  } while (0)

// A Comm of type C between pipeline devices on `gpus`: tensors received out of order, both ways
// and, when `abort`, an abort that wakes a waiting receiver and a reset that carries again.
template <class C>
void check_comm(const std::vector<int>& gpus, bool abort) {
  Devices d(gpus);
  C comm(d.list());
  check_out_of_order(comm, d);
  check_both_ways(comm, d);
  if (abort) check_abort(comm, d);
}

TEST(PeerComm, TwoStagesOnOneGpu) {
  PT_REQUIRE_GPUS(1);
  check_comm<PeerComm>({0, 0}, true);
}

TEST(PeerComm, TwoGpus) {
  PT_REQUIRE_GPUS(2);
  check_comm<PeerComm>({0, 1}, true);
}

// Pipeline devices on one GPU: NcclComm carries them on the peer path.
TEST(NcclComm, TwoStagesOnOneGpu) {
  PT_REQUIRE_GPUS(1);
  check_comm<NcclComm>({0, 0}, false);
}

TEST(NcclComm, TwoGpus) {
  PT_REQUIRE_GPUS(2);
  check_comm<NcclComm>({0, 1}, true);
}

}  // namespace
}  // namespace pt::cuda
