#include "exec/cuda/cuda_backend.h"

#include <string>

#include "core/error.h"
#include "exec/cuda/cublas_api.h"
#include "exec/cuda/cuda_check.h"
#include "exec/cuda/launch.h"
#include "exec/kernel_registry.h"

namespace pt::cuda {
namespace {

// The CUDA kernel registry: the shared op list (exec/kernel_registry.h), the CPU registry's, with
// the factories of cuda_kernels.h; so every key here has a CPU kernel to be tested against
// (tests/exec/cuda/).
const KernelRegistry<CudaFactory>& registry() {
#define PT_CUDA_ENTRY(key, name) {key, make_##name},
  static const KernelRegistry<CudaFactory> r({PT_KERNEL_OPS(PT_CUDA_ENTRY)});
#undef PT_CUDA_ENTRY
  return r;
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device (") + cudaGetErrorString(st) + ")";
  }
  return n > 0 ? "" : "no CUDA device";
}

int64_t free_memory(int device) {
  DeviceGuard guard(device);
  size_t free = 0, total = 0;
  PT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

CudaFactory kernel_factory(const std::string& op_key) { return registry().find(op_key); }

std::vector<std::string> kernel_ops() { return registry().ops(); }

CudaBackend::CudaBackend(CudaOptions options) {
  const int n = device_count();
  if (options.device < 0 || options.device >= n)
    throw UserError("device: cuda", "CUDA device " + std::to_string(options.device) +
                                        " does not exist (" + std::to_string(n) + " found)",
                    n == 0 ? "use device: cpu, or run on a machine with a GPU"
                           : "use a device index below " + std::to_string(n));
  const CublasApi& blas = cublas_api();  // before anything is made: a missing library leaks nothing
  ctx_.device = options.device;
  ctx_.precision = options.precision;
  DeviceGuard guard(ctx_.device);
  PT_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
  PT_CUBLAS_CHECK(blas.cublasCreate(&ctx_.cublas));
  PT_CUBLAS_CHECK(blas.cublasSetStream(ctx_.cublas, ctx_.stream));
  // No TF32 behind our back: fp32 GEMMs stay fp32 (bf16 and fp16 modes hand cuBLAS 16-bit copies).
  PT_CUBLAS_CHECK(blas.cublasSetMathMode(ctx_.cublas, CUBLAS_DEFAULT_MATH));
  PT_CUBLAS_CHECK(blas.cublasLtCreate(&ctx_.cublas_lt));
  PT_CUDNN_CHECK(cudnnCreate(&ctx_.cudnn));
  PT_CUDNN_CHECK(cudnnSetStream(ctx_.cudnn, ctx_.stream));
  allocator_ = std::make_unique<CachingAllocator>(ctx_.device);
  faults_ = std::make_unique<FaultTable>();
  ctx_.faults = faults_.get();
}

CudaBackend::~CudaBackend() {
  DeviceGuard guard(ctx_.device);
  cudaStreamSynchronize(ctx_.stream);
  for (auto& [t, c] : constants_) allocator_->release(c.device);
  allocator_.reset();
  cudnnDestroy(ctx_.cudnn);
  cublas_api().cublasLtDestroy(ctx_.cublas_lt);
  cublas_api().cublasDestroy(ctx_.cublas);
  cudaStreamDestroy(ctx_.stream);
}

std::string CudaBackend::supports(const KernelSpec& spec) const {
  const bool registered = registry().find(spec.node) != nullptr;
  return registered && create_kernel(spec) ? "" : no_kernel_reason("CUDA", spec, registered);
}

std::unique_ptr<Kernel> CudaBackend::create_kernel(const KernelSpec& spec) const {
  const CudaFactory make = registry().find(spec.node);
  if (!make) return nullptr;
  DeviceGuard guard(ctx_.device);
  return make(spec, ctx_);
}

void CudaBackend::bind_thread() { PT_CUDA_CHECK(cudaSetDevice(ctx_.device)); }

void CudaBackend::synchronize() {
  DeviceGuard guard(ctx_.device);
  PT_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  faults_->throw_first();
}

void* CudaBackend::allocate(size_t bytes) { return allocator_->allocate(bytes); }

void CudaBackend::release(void* p) {
  if (!p) return;
  // A block may still be read by work in flight: the stream drains before it can be reused.
  DeviceGuard guard(ctx_.device);
  PT_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  allocator_->release(p);
}

const void* CudaBackend::device_constant(const Tensor& t) {
  t.load();  // a parameter still in its external-data file: read once, on the host, then uploaded
  std::lock_guard<std::mutex> lock(constants_mu_);
  Constant& c = constants_[&t];
  if (c.device && c.bytes == t.data.size()) return c.device;
  DeviceGuard guard(ctx_.device);
  if (c.device) allocator_->release(c.device);
  c.bytes = t.data.size();
  c.device = allocator_->allocate(std::max<size_t>(c.bytes, 1));
  if (c.bytes)
    PT_CUDA_CHECK(cudaMemcpyAsync(c.device, t.data.data(), c.bytes, cudaMemcpyHostToDevice,
                                  ctx_.stream));
  PT_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  return c.device;
}

void CudaBackend::refresh_constants() {
  std::lock_guard<std::mutex> lock(constants_mu_);
  DeviceGuard guard(ctx_.device);
  for (const auto& [t, c] : constants_) reupload(*t, c);
}

void CudaBackend::refresh_constant(const Tensor& t) {
  std::lock_guard<std::mutex> lock(constants_mu_);
  auto it = constants_.find(&t);
  if (it == constants_.end()) return;
  DeviceGuard guard(ctx_.device);
  reupload(t, it->second);
}

void CudaBackend::reupload(const Tensor& t, const Constant& c) {
  PT_CHECK(t.data.size() == c.bytes, "a constant changed size after it was uploaded");
  if (c.bytes)
    PT_CUDA_CHECK(cudaMemcpyAsync(c.device, t.data.data(), c.bytes, cudaMemcpyHostToDevice, ctx_.stream));
}

void CudaBackend::sum_squares(std::span<const float* const> x, std::span<const int64_t> n,
                              std::span<double> out) {
  PT_CHECK(x.size() == n.size() && n.size() == out.size(), "one count and one result per tensor");
  if (x.empty()) return;
  DeviceGuard guard(ctx_.device);
  int64_t blocks = 0;
  for (int64_t k : n) blocks += squares_blocks(k);
  // One scratch block: the partials of every tensor, then the totals.
  const size_t bytes = static_cast<size_t>(blocks + static_cast<int64_t>(out.size())) * sizeof(double);
  auto* scratch = static_cast<double*>(allocator_->allocate(bytes));
  double* totals = scratch + blocks;
  double* partial = scratch;
  for (size_t i = 0; i < x.size(); ++i) {
    launch_sum_squares(x[i], n[i], partial, totals + i, ctx_.stream);
    partial += squares_blocks(n[i]);
  }
  PT_CUDA_CHECK(cudaMemcpyAsync(out.data(), totals, out.size() * sizeof(double), cudaMemcpyDeviceToHost,
                                ctx_.stream));
  PT_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  allocator_->release(scratch);
}

void CudaBackend::sgd_update(float* p, const float* g, float* b, int64_t n, const SgdScalars& s) {
  DeviceGuard guard(ctx_.device);
  launch_sgd_update(p, g, b, n, s, ctx_.stream);
}

void CudaBackend::adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                               const AdamWScalars& s) {
  DeviceGuard guard(ctx_.device);
  launch_adamw_update(p, g, m, v, n, s, ctx_.stream);
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  DeviceGuard guard(ctx_.device);
  PT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx_.stream));
  PT_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

void CudaBackend::fill(void* dst, unsigned char value, size_t bytes) {
  if (!bytes) return;
  DeviceGuard guard(ctx_.device);
  cudaPointerAttributes attr{};
  PT_CUDA_CHECK(cudaPointerGetAttributes(&attr, dst));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    PT_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    std::memset(dst, value, bytes);
    return;
  }
  PT_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, ctx_.stream));
  PT_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

void* CudaBackend::allocate_host(size_t bytes) {
  DeviceGuard guard(ctx_.device);
  void* p = nullptr;
  PT_CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable));
  return p;
}

void CudaBackend::release_host(void* p) {
  if (p) PT_CUDA_CHECK(cudaFreeHost(p));
}

int64_t CudaBackend::constant_bytes() const {
  std::lock_guard<std::mutex> lock(constants_mu_);
  int64_t total = 0;
  for (const auto& [t, c] : constants_)
    total += static_cast<int64_t>((std::max<size_t>(c.bytes, 1) + CachingAllocator::kRound - 1) /
                                  CachingAllocator::kRound * CachingAllocator::kRound);
  return total;
}

}  // namespace pt::cuda
