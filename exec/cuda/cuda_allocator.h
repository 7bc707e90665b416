// exec/cuda/cuda_allocator.h: device memory for one GPU, and pinned host memory.
//
// CachingAllocator: blocks from cudaMalloc, kept on release and handed out again for a request
// of the same size class (a request takes the smallest cached block of at least its size and at
// most twice it), so a training loop that allocates the same buffers every step calls cudaMalloc
// only in its first. StagePrograms ask for one arena each, sized by their memory plan, so the
// planned peak of a device (arenas + constants) is what in_use shows after compiling, and
// peak_in_use is its high-water mark. Out of memory frees the cache and retries once, then is a
// UserError naming the device and the sizes. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace pt::cuda {

class CachingAllocator {
 public:
  static constexpr size_t kRound = 512;  // size classes: multiples of this

  explicit CachingAllocator(int device);
  ~CachingAllocator();  // frees every block; no block may be in use by the device then
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t bytes);  // 256-byte aligned (cudaMalloc's); nullptr for 0 bytes
  void release(void* p);         // back to the cache; nullptr is ignored
  void empty_cache();            // cudaFree every cached block

  struct Stats {
    int64_t in_use = 0;         // bytes of blocks handed out (their rounded sizes)
    int64_t peak_in_use = 0;
    int64_t reserved = 0;       // bytes obtained from cudaMalloc and not freed
    int64_t peak_reserved = 0;
    int64_t mallocs = 0;        // cudaMalloc calls
    int64_t reuses = 0;         // requests served from the cache
  };
  Stats stats() const;
  void reset_peak();            // peak_in_use = in_use

 private:
  void* malloc_or_throw(size_t bytes);

  int device_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> live_;   // block -> its size
  std::multimap<size_t, void*> cached_;      // size -> free block
  Stats stats_;
};

}  // namespace pt::cuda
