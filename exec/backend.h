// exec/backend.h: where kernels come from. A Backend answers, at planning time, whether it can
// run a node (with concrete types), and makes the kernel. The step loop never asks it anything.
//
// It also owns the memory its kernels compute in. The hooks below default to host memory, which
// is what the CPU backend uses; a device backend (exec/cuda) overrides them:
//   allocate/release        the arena of a StageProgram (and any other buffer kernels read)
//   device_constant         where kernels read an initializer's data: the host tensor itself by
//                           default; a device copy made once per Tensor on a device backend
//   refresh_constants       copies every constant handed out again from its host tensor (call
//                           after the optimizer updated the parameters in place)
//   copy/fill               memcpy/memset that take this backend's memory or host memory on
//                           either side
//   allocate_host/release_host  host memory for staging data to the backend (pinned on CUDA)
//   refresh_constant        refresh_constants for one tensor
// A device backend may also update the parameters where they live (updates_parameters): the
// optimizer (train/optimizer.h) then keeps its state in the backend's memory, reads the
// gradients there and writes the device copies of the parameters (device_constant) in place.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "core/error.h"
#include "core/ir.h"
#include "exec/kernel.h"
#include "exec/parameter_update.h"

namespace pt {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Empty when the backend runs this node as specified; otherwise why not, for the message.
  virtual std::string supports(const KernelSpec& spec) const = 0;
  // The kernel for the spec, or nullptr when unsupported (then supports() says why).
  virtual std::unique_ptr<Kernel> create_kernel(const KernelSpec& spec) const = 0;
  virtual CpuContext* cpu_context() { return nullptr; }
  // Whether its Conv kernels take channels-last tensors (exec/channels_last.h); programs on it
  // then keep the tensors between neighbouring convs that way.
  virtual bool channels_last_convs() const { return false; }
  // Whether its kernels may be handed an epilogue (KernelSpec::epilogue).
  virtual bool fuses_epilogues() const { return false; }
  // Called by the thread about to run kernels (the CPU backend sets its thread count there).
  virtual void bind_thread() {}
  // Waits until every kernel run so far has finished.
  virtual void synchronize() {}

  // Memory hooks (see the header comment). Host defaults; never called in a kernel's run().
  static constexpr size_t kHostAlignment = 64;
  // aligned_alloc takes a size that is a multiple of the alignment (C11 7.22.3.1): rounded up.
  virtual void* allocate(size_t bytes) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    return std::aligned_alloc(kHostAlignment, rounded);
  }
  virtual void release(void* p) { std::free(p); }
  virtual const void* device_constant(const Tensor& t) {
    t.load();  // a parameter still in its external-data file is read by the first device to use it
    return t.data.data();
  }
  virtual void refresh_constants() {}
  virtual void copy(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  virtual void fill(void* dst, unsigned char value, size_t bytes) {
    if (bytes) std::memset(dst, value, bytes);
  }
  virtual void* allocate_host(size_t bytes) { return Backend::allocate(bytes); }
  virtual void release_host(void* p) { Backend::release(p); }
  virtual void refresh_constant(const Tensor&) {}

  // Parameter updates in this backend's memory (see the header comment); the three below are
  // called only where updates_parameters() is true, on addresses in this backend's memory.
  // sum_squares returns its results; the updates are in place before any later kernel, copy or
  // sum_squares of the backend reads them.
  virtual bool updates_parameters() const { return false; }
  // out[i] = the sum of x[i][0..n[i]) squared, in double, the same bits on every run.
  virtual void sum_squares(std::span<const float* const> /*x*/, std::span<const int64_t> /*n*/,
                           std::span<double> /*out*/) {
    refuse_updates();
  }
  // One tensor of n elements by the rules of exec/parameter_update.h (b: the momentum buffer,
  // null without momentum; m, v: AdamW's moments).
  virtual void sgd_update(float* /*p*/, const float* /*g*/, float* /*b*/, int64_t /*n*/, const SgdScalars&) {
    refuse_updates();
  }
  virtual void adamw_update(float* /*p*/, const float* /*g*/, float* /*m*/, float* /*v*/, int64_t /*n*/,
                            const AdamWScalars&) {
    refuse_updates();
  }

 private:
  [[noreturn]] void refuse_updates() const {
    PT_CHECK(false, std::string(name()) + " does not update parameters");
  }
};

}  // namespace pt
