// exec/cuda/cuda_backend.h: the CUDA Backend (exec/backend.h) for one GPU: a compute stream,
// cuBLAS, cublasLt and cuDNN handles bound to it, a caching device allocator, device copies of
// the initializers, pinned host buffers, the optimizer's updates of those copies (update.cu), and
// the kernel registry (the CPU's op list, exec/kernel_registry.h, with the factories of
// cuda_kernels.h).
//
// Threads: kernels are made on the thread that compiles the programs (the backend makes its
// device current around every call that needs it); run() only enqueues on the stream;
// synchronize() waits for it and throws the first UserError a kernel reported from the device
// (an index or target out of range). bind_thread() makes the device current on the worker.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "exec/backend.h"
#include "exec/cuda/cuda_allocator.h"
#include "exec/cuda/cuda_context.h"
#include "exec/cuda/cuda_kernels.h"

namespace pt::cuda {

// CUDA devices this process can use; 0 when there is no device or no driver.
int device_count();
// Why there is no usable device ("no CUDA driver", ...), or "" when there is one.
std::string no_device_reason();
// Free bytes of GPU `device` now (cudaMemGetInfo): what `train` checks its plan against.
int64_t free_memory(int device);

// The registered factory for an op key ("MatMul", "pipetrain::ReluGrad"), or nullptr.
CudaFactory kernel_factory(const std::string& op_key);
// Every registered op key, in the registry's order.
std::vector<std::string> kernel_ops();

struct CudaOptions {
  int device = 0;
  Precision precision = Precision::kFloat32;
};

class CudaBackend : public Backend {
 public:
  // UserError when the device does not exist.
  explicit CudaBackend(CudaOptions options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  std::string supports(const KernelSpec& spec) const override;
  std::unique_ptr<Kernel> create_kernel(const KernelSpec& spec) const override;
  void bind_thread() override;
  void synchronize() override;

  void* allocate(size_t bytes) override;
  void release(void* p) override;
  // Uploaded on first use (synchronously), cached by the Tensor's address: the tensor must stay
  // where it is while programs use it.
  const void* device_constant(const Tensor& t) override;
  void refresh_constants() override;  // enqueued on the stream, before later kernels
  void copy(void* dst, const void* src, size_t bytes) override;  // waits for the stream first
  void fill(void* dst, unsigned char value, size_t bytes) override;
  void* allocate_host(size_t bytes) override;  // pinned (cudaHostAlloc)
  void release_host(void* p) override;
  void refresh_constant(const Tensor& t) override;  // enqueued, as refresh_constants

  // Parameter updates on the GPU (exec/cuda/update.cu), on the compute stream.
  bool updates_parameters() const override { return true; }
  void sum_squares(std::span<const float* const> x, std::span<const int64_t> n, std::span<double> out) override;
  void sgd_update(float* p, const float* g, float* b, int64_t n, const SgdScalars& s) override;
  void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) override;

  int device() const { return ctx_.device; }
  cudaStream_t stream() const { return ctx_.stream; }
  CudaContext& context() { return ctx_; }
  const CachingAllocator& allocator() const { return *allocator_; }
  int64_t constant_bytes() const;

 private:
  mutable CudaContext ctx_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<FaultTable> faults_;
  mutable std::mutex constants_mu_;
  struct Constant {
    void* device = nullptr;
    size_t bytes = 0;
  };
  std::map<const Tensor*, Constant> constants_;
  // Enqueues the copy of t's data over its device copy c (constants_mu_ held, device current).
  void reupload(const Tensor& t, const Constant& c);
};

}  // namespace pt::cuda
