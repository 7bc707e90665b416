#include "exec/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "exec/cuda/cuda_check.h"
#include "exec/cuda/cuda_context.h"

namespace pt::cuda {

CachingAllocator::CachingAllocator(int device) : device_(device) {}

CachingAllocator::~CachingAllocator() {
  empty_cache();
  DeviceGuard guard(device_);
  for (const auto& [p, size] : live_) cudaFree(p);
}

void* CachingAllocator::malloc_or_throw(size_t bytes) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  cudaError_t st = cudaMalloc(&p, bytes);
  if (st == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it
    for (const auto& [size, block] : cached_) {
      cudaFree(block);
      stats_.reserved -= static_cast<int64_t>(size);
    }
    cached_.clear();
    st = cudaMalloc(&p, bytes);
  }
  if (st == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw UserError("cuda device " + std::to_string(device_),
                    "out of memory allocating " + std::to_string(bytes) + " bytes with " +
                        std::to_string(stats_.in_use) + " in use",
                    "lower the micro-batch size, use more stages or recompute, or set "
                    "pipeline.memory_limit");
  }
  PT_CUDA_CHECK(st);
  ++stats_.mallocs;
  stats_.reserved += static_cast<int64_t>(bytes);
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  return p;
}

void* CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = (bytes + kRound - 1) / kRound * kRound;
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  size_t got = size;
  auto it = cached_.lower_bound(size);
  if (it != cached_.end() && it->first <= 2 * size) {
    p = it->second;
    got = it->first;
    cached_.erase(it);
    ++stats_.reuses;
  } else {
    p = malloc_or_throw(size);
  }
  live_[p] = got;
  stats_.in_use += static_cast<int64_t>(got);
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return p;
}

void CachingAllocator::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  PT_CHECK(it != live_.end(), "release of a block this allocator did not hand out");
  stats_.in_use -= static_cast<int64_t>(it->second);
  cached_.emplace(it->second, p);
  live_.erase(it);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(device_);
  for (const auto& [size, block] : cached_) {
    PT_CUDA_CHECK(cudaFree(block));
    stats_.reserved -= static_cast<int64_t>(size);
  }
  cached_.clear();
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use = stats_.in_use;
}

}  // namespace pt::cuda
