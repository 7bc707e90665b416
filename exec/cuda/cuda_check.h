// exec/cuda/cuda_check.h: library status checks for the CUDA backend. A failing CUDA, cuBLAS,
// cuDNN or NCCL call is neither the user's fault nor a broken invariant of ours: it aborts with
// the call, its file:line and the library's own name for the status (STYLE.md habit 8).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

namespace pt::cuda {

[[noreturn]] void library_failure(const char* library, const char* file, int line,
                                  const char* call, const char* status);
const char* cublas_status_name(cublasStatus_t s);

}  // namespace pt::cuda

#define PT_CUDA_CHECK(call)                                                            \
  do {                                                                                 \
    const cudaError_t pt_status_ = (call);                                             \
    if (pt_status_ != cudaSuccess)                                                     \
      ::pt::cuda::library_failure("CUDA", __FILE__, __LINE__, #call,                   \
                                  cudaGetErrorString(pt_status_));                     \
  } while (0)

#define PT_CUBLAS_CHECK(call)                                                          \
  do {                                                                                 \
    const cublasStatus_t pt_status_ = (call);                                          \
    if (pt_status_ != CUBLAS_STATUS_SUCCESS)                                           \
      ::pt::cuda::library_failure("cuBLAS", __FILE__, __LINE__, #call,                 \
                                  ::pt::cuda::cublas_status_name(pt_status_));         \
  } while (0)

#define PT_CUDNN_CHECK(call)                                                           \
  do {                                                                                 \
    const cudnnStatus_t pt_status_ = (call);                                           \
    if (pt_status_ != CUDNN_STATUS_SUCCESS)                                            \
      ::pt::cuda::library_failure("cuDNN", __FILE__, __LINE__, #call,                  \
                                  cudnnGetErrorString(pt_status_));                    \
  } while (0)

// Checks the launch of the kernel just enqueued (a bad configuration shows here; faults inside
// the kernel show at the next synchronisation).
#define PT_CUDA_LAUNCH_CHECK() PT_CUDA_CHECK(cudaGetLastError())
