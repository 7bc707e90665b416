// exec/backend.h: where kernels come from. A Backend answers, at planning time, whether it can
// run a node (with concrete types), and makes the kernel. The step loop never asks it anything.
#pragma once

#include <memory>
#include <string>

#include "exec/kernel.h"

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
  // Called by the thread about to run kernels (the CPU backend sets its thread count there).
  virtual void bind_thread() {}
  // Waits until every kernel run so far has finished.
  virtual void synchronize() {}
};

}  // namespace pt
