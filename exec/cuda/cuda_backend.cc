#include "exec/cuda/cuda_backend.h"

#include <map>
#include <string>

#include "core/error.h"
#include "exec/cuda/cuda_check.h"

namespace pt::cuda {
namespace {

// The CUDA kernel registry: (domain::)op type -> factory. One list, read top to bottom, in the
// CPU registry's order (exec/cpu/cpu_backend.cc); every key here has a CPU kernel to be tested
// against (tests/exec/cuda/).
const std::vector<std::pair<std::string, CudaFactory>>& registry_list() {
  static const std::vector<std::pair<std::string, CudaFactory>> r = {
      {"Add", make_add},
      {"Sub", make_sub},
      {"Mul", make_mul},
      {"Div", make_div},
      {"Pow", make_pow},
      {"Equal", make_equal},
      {"Where", make_where},
      {"Sqrt", make_sqrt},
      {"Neg", make_neg},
      {"Relu", make_relu},
      {"Erf", make_erf},
      {"Gelu", make_gelu},
      {"com.microsoft::Gelu", make_gelu},
      {"Tanh", make_tanh},
      {"Sigmoid", make_sigmoid},
      {"Clip", make_clip},
      {"Cast", make_cast},
      {"Dropout", make_dropout},
      {"MatMul", make_matmul},
      {"Gemm", make_gemm},
      {"Conv", make_conv},
      {"MaxPool", make_max_pool},
      {"AveragePool", make_average_pool},
      {"GlobalAveragePool", make_global_average_pool},
      {"BatchNormalization", make_batch_norm},
      {"LayerNormalization", make_layer_norm},
      {"Softmax", make_softmax},
      {"LogSoftmax", make_log_softmax},
      {"Reshape", make_reshape},
      {"Flatten", make_reshape},
      {"Squeeze", make_reshape},
      {"Unsqueeze", make_reshape},
      {"Identity", make_reshape},
      {"Transpose", make_transpose},
      {"Concat", make_concat},
      {"Split", make_split},
      {"Slice", make_slice},
      {"Gather", make_gather},
      {"Expand", make_expand},
      {"ReduceMean", make_reduce_mean},
      {"ReduceSum", make_reduce_sum},
      {"Pad", make_pad},
      // Training forward ops of the pipetrain domain (autodiff/training_mode.h).
      {"pipetrain::BatchNormTraining", make_batch_norm_training},
      {"pipetrain::SeededDropout", make_seeded_dropout},
      // Backward ops of the pipetrain domain (core/pipetrain_ops.h).
      {"pipetrain::ReluGrad", make_relu_grad},
      {"pipetrain::ClipGrad", make_clip_grad},
      {"pipetrain::ErfGrad", make_erf_grad},
      {"pipetrain::GeluGrad", make_gelu_grad},
      {"pipetrain::SoftmaxGrad", make_softmax_grad},
      {"pipetrain::LogSoftmaxGrad", make_log_softmax_grad},
      {"pipetrain::LayerNormGrad", make_layer_norm_grad},
      {"pipetrain::BatchNormGrad", make_batch_norm_grad},
      {"pipetrain::ConvGradInput", make_conv_grad_input},
      {"pipetrain::ConvGradWeight", make_conv_grad_weight},
      {"pipetrain::MaxPoolGrad", make_max_pool_grad},
      {"pipetrain::AveragePoolGrad", make_average_pool_grad},
      {"pipetrain::GatherGrad", make_gather_grad},
      {"pipetrain::SoftmaxCrossEntropy", make_softmax_cross_entropy},
      {"pipetrain::SoftmaxCrossEntropyGrad", make_softmax_cross_entropy_grad},
  };
  return r;
}

const std::map<std::string, CudaFactory>& registry() {
  static const std::map<std::string, CudaFactory> r(registry_list().begin(), registry_list().end());
  return r;
}

std::string key(const Node& n) {
  return n.domain.empty() || n.domain == "ai.onnx" ? n.op_type : n.domain + "::" + n.op_type;
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

CudaFactory kernel_factory(const std::string& op_key) {
  auto it = registry().find(op_key);
  return it == registry().end() ? nullptr : it->second;
}

std::vector<std::string> kernel_ops() {
  std::vector<std::string> ops;
  for (const auto& [k, f] : registry_list()) ops.push_back(k);
  return ops;
}

CudaBackend::CudaBackend(CudaOptions options) {
  const int n = device_count();
  if (options.device < 0 || options.device >= n)
    throw UserError("device: cuda", "CUDA device " + std::to_string(options.device) +
                                        " does not exist (" + std::to_string(n) + " found)",
                    n == 0 ? "use device: cpu, or run on a machine with a GPU"
                           : "use a device index below " + std::to_string(n));
  ctx_.device = options.device;
  ctx_.precision = options.precision;
  DeviceGuard guard(ctx_.device);
  PT_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
  PT_CUBLAS_CHECK(cublasCreate(&ctx_.cublas));
  PT_CUBLAS_CHECK(cublasSetStream(ctx_.cublas, ctx_.stream));
  // No TF32 behind our back: fp32 GEMMs stay fp32 unless Precision::kBf16 asks otherwise.
  PT_CUBLAS_CHECK(cublasSetMathMode(ctx_.cublas, CUBLAS_DEFAULT_MATH));
  PT_CUBLAS_CHECK(cublasLtCreate(&ctx_.cublas_lt));
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
  cublasLtDestroy(ctx_.cublas_lt);
  cublasDestroy(ctx_.cublas);
  cudaStreamDestroy(ctx_.stream);
}

std::string CudaBackend::supports(const KernelSpec& spec) const {
  auto it = registry().find(key(spec.node));
  if (it == registry().end()) return "the CUDA backend has no kernel for " + key(spec.node);
  if (!create_kernel(spec)) {
    std::string types;
    for (const TensorType& t : spec.inputs) types += (types.empty() ? "" : ", ") + t.str();
    return "the CUDA kernel for " + key(spec.node) + " does not take inputs (" + types +
           ") with these attributes";
  }
  return "";
}

std::unique_ptr<Kernel> CudaBackend::create_kernel(const KernelSpec& spec) const {
  auto it = registry().find(key(spec.node));
  if (it == registry().end()) return nullptr;
  DeviceGuard guard(ctx_.device);
  return it->second(spec, ctx_);
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
  for (const auto& [t, c] : constants_) {
    PT_CHECK(t->data.size() == c.bytes, "a constant changed size after it was uploaded");
    if (c.bytes)
      PT_CUDA_CHECK(cudaMemcpyAsync(c.device, t->data.data(), c.bytes, cudaMemcpyHostToDevice,
                                    ctx_.stream));
  }
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
