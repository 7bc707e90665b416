// exec/cuda/conv.cc: Conv, ConvGradInput and ConvGradWeight on cuDNN's convolution (legacy
// API: cudnnConvolutionForward / BackwardData / BackwardFilter). The geometry is ONNX's,
// resolved as the CPU kernels resolve it (conv_window, exec/window.h); cuDNN wants at least two spatial
// dims (a 1-D conv gets a leading one of size 1) and symmetric pads, so asymmetric pads are
// split into a symmetric part for cuDNN and an explicit zero padding of X in scratch (for
// ConvGradInput: dX of the padded X in scratch, cropped into dX). Algorithms come from cuDNN's
// heuristics when the kernel is made: deterministic ones only, in fp32 mode FMA math only (no
// TF32); the workspace is the kernel's scratch.
#include <algorithm>
#include <optional>

#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cudnn_util.h"
#include "exec/cuda/plan.h"
#include "exec/window.h"

namespace pt::cuda {
namespace {

constexpr size_t kMaxWorkspace = size_t{512} << 20;

struct ConvPlan {
  IntDims x, w, y;  // cuDNN's dims; x is the padded X when pre_pad
  IntDims pads, strides, dilations;
  int groups = 1;
  bool pre_pad = false;
  PadPlan pad;       // X -> padded X
  StridedCopy crop;  // padded dX -> dX
  size_t padded_bytes = 0;
};

bool to_int(int64_t v, int* out) {
  if (v < 0 || v > (int64_t{1} << 31) - 1) return false;
  *out = static_cast<int>(v);
  return true;
}

// Conv's shape rules and window (conv_window, exec/window.h; `grad`: the gradient ops' rules) in
// cuDNN's terms.
std::optional<ConvPlan> plan_conv(const Node& n, const Dims& x, const Dims& w, const Dims& y,
                                  bool grad) {
  const auto win = conv_window(n, x, w, y, grad);
  if (!win) return std::nullopt;

  ConvPlan p;
  p.groups = static_cast<int>(n.attr_int("group", 1));
  const size_t r = x.size() - 2;
  const size_t lead = r == 1 ? 1 : 0;  // a 1-D conv as 2-D with height 1
  Dims xp = x;                          // X padded where pads are asymmetric
  Dims begin(x.size(), 0);
  for (size_t i = 0; i < r; ++i) {
    const int64_t sym = std::min(win->pad_l[i], win->pad_r[i]);
    begin[i + 2] = win->pad_l[i] - sym;
    xp[i + 2] += win->pad_l[i] + win->pad_r[i] - 2 * sym;
    p.pre_pad = p.pre_pad || xp[i + 2] != x[i + 2];
    int v;
    if (!to_int(sym, &v)) return std::nullopt;
    p.pads.push_back(v);
    if (!to_int(win->strides[i], &v)) return std::nullopt;
    p.strides.push_back(v);
    if (!to_int(win->dilation[i] + 1, &v)) return std::nullopt;
    p.dilations.push_back(v);
  }
  if (lead) {
    p.pads.insert(p.pads.begin(), 0);
    p.strides.insert(p.strides.begin(), 1);
    p.dilations.insert(p.dilations.begin(), 1);
  }
  auto dims = [&](const Dims& d, IntDims* out) {
    for (size_t i = 0; i < d.size(); ++i) {
      if (i == 2 && lead) out->push_back(1);
      int v;
      if (!to_int(d[i], &v)) return false;
      out->push_back(v);
    }
    return true;
  };
  if (!dims(xp, &p.x) || !dims(w, &p.w) || !dims(y, &p.y)) return std::nullopt;
  if (p.pre_pad) {
    p.pad.rank = static_cast<int>(x.size());
    p.pad.numel = product(xp, 0, xp.size());
    p.pad.esize = 4;
    for (size_t d = 0; d < x.size(); ++d) {
      p.pad.in_dims[d] = x[d];
      p.pad.out_dims[d] = xp[d];
      p.pad.begin[d] = begin[d];
    }
    int64_t offset = 0;
    const Dims xp_strides = strides_of(xp);
    for (size_t d = 0; d < x.size(); ++d) offset += begin[d] * xp_strides[d];
    const auto crop = make_strided_copy({x, xp_strides, strides_of(x), offset, 0}, 4);
    if (!crop) return std::nullopt;
    p.crop = *crop;
    p.padded_bytes = static_cast<size_t>(p.pad.numel) * sizeof(float);
  }
  return p;
}

// The first algorithm of cuDNN's heuristic list that runs, is deterministic and fits
// kMaxWorkspace, preferring (in fp32 mode: requiring first) FMA math, so that no TF32 tensor-core
// path is taken; in bf16 mode its math type is set on the descriptor. Perf: one of cuDNN's
// *AlgoPerf_t; get(max, returned, results) calls the matching Get*Algorithm_v7.
template <class Perf, class Get>
std::optional<Perf> choose(const CudaContext& ctx, ConvDesc& conv, Get get) {
  Perf perf[16];
  int returned = 0;
  PT_CUDNN_CHECK(get(16, &returned, perf));
  const bool fp32 = ctx.precision == Precision::kFloat32;
  for (int pass = 0; pass < 2; ++pass)
    for (int i = 0; i < returned; ++i) {
      const Perf& p = perf[i];
      if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC ||
          !math_allowed(ctx, p.mathType) || p.memory > kMaxWorkspace)
        continue;
      if (fp32 && pass == 0 && p.mathType != CUDNN_FMA_MATH) continue;
      if (!fp32) conv.set_math(p.mathType);  // fp32 keeps CUDNN_FMA_MATH on the descriptor
      return p;
    }
  return std::nullopt;
}

// What the three convolution kernels share: the plan, cuDNN's descriptors of X (padded when
// pre_pad), Y (dY) and W and of the convolution, and the algorithm of the kernel's direction
// (Perf: cuDNN's *AlgoPerf_t for it) with the scratch it takes: the padded X (or dX) when
// pre_pad, then the algorithm's workspace.
template <class Perf>
class ConvKernel : public Kernel {
 public:
  bool ok() const { return ok_; }
  size_t scratch_bytes() const override { return layout_.bytes(); }

 protected:
  ConvKernel(const CudaContext& ctx, const ConvPlan& p)
      : ctx_(ctx), p_(p), x_(p.x), y_(p.y), w_(p.w),
        conv_(p.pads, p.strides, p.dilations, p.groups, conv_math(ctx)) {}

  // Chooses the algorithm (get: as choose() takes it) and lays the scratch out; ok() after.
  template <class Get>
  void choose_algorithm(Get get) {
    const auto perf = choose<Perf>(ctx_, conv_, get);
    if (!perf) return;
    algo_ = perf->algo;
    if (p_.pre_pad) padded_ = layout_.reserve(p_.padded_bytes);
    workspace_bytes_ = perf->memory;
    workspace_ = layout_.reserve(perf->memory);
    ok_ = true;
  }

  // X (input `k`), padded into scratch first when pre_pad.
  const void* padded_x(std::span<const Buffer> in, size_t k, std::byte* base) const {
    if (!p_.pre_pad) return in[k].data;
    launch_pad(p_.pad, in[k].data, nullptr, 0, base + padded_, ctx_.stream);
    return base + padded_;
  }

  const CudaContext& ctx_;
  ConvPlan p_;
  TensorDesc x_, y_;
  FilterDesc w_;
  ConvDesc conv_;
  decltype(Perf::algo) algo_{};
  ScratchLayout layout_;
  size_t padded_ = 0, workspace_ = 0, workspace_bytes_ = 0;
  bool ok_ = false;
};

// Y = conv(X, W) (+ B): inputs X, W, B?; output Y.
class ConvForward final : public ConvKernel<cudnnConvolutionFwdAlgoPerf_t> {
 public:
  ConvForward(const CudaContext& ctx, const ConvPlan& p, bool bias) : ConvKernel(ctx, p) {
    if (bias) {
      IntDims b(p.y.size(), 1);  // (1, M, 1, ...): added to every output position
      b[1] = p.y[1];
      b_.emplace(b);
    }
    choose_algorithm([&](int max, int* n, auto* r) {
      return cudnnGetConvolutionForwardAlgorithm_v7(ctx.cudnn, x_.get(), w_.get(), conv_.get(),
                                                    y_.get(), max, n, r);
    });
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    std::byte* base = ScratchLayout::base(scratch);
    const void* x = padded_x(in, 0, base);
    const float one = 1.f, zero = 0.f;
    PT_CUDNN_CHECK(cudnnConvolutionForward(ctx_.cudnn, &one, x_.get(), x, w_.get(), in[1].data,
                                           conv_.get(), algo_, base + workspace_,
                                           workspace_bytes_, &zero, y_.get(), out[0].data));
    if (b_)
      PT_CUDNN_CHECK(cudnnAddTensor(ctx_.cudnn, &one, b_->get(), in[2].data, &one, y_.get(),
                                    out[0].data));
  }

 private:
  std::optional<TensorDesc> b_;
};

// dX = ConvGradInput(dY, W): backward data, into the padded X's shape in scratch when pre_pad,
// then cropped.
class ConvGradInput final : public ConvKernel<cudnnConvolutionBwdDataAlgoPerf_t> {
 public:
  ConvGradInput(const CudaContext& ctx, const ConvPlan& p) : ConvKernel(ctx, p) {
    choose_algorithm([&](int max, int* n, auto* r) {
      return cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx.cudnn, w_.get(), y_.get(), conv_.get(),
                                                         x_.get(), max, n, r);
    });
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    std::byte* base = ScratchLayout::base(scratch);
    void* dx = p_.pre_pad ? static_cast<void*>(base + padded_) : out[0].data;
    const float one = 1.f, zero = 0.f;
    PT_CUDNN_CHECK(cudnnConvolutionBackwardData(ctx_.cudnn, &one, w_.get(), in[1].data, y_.get(),
                                                in[0].data, conv_.get(), algo_, base + workspace_,
                                                workspace_bytes_, &zero, x_.get(), dx));
    if (p_.pre_pad) launch_strided_copy(p_.crop, dx, out[0].data, ctx_.stream);
  }
};

// dW = ConvGradWeight(dY, X): backward filter from X (padded into scratch when pre_pad).
class ConvGradWeight final : public ConvKernel<cudnnConvolutionBwdFilterAlgoPerf_t> {
 public:
  ConvGradWeight(const CudaContext& ctx, const ConvPlan& p) : ConvKernel(ctx, p) {
    choose_algorithm([&](int max, int* n, auto* r) {
      return cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx.cudnn, x_.get(), y_.get(),
                                                           conv_.get(), w_.get(), max, n, r);
    });
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    std::byte* base = ScratchLayout::base(scratch);
    const void* x = padded_x(in, 1, base);
    const float one = 1.f, zero = 0.f;
    PT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx_.cudnn, &one, x_.get(), x, y_.get(),
                                                  in[0].data, conv_.get(), algo_,
                                                  base + workspace_, workspace_bytes_, &zero,
                                                  w_.get(), out[0].data));
  }
};

template <class K>
std::unique_ptr<Kernel> if_ok(std::unique_ptr<K> k) {
  if (!k->ok()) return nullptr;
  return k;
}

// (dY, other) -> one float32 output whose shape is the attribute `shape_attr`.
bool two_to_one_float(const KernelSpec& s, const char* shape_attr) {
  return s.inputs.size() == 2 && has_io(s, 2) && s.outputs.size() == 1 && float_io(s) &&
         s.outputs[0].shape == s.node.attr_ints(shape_attr);
}

}  // namespace

std::unique_ptr<Kernel> make_conv(const KernelSpec& s, CudaContext& ctx) {
  if (s.inputs.size() < 2 || s.inputs.size() > 3 || !has_io(s, 2) || s.outputs.size() != 1 ||
      !float_io(s))
    return nullptr;
  const auto p = plan_conv(s.node, s.inputs[0].shape, s.inputs[1].shape, s.outputs[0].shape, false);
  if (!p) return nullptr;
  const bool bias = s.has_input(2);
  if (bias && s.inputs[2].shape != Dims{s.inputs[1].shape[0]}) return nullptr;
  return if_ok(std::make_unique<ConvForward>(ctx, *p, bias));
}

// ConvGradInput(dY, W) -> dX, Conv's attributes plus input_shape.
std::unique_ptr<Kernel> make_conv_grad_input(const KernelSpec& s, CudaContext& ctx) {
  if (!two_to_one_float(s, "input_shape")) return nullptr;
  const auto p = plan_conv(s.node, s.outputs[0].shape, s.inputs[1].shape, s.inputs[0].shape, true);
  if (!p) return nullptr;
  return if_ok(std::make_unique<ConvGradInput>(ctx, *p));
}

// ConvGradWeight(dY, X) -> dW, Conv's attributes plus weight_shape.
std::unique_ptr<Kernel> make_conv_grad_weight(const KernelSpec& s, CudaContext& ctx) {
  if (!two_to_one_float(s, "weight_shape")) return nullptr;
  const auto p = plan_conv(s.node, s.inputs[1].shape, s.outputs[0].shape, s.inputs[0].shape, true);
  if (!p) return nullptr;
  return if_ok(std::make_unique<ConvGradWeight>(ctx, *p));
}

}  // namespace pt::cuda
