// exec/cpu/nn_grad.cc: the backward half of the window ops, pipetrain-domain ops
// (core/pipetrain_ops.h): ConvGradInput and ConvGradWeight on oneDNN's convolution backward
// primitives, AveragePoolGrad on pooling_v2 backward, MaxPoolGrad as a loop (oneDNN's needs the
// forward's workspace, which the forward kernel does not keep). The depthwise convolutions' own
// loops are in depthwise.cc, LayerNormGrad and BatchNormGrad in nn_grad_norm.cc. Everything is
// fixed when the kernel is made; run() binds and executes.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "exec/cpu/conv_geometry.h"
#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/depthwise.h"
#include "exec/cpu/dnnl_kernel.h"
#include "exec/cpu/dnnl_util.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"
#include "exec/cpu/vector_clones.h"
#include "exec/window.h"

namespace pt::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Conv gradients

// One convolution backward primitive (Prim: convolution_backward_data or _weights), both of
// whose descs take (X, W, dY) layouts in that order. dY (input 0) and the other operand (input 1,
// bound as in_arg, plain dims `in`) are reordered into the primitive's layouts where those differ
// from the plain ones; the result (out_arg, plain dims `out`) is reordered out to output 0.
template <class Prim>
std::unique_ptr<Kernel> build_conv_backward(const KernelSpec& s, const ConvGeometry& g, int in_arg,
                                            const Dims& in, int out_arg, const Dims& out) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const Window& w = g.window;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const typename Prim::primitive_desc pd(
      {dnnl::algorithm::convolution_direct, conv_layout(g, g.x), conv_layout(g, g.w_grouped),
       conv_layout(g, g.y), w.strides, w.dilation, w.pad_l, w.pad_r},
      attr, k->engine(), conv_hint(g, k->engine()));
  const auto chosen = [&](int arg) { return pd.query_md(dnnl::query::exec_arg_md, arg); };
  const memory::desc out_md = plain_desc(DType::kFloat32, out);
  const Place dyp = k->reordered({Place::kInput, 0}, plain_desc(DType::kFloat32, g.y),
                                 chosen(DNNL_ARG_DIFF_DST));
  const Place inp =
      k->reordered({Place::kInput, 1}, plain_desc(DType::kFloat32, in), chosen(in_arg));
  const bool out_plain = same_bytes(chosen(out_arg), out_md);
  const Place outp = out_plain ? Place{Place::kOutput, 0} : k->reserve(chosen(out_arg).get_size());
  k->add_step(Prim(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_DIFF_DST, chosen(DNNL_ARG_DIFF_DST), dyp},
               {in_arg, chosen(in_arg), inp},
               {out_arg, chosen(out_arg), outp}});
  if (!out_plain) k->add_reorder(outp, chosen(out_arg), {Place::kOutput, 0}, out_md);
  return k;
}

// (dY, other) -> one float32 output whose shape is the attribute `shape_attr`.
bool two_to_one_float(const KernelSpec& s, const char* shape_attr) {
  return s.inputs.size() == 2 && s.has_input(0) && s.has_input(1) && single_output(s) &&
         float_only(s) && s.outputs[0].shape == s.node.attr_ints(shape_attr);
}

// ---------------------------------------------------------------------------------------------
// Pooling gradients


// dX = AveragePoolGrad(dY) on pooling_v2 backward, plain layouts (as the forward kernel runs).
std::unique_ptr<Kernel> build_average_pool_grad(const KernelSpec& s, dnnl::algorithm alg,
                                                const Window& w) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const memory::desc dx_md = plain_desc(s.outputs[0]), dy_md = plain_desc(s.inputs[0]);
  const dnnl::pooling_v2_forward::primitive_desc hint(
      {dnnl::prop_kind::forward_training, alg, dx_md, dy_md, w.strides, w.kernel, w.dilation,
       w.pad_l, w.pad_r},
      k->engine());
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::pooling_v2_backward::primitive_desc pd(
      {alg, dx_md, dy_md, w.strides, w.kernel, w.dilation, w.pad_l, w.pad_r}, attr, k->engine(),
      hint);
  k->add_step(dnnl::pooling_v2_backward(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_DIFF_DST, dy_md, {Place::kInput, 0}},
               {DNNL_ARG_DIFF_SRC, dx_md, {Place::kOutput, 0}}});
  return k;
}

// MaxPoolGrad: per (n, c) plane, each dY element is added to the first maximum of its window in
// row-major order (depth, height, width); padding never wins. Spatial dims are padded to three
// with size-1 dims in front. Planes run in parallel, each written by one thread.
class MaxPoolGrad final : public Kernel {
 public:
  MaxPoolGrad(int64_t planes, std::array<PoolDim, 3> dims, int threads)
      : planes_(planes), d_(std::move(dims)), threads_(threads) {}

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const int64_t in_size = d_[0].in * d_[1].in * d_[2].in;
    const int64_t out_size = d_[0].out * d_[1].out * d_[2].out;
    const float* dy = in[0].as<const float>();
    const float* x = in[1].as<const float>();
    float* dx = out[0].as<float>();
    const bool parallel = planes_ > 1 && planes_ * (in_size + out_size) >= (1 << 15);
    parallel_for(planes_, threads_, parallel,
                 [&](int64_t p) { plane(dy + p * out_size, x + p * in_size, dx + p * in_size, in_size); });
  }

 private:
  void plane(const float* dy, const float* x, float* dx, int64_t in_size) const {
    std::fill(dx, dx + in_size, 0.f);
    int64_t o = 0;
    for (int64_t od = 0; od < d_[0].out; ++od)
      for (int64_t oh = 0; oh < d_[1].out; ++oh)
        for (int64_t ow = 0; ow < d_[2].out; ++ow, ++o) {
          const int64_t at = first_max(x, od, oh, ow);
          if (at >= 0) dx[at] += dy[o];
        }
  }

  // Offset of the first maximum of the window at (od, oh, ow), or -1 when it holds no input.
  // The running maximum starts at the window's first cell and moves only on a strictly greater
  // value, by selects rather than branches (random data mispredicts every other compare).
  int64_t first_max(const float* x, int64_t od, int64_t oh, int64_t ow) const {
    const PoolDim &pd = d_[0], &ph = d_[1], &pw = d_[2];
    if (pd.lo[od] >= pd.hi[od] || ph.lo[oh] >= ph.hi[oh] || pw.lo[ow] >= pw.hi[ow]) return -1;
    const auto cell = [&](int64_t kd, int64_t kh) {
      const int64_t id = pd.start[od] + kd * pd.dilation, ih = ph.start[oh] + kh * ph.dilation;
      return (id * ph.in + ih) * pw.in + pw.start[ow];
    };
    int64_t best_at = cell(pd.lo[od], ph.lo[oh]) + pw.lo[ow] * pw.dilation;
    float best = x[best_at];
    for (int64_t kd = pd.lo[od]; kd < pd.hi[od]; ++kd)
      for (int64_t kh = ph.lo[oh]; kh < ph.hi[oh]; ++kh) {
        const int64_t row = cell(kd, kh);
        for (int64_t kw = pw.lo[ow]; kw < pw.hi[ow]; ++kw) {
          const int64_t at = row + kw * pw.dilation;
          const bool greater = x[at] > best;
          best = greater ? x[at] : best;
          best_at = greater ? at : best_at;
        }
      }
    return best_at;
  }

  int64_t planes_;
  std::array<PoolDim, 3> d_;
  int threads_;
};

// t[p * ld + c] = planes[c * size + p] for `channels` planes of `size` pixels: pixel-major, the
// channels of a pixel contiguous (rows of ld floats).
void transpose_planes(const float* planes, int64_t size, int64_t channels, int64_t ld, float* t) {
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t p = 0; p < size; ++p) t[p * ld + c] = planes[c * size + p];
}

// dW = ConvGradWeight(dY, X) of a pointwise Conv (1x1 kernel, stride 1, no padding, group 1) on
// planes of at most kSmallPlane pixels (dnnl_util.h; MobileNetV2's late 1x1 convolutions on 4x4 to
// 1x1 maps) and at least kLongRow input channels: dW[m, c] = sum over n, then pixels p, of
// dY[n, m, p] * X[n, c, p]. oneDNN's plain GEMM path took 20-50 us a call for 0.1-1.6 MFLOP
// (2-30 GFLOP/s). Here per image X[n] is transposed into scratch (HW x C) and each dY value scales
// a row of it into dW's row: the inner loop runs along C, contiguous. One thread; images in
// order, so the bits do not depend on it. On fewer input channels a row is too short for the loop
// (8 channels: 12 us a call against 2.5 on oneDNN's blocked kernel, which such planes take).
constexpr int64_t kLongRow = 32;

// dW += dY[n] X[n]^T for one image: dw[m, :] += dy[m, p] * xt[p, :] for m, then p, in order.
// One function per ISA for the whole image: the call per row through target_clones' resolver cost
// more than a row of 24 (MobileNetV2's 24 -> 144 expansion on 2x2 maps: 4,608 rows, 9.8 us).
PT_VECTOR_CLONES void add_image_products(const float* dy, const float* xt, float* dw, int64_t m, int64_t c,
                                         int64_t hw) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t p = 0; p < hw; ++p) {
      const float a = dy[r * hw + p];
      const float* x = xt + p * c;
      float* y = dw + r * c;
      for (int64_t i = 0; i < c; ++i) y[i] += a * x[i];
    }
}

class PointwiseConvGradWeight final : public Kernel {
 public:
  PointwiseConvGradWeight(int64_t batch, int64_t m, int64_t c, int64_t hw)
      : batch_(batch), m_(m), c_(c), hw_(hw) {}

  size_t scratch_bytes() const override { return static_cast<size_t>(hw_ * c_) * sizeof(float); }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float* dy = in[0].as<const float>();  // (N, M, HW)
    const float* x = in[1].as<const float>();   // (N, C, HW)
    float* dw = out[0].as<float>();              // (M, C)
    auto* xt = static_cast<float*>(scratch);     // (HW, C): X[n] transposed
    std::fill(dw, dw + m_ * c_, 0.f);
    for (int64_t n = 0; n < batch_; ++n) {
      transpose_planes(x + n * c_ * hw_, hw_, c_, c_, xt);
      add_image_products(dy + n * m_ * hw_, xt, dw, m_, c_, hw_);
    }
  }

 private:
  int64_t batch_, m_, c_, hw_;
};

// dW = ConvGradWeight(dY, X) of a pointwise Conv (1x1 kernel, stride 1, no padding, group 1) on
// plain layouts (planes of more than kSmallPlane pixels) with fewer input channels than 16:
// dW[m, c] = sum over n, then pixels p, of dY[n, m, p] * X[n, c, p], each a dot product along the
// contiguous plane. oneDNN runs it as a GEMM per image (x64:gemm:jit) whose product has C columns:
// MobileNetV2's 8 -> 48 expansion, 8 images of 16x16, 29 us a call (54 GFLOP/s), 10 us on 8x8
// (`train --profile`, one thread, AMD EPYC Zen 5). Here a block of MB output rows by CB input
// channels is MB x CB sums of 16 lanes each, over every image and the plane's whole vectors in
// order, then folded by halves (fold_sum) and the plane's last pixels added one by one, each a
// fused multiply-add as the lanes' are (std::fma: the compiler contracted some copies' and not
// others'): the same order whatever the blocks and the copy, one thread, so the same bits.
class PointwiseLanesGradWeight final : public Kernel {
 public:
  PointwiseLanesGradWeight(int64_t batch, int64_t m, int64_t c, int64_t hw)
      : batch_(batch), m_(m), c_(c), hw_(hw), isa_(vector_isa()) {}

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void*) override {
    const float* dy = in[0].as<const float>();  // (N, M, HW)
    const float* x = in[1].as<const float>();   // (N, C, HW)
    float* dw = out[0].as<float>();              // (M, C)
    on_vector_isa(isa_, [&](auto on) __attribute__((always_inline)) {
      using L = typename decltype(on)::Lanes;
      // 16 sums of 16 lanes and 8 operands in AVX-512's 32 registers; 4 sums on the narrower
      // copies, whose 16 lanes take two or four registers.
      constexpr int B = std::is_same_v<L, Vec16> ? 4 : 2;
      int64_t m = 0;
      for (; m + B <= m_; m += B) rows<B, B, L>(dy, x, dw, m);
      for (; m < m_; ++m) rows<1, B, L>(dy, x, dw, m);
    });
  }

 private:
  // dW's rows [m0, m0 + MB), every column, CB columns at a time.
  template <int MB, int CB, class L>
  [[gnu::always_inline]] inline void rows(const float* dy, const float* x, float* dw, int64_t m0) const {
    int64_t c = 0;
    for (; c + CB <= c_; c += CB) block<MB, CB, L>(dy, x, dw, m0, c);
    for (; c < c_; ++c) block<MB, 1, L>(dy, x, dw, m0, c);
  }

  template <int MB, int CB, class L>
  [[gnu::always_inline]] inline void block(const float* dy, const float* x, float* dw, int64_t m0, int64_t c0) const {
    L acc[MB][CB], a[MB], b[CB];
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < CB; ++j) splat16(acc[i][j], 0.f);
    const int64_t body = hw_ / kLanes * kLanes;
    for (int64_t n = 0; n < batch_; ++n) {
      const float* dyn = dy + (n * m_ + m0) * hw_;
      const float* xn = x + (n * c_ + c0) * hw_;
      for (int64_t p = 0; p < body; p += kLanes) {
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i) load16(a[i], dyn + i * hw_ + p);
#pragma GCC unroll 4
        for (int j = 0; j < CB; ++j) load16(b[j], xn + j * hw_ + p);
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
          for (int j = 0; j < CB; ++j) acc[i][j] += a[i] * b[j];
      }
    }
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < CB; ++j) {
        float sum = fold_sum(acc[i][j]);
        for (int64_t n = 0; n < batch_; ++n)
          for (int64_t p = body; p < hw_; ++p)
            sum = std::fma(dy[(n * m_ + m0 + i) * hw_ + p], x[(n * c_ + c0 + j) * hw_ + p], sum);
        dw[(m0 + i) * c_ + c0 + j] = sum;
      }
  }

  int64_t batch_, m_, c_, hw_;
  VectorIsa isa_;
};

// dW = ConvGradWeight(dY, X) of a pointwise Conv on maps of at most kSmallPointwiseMap pixels
// with fewer input channels than kLongRow (MobileNetV2's 16 -> 96 and 24 -> 144 expansions on 2x2
// maps): dW[m, c] = sum over n, then pixels p, of dY[n, m, p] * X[n, c, p]. oneDNN's blocked 1x1
// kernel, with dY and X reordered into 16-channel blocks and dW out of them, took 3.1 and 5.6 us a
// call there (8 images), now 1.7 and 4.3 (`train --profile`, one stage, four runs each way). Here
// 16 output channels a vector: per image the block's dY planes are transposed into scratch
// (pixel-major), and each X value scales a pixel's 16 dY values into its input channel's 16 sums
// (dW's column c for the block's rows), kColumnsAtOnce channels side by side. Each sum runs
// in that order whatever the block and thread: the bits do not depend on the thread count; the
// AVX-512 and AVX2 copies fuse each product into its sum, the baseline's rounds them apart.
constexpr int64_t kSmallPointwiseMap = 4;
constexpr int kColumnsAtOnce = 4;

class PointwiseSmallMapsGradWeight final : public Kernel {
 public:
  PointwiseSmallMapsGradWeight(int64_t batch, int64_t m, int64_t c, int64_t hw, int threads)
      : batch_(batch), m_(m), c_(c), hw_(hw), threads_(std::max(threads, 1)), isa_(vector_isa()),
        blocks_((m + kLanes - 1) / kLanes),
        parallel_(blocks_ > 1 && threads_ > 1 && batch * m * c * hw >= (1 << 15)) {}

  // Per thread: a block's sums (C x 16) and its dY planes transposed (HW x 16).
  size_t scratch_bytes() const override {
    return static_cast<size_t>((parallel_ ? threads_ : 1) * per_thread()) * sizeof(float);
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float* dy = in[0].as<const float>();  // (N, M, HW)
    const float* x = in[1].as<const float>();   // (N, C, HW)
    float* dw = out[0].as<float>();              // (M, C)
    parallel_for(blocks_, threads_, parallel_, [&](int64_t b) {
      float* mine = static_cast<float*>(scratch) + (parallel_ ? omp_get_thread_num() : 0) * per_thread();
      block(dy, x, b * kLanes, std::min<int64_t>(kLanes, m_ - b * kLanes), mine, dw);
    });
  }

 private:
  int64_t per_thread() const { return (c_ + hw_) * kLanes; }

  // Input channels [c0, c0 + R) of one image xn: sums[c] += dyt[p] * xn[c, p] for p in order, the R
  // channels' sums independent chains side by side (one at a time, each waited on the last FMA).
  template <int R, class L>
  [[gnu::always_inline]] inline void columns(const float* xn, const float* dyt, int64_t c0, float* sums) const {
    L sum[R], d, v;
    for (int j = 0; j < R; ++j) load16(sum[j], sums + (c0 + j) * kLanes);
    for (int64_t p = 0; p < hw_; ++p) {
      load16(d, dyt + p * kLanes);
      for (int j = 0; j < R; ++j) {
        splat16(v, xn[(c0 + j) * hw_ + p]);
        sum[j] += d * v;
      }
    }
    for (int j = 0; j < R; ++j) store16(sums + (c0 + j) * kLanes, sum[j]);
  }

  // dW's rows [m0, m0 + w), w <= 16, with `mine`: this thread's scratch.
  void block(const float* dy, const float* x, int64_t m0, int64_t w, float* mine, float* dw) const {
    float* dyt = mine + c_ * kLanes;
    std::fill(mine, mine + per_thread(), 0.f);  // lanes past w stay 0
    on_vector_isa(isa_, [&](auto on) __attribute__((always_inline)) {
      using L = typename decltype(on)::Lanes;
      for (int64_t n = 0; n < batch_; ++n) {
        transpose_block<L>(dy + (n * m_ + m0) * hw_, hw_, w, dyt);
        const float* xn = x + n * c_ * hw_;
        int64_t c = 0;
        for (; c + kColumnsAtOnce <= c_; c += kColumnsAtOnce) columns<kColumnsAtOnce, L>(xn, dyt, c, mine);
        for (; c < c_; ++c) columns<1, L>(xn, dyt, c, mine);
      }
    });
    for (int64_t l = 0; l < w; ++l)
      for (int64_t c = 0; c < c_; ++c) dw[(m0 + l) * c_ + c] = mine[c * kLanes + l];
  }

  int64_t batch_, m_, c_, hw_;
  int threads_;
  VectorIsa isa_;
  int64_t blocks_;  // of 16 output channels, one thread each
  bool parallel_;
};

// The direct pointwise kernel for g: by rows of transposed X on a small plane with long rows, by
// output channels 16 at a time on maps of at most 4 pixels with shorter rows, by lanes along a
// larger plane with fewer channels than the lanes; else nullptr (oneDNN's).
std::unique_ptr<Kernel> make_pointwise_grad_weight(const ConvGeometry& g, int threads) {
  if (!g.pointwise) return nullptr;
  const Window& w = g.window;
  if (!all_are(w.strides, 1) || !all_are(w.pad_l, 0) || !all_are(w.pad_r, 0) || !all_are(w.dilation, 0)) return nullptr;
  if (g.y[1] != g.w[0] || g.x[1] != g.w[1]) return nullptr;
  const int64_t hw = product(g.x, 2, g.x.size());
  // The planes conv_layout gives oneDNN's blocked kernels: the same bound.
  if (pointwise_on_plain_layouts(g.x))
    return g.x[1] < kLanes ? std::make_unique<PointwiseLanesGradWeight>(g.x[0], g.w[0], g.w[1], hw) : nullptr;
  if (g.x[1] < kLongRow)
    return hw <= kSmallPointwiseMap
               ? std::make_unique<PointwiseSmallMapsGradWeight>(g.x[0], g.w[0], g.w[1], hw, threads)
               : nullptr;
  return std::make_unique<PointwiseConvGradWeight>(g.x[0], g.w[0], g.w[1], hw);
}

// dX = ConvGradInput(dY, W) of a pointwise Conv without pads whose X and Y hold one pixel per
// image: the product dY (N, M) W (M, C) on oneDNN's matmul primitive, the plain layouts being
// those matrices. oneDNN's backward-data convolution runs it as a product per image, reading all
// of W once per image (MobileNetV2's last conv, 8 x 1280 -> 80 at 1x1, one thread: 33-58 us in
// training against 9). The forward's Conv takes the same path (build_pixel_product, nn.cc).
std::unique_ptr<Kernel> build_pixel_grad_input(const KernelSpec& s, const ConvGeometry& g) {
  if (!g.pointwise || product(g.x, 2, g.x.size()) != 1 || product(g.y, 2, g.y.size()) != 1 ||
      !all_are(g.window.pad_l, 0) || !all_are(g.window.pad_r, 0))
    return nullptr;
  const int64_t n = g.x[0], c = g.x[1], m = g.y[1];
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const memory::desc dy = plain_desc(DType::kFloat32, {n, m}), w = plain_desc(DType::kFloat32, {m, c}),
                     dx = plain_desc(DType::kFloat32, {n, c});
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(dy, w, dx), attr, k->engine());
  if (implementation_is(pd, "ref")) return nullptr;  // else the convolution's kernels
  k->add_step(dnnl::matmul(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_SRC, dy, {Place::kInput, 0}},
               {DNNL_ARG_WEIGHTS, w, {Place::kInput, 1}},
               {DNNL_ARG_DST, dx, {Place::kOutput, 0}}});
  return k;
}

}  // namespace

// ConvGradInput(dY, W) -> dX, attributes of Conv plus input_shape (X's shape).
std::unique_ptr<Kernel> make_conv_grad_input(const KernelSpec& s) {
  if (!two_to_one_float(s, "input_shape")) return nullptr;
  const auto g = conv_geometry(s.node, s.outputs[0].shape, s.inputs[1].shape, s.inputs[0].shape);
  if (!g) return nullptr;
  if (std::unique_ptr<Kernel> k = build_or_null(s, [&] { return build_pixel_grad_input(s, *g); })) return k;
  if (std::unique_ptr<Kernel> k = build_or_null(s, [&] { return make_depthwise_grad_input(s, *g); })) return k;
  // dX = ConvGradInput(dY, W): backward data, W bound as the weights.
  return build_or_null(s, [&] {
    return build_conv_backward<dnnl::convolution_backward_data>(
        s, *g, DNNL_ARG_WEIGHTS, g->w_grouped, DNNL_ARG_DIFF_SRC, g->x);
  });
}

// ConvGradWeight(dY, X) -> dW, attributes of Conv plus weight_shape (W's shape).
std::unique_ptr<Kernel> make_conv_grad_weight(const KernelSpec& s) {
  if (!two_to_one_float(s, "weight_shape")) return nullptr;
  const auto g = conv_geometry(s.node, s.inputs[1].shape, s.outputs[0].shape, s.inputs[0].shape);
  if (!g) return nullptr;
  // dW = ConvGradWeight(dY, X): backward weights, X bound as the src (no bias gradient:
  // autodiff reduces dY for that).
  return build_or_null(s, [&] {
    if (auto direct = make_depthwise_grad_weight(s, *g)) return direct;
    if (auto direct = make_pointwise_grad_weight(*g, s.cpu->threads)) return direct;
    return build_conv_backward<dnnl::convolution_backward_weights>(
        s, *g, DNNL_ARG_SRC, g->x, DNNL_ARG_DIFF_WEIGHTS, g->w_grouped);
  });
}

// AveragePoolGrad(dY) -> dX, attributes of AveragePool plus input_shape. As in the forward
// kernel, count_include_pad with cells that ceil_mode adds is declined (ONNX does not count
// those cells, oneDNN would).
std::unique_ptr<Kernel> make_average_pool_grad(const KernelSpec& s) {
  if (s.inputs.size() != 1 || !s.has_input(0) || !single_output(s) || !float_only(s) ||
      s.outputs[0].shape != s.node.attr_ints("input_shape"))
    return nullptr;
  const auto w = pool_grad_window(s, s.outputs[0].shape);
  const bool include = s.node.attr_int("count_include_pad", 0) != 0;
  if (!w || (include && w->ceil_padded)) return nullptr;
  return build_or_null(s, [&] {
    return build_average_pool_grad(s,
                                   include ? dnnl::algorithm::pooling_avg_include_padding
                                           : dnnl::algorithm::pooling_avg_exclude_padding,
                                   *w);
  });
}

// MaxPoolGrad(dY, X) -> dX, attributes of MaxPool.
std::unique_ptr<Kernel> make_max_pool_grad(const KernelSpec& s) {
  if (s.inputs.size() != 2 || !s.has_input(0) || !s.has_input(1) || !single_output(s) ||
      !float_only(s))
    return nullptr;
  const Dims& x = s.inputs[1].shape;
  const auto w = pool_grad_window(s, x);
  if (!w) return nullptr;
  const size_t r = x.size() - 2, lead = 3 - r;
  std::array<PoolDim, 3> dims;
  for (size_t i = 0; i < r; ++i)
    dims[lead + i] = PoolDim(x[i + 2], s.inputs[0].shape[i + 2], w->kernel[i], w->strides[i],
                             w->dilation[i] + 1, w->pad_l[i]);
  return std::make_unique<MaxPoolGrad>(x[0] * x[1], std::move(dims), s.cpu->threads);
}

}  // namespace pt::cpu
