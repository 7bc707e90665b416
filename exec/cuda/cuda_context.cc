#include "exec/cuda/cuda_context.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "exec/cuda/cuda_check.h"

namespace pt::cuda {

void library_failure(const char* library, const char* file, int line, const char* call,
                     const char* status) {
  std::fprintf(stderr, "%s:%d: %s call failed: %s: %s\n", file, line, library, call, status);
  std::abort();
}

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

FaultTable::~FaultTable() {
  for (DeviceFault* h : host_) cudaFreeHost(h);
}

DeviceFault* FaultTable::add(Message message) {
  std::lock_guard<std::mutex> lock(mu_);
  void* h = nullptr;
  PT_CUDA_CHECK(cudaHostAlloc(&h, sizeof(DeviceFault), cudaHostAllocMapped | cudaHostAllocPortable));
  auto* slot = static_cast<DeviceFault*>(h);
  *slot = DeviceFault{0, 0, 0, 0};
  void* d = nullptr;
  PT_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
  host_.push_back(slot);
  device_.push_back(static_cast<DeviceFault*>(d));
  messages_.push_back(std::move(message));
  return device_.back();
}

void FaultTable::throw_first() {
  std::lock_guard<std::mutex> lock(mu_);
  int first = -1;
  for (size_t i = 0; i < host_.size(); ++i) {
    volatile DeviceFault* f = host_[i];
    if (f->flag != 0 && first < 0) first = static_cast<int>(i);
  }
  if (first < 0) return;
  const DeviceFault f = *host_[static_cast<size_t>(first)];
  for (DeviceFault* h : host_) h->flag = 0;
  const Message& m = messages_[static_cast<size_t>(first)];
  throw UserError(m.where, m.what(f.value, f.at), m.todo);
}

DeviceGuard::DeviceGuard(int device) {
  PT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) PT_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

}  // namespace pt::cuda
