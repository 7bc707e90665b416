// exec/kernel.h: what a backend's kernel is. A StageProgram creates one Kernel per node, once,
// from a KernelSpec (the node with concrete input and output types, and the data of inputs that
// are constant); the step loop then only calls run().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/ir.h"

namespace dnnl {
struct engine;
struct stream;
}  // namespace dnnl

namespace pt {

// A tensor in memory the program owns: no ownership here.
struct Buffer {
  void* data = nullptr;
  const TensorType* type = nullptr;  // nullptr for an omitted optional input or output

  bool present() const { return type != nullptr; }
  int64_t numel() const { return type->numel(); }
  template <class T>
  T* as() const { return static_cast<T*>(data); }
};

// What a CPU kernel runs with: oneDNN's engine and stream, and the thread count of the stage
// that owns it (each stage has its own, so stages sharing a machine do not fight).
struct CpuContext {
  dnnl::engine* engine = nullptr;
  dnnl::stream* stream = nullptr;
  int threads = 1;
};

struct KernelSpec {
  const Graph& graph;
  const Node& node;
  std::vector<TensorType> inputs;   // per node input; dtype kUndefined where omitted
  std::vector<TensorType> outputs;  // per node output; dtype kUndefined where omitted
  CpuContext* cpu = nullptr;
  // Per input and per output, true where the tensor is stored channels-last (exec/channels_last.h;
  // only on a backend whose channels_last_convs() says so). Empty: every one plain.
  std::vector<bool> channels_last_in = {}, channels_last_out = {};
  // True where the program's constants never change once it is built (ProgramUse::kInference):
  // a kernel may then lay out a constant input once, when it is made, instead of on every run.
  bool constants_fixed = false;
  // The lone reader of output 0 (reading it as its input 0; an Add reading it as input 1 comes
  // with its operands swapped), for the kernel to apply to that output before writing it: the
  // node then runs nothing and its output shares output 0's memory (on a backend whose
  // fuses_epilogues() says so; exec/stage_program.cc). The reader's other inputs follow the
  // node's own in run()'s inputs (an Add's bias, a Clip's bounds). A kernel that cannot apply it
  // returns nullptr, and the program makes it without one. On the CPU: Conv, MatMul and Gemm
  // apply a Relu or Clip (inference programs); MatMul an Add of a row bias, MatMul and Gemm an
  // Add of a tensor of the output's shape (any program: a weight gradient summed into its
  // accumulator).
  // The reader may read the output at another input (`through`), and may have an epilogue of its
  // own, the lone reader of its output: a chain, applied in order, each link's other inputs
  // following the previous link's (SoftmaxGrad applies an attention mask's Where and scale).
  const KernelSpec* epilogue = nullptr;
  // The other way: the producer of input 0, an element-wise node whose output only this node
  // reads, applied to the tensor it reads (its input `through`) before the kernel's own math,
  // and its own `prologue` the node before it. The node that produced input 0 then runs nothing;
  // the tensor the chain's first node reads comes in input 0's place, and each link's other
  // inputs follow the node's own and its epilogue's in run()'s inputs, the nearest link first.
  // On the CPU: Softmax applies an attention's scale and mask (exec/cpu/row_chain.h).
  const KernelSpec* prologue = nullptr;
  // In an epilogue or prologue link: the input that carries the chain's tensor.
  size_t through = 0;
  // True in training programs: an epilogue or prologue is taken only where the fused kernel
  // computes the bits the nodes compute on their own kernels, so that a cut or a recompute policy
  // that splits them changes no bit.
  bool exact_fusion = false;

  bool input_channels_last(size_t i) const { return i < channels_last_in.size() && channels_last_in[i]; }
  bool output_channels_last(size_t i) const { return i < channels_last_out.size() && channels_last_out[i]; }

  // Data of input i when it is known before running (initializer or folded constant), else
  // nullptr. Kernels read axes, shapes and pads this way.
  const Tensor* constant(size_t i) const;
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i].dtype != DType::kUndefined; }
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // inputs/outputs follow the node's order; omitted optional ones have present() == false.
  // scratch holds scratch_bytes() bytes, planned with the program's arena.
  virtual void run(std::span<const Buffer> inputs, std::span<const Buffer> outputs,
                   void* scratch) = 0;
  virtual size_t scratch_bytes() const { return 0; }
};

// Makes the kernel for a spec, or returns nullptr when the spec is outside what it handles (a
// dtype or attribute combination): the backend then reports the node as unsupported.
using KernelFactory = std::unique_ptr<Kernel> (*)(const KernelSpec&);

}  // namespace pt
