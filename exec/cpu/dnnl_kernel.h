// exec/cpu/dnnl_kernel.h: a CPU kernel made of oneDNN primitives run in order (reorders, the
// op, reorders back), with its arguments bound to the step's inputs, outputs or scratch, and the
// small factory helpers the oneDNN-backed kernels share (nn.cc forward, nn_grad.cc backward,
// linalg.cc MatMul and Gemm).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "exec/cpu/dnnl_util.h"
#include "exec/kernel.h"

namespace pt::cpu {

using dnnl::memory;

// Whether `a` and `b` put every element at the same offset: equal descs, or dense descs of the
// same dims whose strides differ only on dims of size 1 (nchw and nhwc with H = W = 1).
inline bool same_bytes(const memory::desc& a, const memory::desc& b) {
  if (a == b) return true;
  const dnnl_memory_desc_t &x = a.data, &y = b.data;
  if (x.ndims != y.ndims || x.data_type != y.data_type || x.format_kind != dnnl_blocked ||
      y.format_kind != dnnl_blocked || x.format_desc.blocking.inner_nblks != 0 ||
      y.format_desc.blocking.inner_nblks != 0 || x.offset0 != y.offset0 ||
      a.get_size() != b.get_size())
    return false;
  for (int i = 0; i < x.ndims; ++i) {
    if (x.dims[i] != y.dims[i] || x.padded_dims[i] != y.padded_dims[i]) return false;
    if (x.dims[i] != 1 && x.format_desc.blocking.strides[i] != y.format_desc.blocking.strides[i])
      return false;
  }
  return true;
}

// Where an argument's data lives while the kernel runs.
struct Place {
  enum Kind { kInput, kOutput, kScratch, kScratchpad, kHeld } kind = kInput;
  size_t at = 0;  // input or output index, byte offset into the kernel's scratch, or held copy
};

class DnnlKernel final : public Kernel {
 public:
  // threads: the count its primitives are made and run under (build_or_null's): the stage's,
  // or elementwise_threads' for an element-wise one.
  explicit DnnlKernel(CpuContext& ctx) : DnnlKernel(ctx, ctx.threads) {}
  DnnlKernel(CpuContext& ctx, int threads)
      : engine_(*ctx.engine), stream_(*ctx.stream), threads_(threads) {}

  const dnnl::engine& engine() const { return engine_; }

  // A region of `bytes` in the kernel's scratch, 64-byte aligned.
  Place reserve(size_t bytes) {
    const Place p{Place::kScratch, reserved_};
    reserved_ += round_up(bytes);
    return p;
  }

  // Appends `prim`; its user-mode scratchpad region is shared with the other steps, which run
  // one after another. args: (DNNL_ARG_*, layout, place).
  void add_step(const dnnl::primitive& prim, const memory::desc& scratchpad,
                const std::vector<std::tuple<int, memory::desc, Place>>& args) {
    Step step{prim, {}, {}, {}};
    for (const auto& [arg, md, place] : args) step.add(arg, md, place, engine_);
    if (scratchpad.get_size() > 0) {
      step.add(DNNL_ARG_SCRATCHPAD, scratchpad, {Place::kScratchpad, 0}, engine_);
      scratchpad_ = std::max(scratchpad_, scratchpad.get_size());
    }
    steps_.push_back(std::move(step));
  }

  // Data at `from` (laid out as `have`) as `want`: `from` itself when the layouts agree, else a
  // scratch copy made by a reorder step.
  Place reordered(Place from, const memory::desc& have, const memory::desc& want) {
    if (same_bytes(have, want)) return from;
    const Place to = reserve(want.get_size());
    add_reorder(from, have, to, want);
    return to;
  }

  // Input `from`, a constant fixed for the kernel's life (KernelSpec::constants_fixed) whose data
  // is `data` laid out as `have`, as `want`: the input itself when the layouts agree, else a copy
  // reordered now and held by the kernel, so no run reorders it again.
  Place held(Place from, const void* data, const memory::desc& have, const memory::desc& want) {
    if (same_bytes(have, want)) return from;
    held_.emplace_back(want.get_size() + kScratchAlign);
    dnnl::memory src(have, engine_, const_cast<void*>(data));
    dnnl::memory dst(want, engine_, aligned(held_.back().data()));
    dnnl::reorder(src, dst).execute(stream_, src, dst);
    stream_.wait();
    return {Place::kHeld, held_.size() - 1};
  }

  void add_reorder(Place from, const memory::desc& have, Place to, const memory::desc& want) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::reorder::primitive_desc pd(engine_, have, engine_, want, attr);
    add_step(dnnl::reorder(pd), pd.scratchpad_desc(),
             {{DNNL_ARG_FROM, have, from}, {DNNL_ARG_TO, want, to}});
  }

  // Host code run before the steps (e.g. Gemm's C copied into Y for the sum post-op) or after
  // them (e.g. a variance turned into InvStdDev).
  using Hook = std::function<void(std::span<const Buffer> in, std::span<const Buffer> out,
                                  std::byte* scratch)>;
  void set_prologue(Hook f) { prologue_ = std::move(f); }
  void set_epilogue(Hook f) { epilogue_ = std::move(f); }

  size_t scratch_bytes() const override {
    const size_t total = reserved_ + scratchpad_;
    return total > 0 ? total + kScratchAlign : 0;
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    std::byte* base = aligned(scratch);
    if (prologue_) prologue_(in, out, base);
    const ThreadScope threads(threads_);
    for (const Step& s : steps_) {
      for (size_t i = 0; i < s.mems.size(); ++i)
        s.mems[i].set_data_handle(address(s.places[i], in, out, base));
      const dnnl_status_t st = dnnl_primitive_execute(
          s.prim.get(), stream_.get(), static_cast<int>(s.args.size()), s.args.data());
      PT_CHECK(st == dnnl_success, "oneDNN primitive failed with status " + std::to_string(st));
    }
    if (epilogue_) epilogue_(in, out, base);
  }

 private:
  struct Step {
    dnnl::primitive prim;
    std::vector<memory> mems;
    std::vector<Place> places;
    std::vector<dnnl_exec_arg_t> args;

    void add(int arg, const memory::desc& md, Place place, const dnnl::engine& eng) {
      mems.emplace_back(md, eng, static_cast<void*>(DNNL_MEMORY_NONE));
      places.push_back(place);
      args.push_back({arg, mems.back().get()});
    }
  };

  static std::byte* aligned(void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return reinterpret_cast<std::byte*>((a + kScratchAlign - 1) / kScratchAlign * kScratchAlign);
  }

  void* address(Place p, std::span<const Buffer> in, std::span<const Buffer> out,
                std::byte* base) const {
    switch (p.kind) {
      case Place::kHeld: return aligned(const_cast<std::byte*>(held_[p.at].data()));
      case Place::kInput: return in[p.at].data;
      case Place::kOutput: return out[p.at].data;
      case Place::kScratch: return base + p.at;
      case Place::kScratchpad: return base + reserved_;
    }
    return nullptr;
  }

  const dnnl::engine& engine_;
  dnnl::stream& stream_;
  int threads_;
  std::vector<Step> steps_;
  size_t reserved_ = 0;    // bytes of scratch regions; the shared scratchpad follows them
  size_t scratchpad_ = 0;  // bytes of the largest user-mode scratchpad
  std::vector<std::vector<std::byte>> held_;  // constants laid out once (held()), over-allocated to align
  Hook prologue_, epilogue_;
};

using Args = std::vector<std::tuple<int, memory::desc, Place>>;

// Every present input and output 0 are float32.
inline bool float_only(const KernelSpec& s) {
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (s.has_input(i) && s.inputs[i].dtype != DType::kFloat32) return false;
  return s.outputs[0].dtype == DType::kFloat32;
}

// Only the first output is wanted (MaxPool's Indices omitted).
inline bool single_output(const KernelSpec& s) {
  for (size_t i = 1; i < s.outputs.size(); ++i)
    if (s.outputs[i].dtype != DType::kUndefined) return false;
  return !s.outputs.empty();
}

// build() under `threads` (0: the stage's), or nullptr where oneDNN has no implementation.
template <class Build>
std::unique_ptr<Kernel> build_or_null(const KernelSpec& s, Build build, int threads = 0) {
  const ThreadScope scope(threads > 0 ? threads : s.cpu->threads);
  try {
    return build();
  } catch (const dnnl::error&) {
    return nullptr;  // oneDNN has no implementation for this combination
  }
}

// An fp32 element-wise op as oneDNN's eltwise computes it: y = alg(x; alpha, beta).
struct EltwiseOp {
  dnnl::algorithm alg;
  float alpha = 0.f, beta = 0.f;
};

// The eltwise a kernel runs for an fp32 Relu, or a Clip whose bounds are constant (or omitted)
// with lo <= hi: the one make_relu and make_clip run (elementwise_ops.cc), so a kernel applying
// it as a post-op (KernelSpec::epilogue) writes the bits the node's own kernel would. nullopt
// for anything else.
std::optional<EltwiseOp> dnnl_activation(const KernelSpec& s);

// Appends the spec's epilogue (KernelSpec::epilogue: a Relu or Clip, dnnl_activation) to `ops`
// as an eltwise post-op; false when there is one that oneDNN's eltwise does not compute exactly
// as the node's own kernel would, or in a training program (KernelSpec::exact_fusion: the
// post-op's bits are not checked against the node's own kernel there), and the kernel then
// declines it.
inline bool append_epilogue(const KernelSpec& s, dnnl::post_ops& ops) {
  if (!s.epilogue) return true;
  if (s.exact_fusion) return false;
  const std::optional<EltwiseOp> op = dnnl_activation(*s.epilogue);
  if (op) ops.append_eltwise(1.f, op->alg, op->alpha, op->beta);
  return op.has_value();
}

// A descriptor that lets the primitive choose the layout.
inline memory::desc any_layout(const memory::dims& dims) {
  return memory::desc(dims, memory::data_type::f32, memory::format_tag::any);
}

}  // namespace pt::cpu
