// exec/cuda/cuda_context.h: what every CUDA kernel runs with: its device, the backend's compute
// stream and library handles (all bound to that stream), the precision mode, and the table
// through which kernels report bad user data (an index out of range) found on the device.
//
// Faults: a kernel that checks user data gets a slot in mapped pinned memory; the device writes
// the offending value there and the kernel carries on without touching memory out of range.
// CudaBackend::synchronize() reads every slot after the stream has drained and throws the first
// fault as a UserError: the same message the CPU kernel throws, one synchronisation later.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace pt::cuda {

enum class Precision {
  kFloat32,  // every kernel in fp32 (cuBLAS and cuDNN with TF32 off)
  kBf16,     // GEMMs take bf16-rounded inputs with fp32 accumulation (fp32 tensors and master
             // weights; the backend rounds the operands, linalg.cc); convolutions may use tensor
             // cores (TF32); unmasked attention on cuDNN in bf16
  kFp16,     // the same with fp16 (11 significant bits, |x| <= 65504; no loss scaling)
};

// Whether GEMMs and attention may round their inputs to 16 bits (bf16 or fp16).
inline bool half_products(Precision p) { return p != Precision::kFloat32; }

// One slot, written by the device: flag != 0 when a value was out of range.
struct DeviceFault {
  int flag;
  int pad;
  long long value;  // the offending value
  long long at;     // where it was (a flat index or row)
};

class FaultTable {
 public:
  // The message for a fault: UserError's (where, what, todo) from the value and position.
  struct Message {
    std::string where;
    std::function<std::string(long long value, long long at)> what;
    std::string todo;
  };
  FaultTable() = default;
  ~FaultTable();
  FaultTable(const FaultTable&) = delete;
  FaultTable& operator=(const FaultTable&) = delete;

  // A cleared slot's device address (mapped pinned host memory; slots live as long as the table).
  DeviceFault* add(Message message);
  // Throws the first set slot's UserError (clearing every set slot); the stream must be idle.
  void throw_first();

 private:
  std::mutex mu_;
  std::vector<DeviceFault*> host_;  // one pinned allocation per slot: slots never move
  std::vector<DeviceFault*> device_;
  std::vector<Message> messages_;
};

struct CudaContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;
  cudnnHandle_t cudnn = nullptr;
  Precision precision = Precision::kFloat32;
  FaultTable* faults = nullptr;
};

// Makes `device` current for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace pt::cuda
