// exec/cpu/cpu_backend.h: the CPU Backend: oneDNN's CPU engine and a stream, a thread count of
// its own, and the kernel registry (the shared op list of exec/kernel_registry.h with the
// factories of cpu_kernels.h, in cpu_backend.cc).
#pragma once

#include <memory>
#include <string>

#include "exec/backend.h"

namespace pt {

// The registered factory for an op ("MatMul", "com.microsoft::Gelu"), or nullptr.
KernelFactory cpu_kernel_factory(const std::string& op_key);

class CpuBackend : public Backend {
 public:
  // kNone: every node on its own kernel, no epilogues even in inference programs (what the
  // fused programs are compared with).
  enum class Fusion { kEpilogues, kNone };
  explicit CpuBackend(int threads = 1, Fusion fusion = Fusion::kEpilogues);
  ~CpuBackend() override;
  const char* name() const override { return "cpu"; }
  std::string supports(const KernelSpec& spec) const override;
  std::unique_ptr<Kernel> create_kernel(const KernelSpec& spec) const override;
  CpuContext* cpu_context() override { return &ctx_; }
  bool channels_last_convs() const override { return true; }
  bool fuses_epilogues() const override { return fusion_ == Fusion::kEpilogues; }
  void bind_thread() override;
  void synchronize() override;
  int threads() const { return ctx_.threads; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  CpuContext ctx_;
  Fusion fusion_;
};

}  // namespace pt
