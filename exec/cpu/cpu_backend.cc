#include "exec/cpu/cpu_backend.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <string>

#include "core/error.h"
#include "exec/cpu/cpu_kernels.h"
#include "exec/kernel_registry.h"

namespace pt {
namespace {

// The CPU kernel registry: the shared op list (exec/kernel_registry.h) and the CPU's own, with the
// factories of cpu_kernels.h.
const KernelRegistry<KernelFactory>& registry() {
#define PT_CPU_ENTRY(key, name) {key, cpu::make_##name},
  static const KernelRegistry<KernelFactory> r({PT_KERNEL_OPS(PT_CPU_ENTRY)});
#undef PT_CPU_ENTRY
  return r;
}

// Whether the spec's kernel applies the neighbours fused into it (KernelSpec::epilogue and
// ::prologue); the other kernels would drop them. Conv, MatMul and Gemm take one epilogue reading
// their output as its input 0; Softmax and LogSoftmax a prologue chain, their gradients an
// epilogue chain (softmax.cc, which checks the links); BatchNormalization an Add and a Relu
// (nn_channel.cc, which checks them).
bool takes_links(const KernelSpec& spec) {
  const std::string& op = spec.node.op_type;
  if (spec.node.domain.empty() && (op == "Conv" || op == "MatMul" || op == "Gemm"))
    return !spec.prologue && spec.epilogue && spec.epilogue->through == 0 && !spec.epilogue->epilogue;
  if (spec.node.domain.empty() && (op == "Softmax" || op == "LogSoftmax")) return !spec.epilogue;
  if (spec.node.domain.empty() && op == "BatchNormalization") return !spec.prologue;
  if (spec.node.domain == "pipetrain" && (op == "SoftmaxGrad" || op == "LogSoftmaxGrad")) return !spec.prologue;
  return false;
}

}  // namespace

KernelFactory cpu_kernel_factory(const std::string& op_key) { return registry().find(op_key); }

struct CpuBackend::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

CpuBackend::CpuBackend(int threads, Fusion fusion) : impl_(std::make_unique<Impl>()), fusion_(fusion) {
  PT_CHECK(threads >= 1);
  ctx_.engine = &impl_->engine;
  ctx_.stream = &impl_->stream;
  ctx_.threads = threads;
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::supports(const KernelSpec& spec) const {
  const KernelFactory make = registry().find(spec.node);
  return make && make(spec) ? "" : no_kernel_reason("CPU", spec, make != nullptr);
}

std::unique_ptr<Kernel> CpuBackend::create_kernel(const KernelSpec& spec) const {
  if ((spec.epilogue || spec.prologue) && !takes_links(spec)) return nullptr;
  const KernelFactory make = registry().find(spec.node);
  return make ? make(spec) : nullptr;
}

void CpuBackend::bind_thread() { omp_set_num_threads(ctx_.threads); }

void CpuBackend::synchronize() { impl_->stream.wait(); }

}  // namespace pt
