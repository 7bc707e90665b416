// exec/cpu/nn_grad.cc: the backward half of the window ops, pipetrain-domain ops
// (core/pipetrain_ops.h): ConvGradInput and ConvGradWeight on oneDNN's convolution backward
// primitives, AveragePoolGrad on pooling_v2 backward, MaxPoolGrad as a loop (oneDNN's needs the
// forward's workspace, which the forward kernel does not keep). LayerNormGrad and BatchNormGrad
// are in nn_grad_norm.cc. Everything is fixed when the kernel is made; run() binds and executes.
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

#include "exec/cpu/cpu_kernels.h"
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

// The forward Conv's geometry, read from a gradient node: X: (N, C, in...), W: (M, C/group,
// k...), Y = dY: (N, M, out...), with 1 to 3 spatial dims.
struct ConvGeometry {
  Window window;
  int64_t group = 1;
  Dims x, w, y;
  Dims w_grouped;  // W as oneDNN takes it: (group, M/group, C/group, k...) when grouped
  bool pointwise = false;  // ungrouped 1x1 (plain layouts but on small planes: conv_layout)
  bool depthwise = false;  // one group per channel, one output channel each: W (C, 1, k...)
};

// One group per channel, one output channel each: W (C, 1, k...).
bool is_depthwise(int64_t group, const Dims& x, const Dims& w) {
  return group > 1 && group == x[1] && w[0] == x[1] && w[1] == 1;
}

// Conv's shape rules as its gradients take them (conv_window, exec/window.h); nullopt when they
// do not hold.
std::optional<ConvGeometry> conv_geometry(const Node& n, const Dims& x, const Dims& w,
                                          const Dims& y) {
  const auto window = conv_window(n, x, w, y, true);
  if (!window) return std::nullopt;
  ConvGeometry g{*window, n.attr_int("group", 1), x, w, y, w, false, false};
  const Dims kernel(w.begin() + 2, w.end());
  if (g.group > 1) {
    g.w_grouped[0] /= g.group;
    g.w_grouped.insert(g.w_grouped.begin(), g.group);
  }
  g.pointwise = g.group == 1 && all_are(kernel, 1);
  g.depthwise = is_depthwise(g.group, x, w);
  return g;
}

// A 2-D window of stride 1, undilated: the geometry of the depthwise plane loops (DepthwisePlanes).
bool unit_plane_window(const Window& w, const Dims& x) {
  return x.size() == 4 && all_are(w.strides, 1) && all_are(w.dilation, 0);
}

// The layout a conv primitive is asked for: plain for a pointwise conv but on small planes
// (pointwise_on_plain_layouts, dnnl_util.h), else its choice.
memory::desc conv_layout(const ConvGeometry& g, const Dims& dims) {
  const bool plain = g.pointwise && pointwise_on_plain_layouts(g.x);
  return plain ? plain_desc(DType::kFloat32, dims) : any_layout(dims);
}

// The forward primitive_desc oneDNN takes as the hint for a backward one.
dnnl::convolution_forward::primitive_desc conv_hint(const ConvGeometry& g,
                                                    const dnnl::engine& engine) {
  const Window& w = g.window;
  return dnnl::convolution_forward::primitive_desc(
      {dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
       conv_layout(g, g.x), conv_layout(g, g.w_grouped), conv_layout(g, g.y), w.strides,
       w.dilation, w.pad_l, w.pad_r},
      engine);
}

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

// One spatial dim of a window op, resolved per output position o: its window's first input
// index start[o] (negative in the leading padding), and the kernel taps [lo[o], hi[o]) that fall
// inside the input. The default is a size-1 dim with a 1-tap kernel.
struct PoolDim {
  int64_t in = 1, out = 1, dilation = 1;
  std::vector<int64_t> start{0}, lo{0}, hi{1};

  PoolDim() = default;
  PoolDim(int64_t in_size, int64_t out_size, int64_t kernel, int64_t stride, int64_t dil,
          int64_t pad)
      : in(in_size), out(out_size), dilation(dil), start(out_size), lo(out_size), hi(out_size) {
    for (int64_t o = 0; o < out; ++o) {
      const int64_t s = o * stride - pad;
      start[o] = s;
      lo[o] = s >= 0 ? 0 : (-s + dil - 1) / dil;
      hi[o] = in > s ? std::min(kernel, (in - s + dil - 1) / dil) : 0;
    }
  }
};

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

// A depthwise conv's window over one plane of X (N, C, in...) to one of Y (N, C, out...), W (C, 1,
// k...), 1 to 3 spatial dims: every (output pixel, tap, input pixel) it multiplies, outputs in
// row-major order and each's taps in row-major order, taps in the padding left out.
struct DepthwiseWindow {
  int64_t in_size = 1, out_size = 1, taps = 1;
  std::vector<std::array<int32_t, 3>> triples;  // (output, tap, input)
};

DepthwiseWindow depthwise_window(const Dims& x, const Dims& y, const Dims& w, const Window& window) {
  const size_t r = x.size() - 2, lead = 3 - r;
  std::array<PoolDim, 3> d;
  std::array<int64_t, 3> k{1, 1, 1};
  for (size_t i = 0; i < r; ++i) {
    k[lead + i] = w[i + 2];
    d[lead + i] =
        PoolDim(x[i + 2], y[i + 2], w[i + 2], window.strides[i], window.dilation[i] + 1, window.pad_l[i]);
  }
  DepthwiseWindow out{d[0].in * d[1].in * d[2].in, d[0].out * d[1].out * d[2].out, k[0] * k[1] * k[2], {}};
  int32_t o = 0;
  for (int64_t od = 0; od < d[0].out; ++od)
    for (int64_t oh = 0; oh < d[1].out; ++oh)
      for (int64_t ow = 0; ow < d[2].out; ++ow, ++o)
        for (int64_t kd = d[0].lo[od]; kd < d[0].hi[od]; ++kd)
          for (int64_t kh = d[1].lo[oh]; kh < d[1].hi[oh]; ++kh)
            for (int64_t kw = d[2].lo[ow]; kw < d[2].hi[ow]; ++kw) {
              const int64_t id = d[0].start[od] + kd * d[0].dilation, ih = d[1].start[oh] + kh * d[1].dilation,
                            iw = d[2].start[ow] + kw * d[2].dilation;
              out.triples.push_back({o, static_cast<int32_t>((kd * k[1] + kh) * k[2] + kw),
                                     static_cast<int32_t>((id * d[1].in + ih) * d[2].in + iw)});
            }
  return out;
}

// dW = ConvGradWeight(dY, X) of a depthwise Conv (group = C = M: W is (C, 1, k...)), where
// oneDNN has no JIT kernel for it (its jit_dw takes no plane smaller than the kernel, as
// MobileNetV2's 3x3 convolutions on 2x2 and 1x1 maps): it falls back to one small GEMM per
// channel, 0.25 ms for 240 channels of 8 x 1 x 1 pixels, 100x its work. Here per channel c and
// tap t: dW[c, 0, t] = sum over n, then the tap's (output, input) pixel pairs in row-major output
// order, of dY[n, c, o] * X[n, c, i]; the pairs of each tap (taps in the padding have none) are
// listed once, when the kernel is made.
//
// The channels go 16 at a time, a vector's lanes: per image the block's dY and X planes are
// transposed into scratch, pixel-major with the block's 16 channels contiguous (2x2 planes by
// shuffles on AVX-512), and each pair adds its products into the tap's 16 sums at once, held in a
// register through the tap's pairs. With the channels' loop compiled for the baseline (4 lanes,
// the sums in memory, scalar transposes) 8 images of 96 channels of 2x2 took 4.3 us, of 144 6.3,
// 144 of 2x2 to 1x1 at stride 2 3.5 and 240 of 1x1 4.1; now 1.9, 2.8, 1.5 and 2.0 (one thread,
// the median of 15 x 100 runs). Each channel's sum runs in the order above whatever the block and
// thread, so the bits do not depend on the thread count; the AVX-512 and AVX2 copies fuse each
// product into its sum, the baseline's rounds them apart.

// t[p * 16 + l] = planes[l * size + p] for l < channels (at most 16) planes of `size` pixels: a
// pixel's 16 values at a time for a whole block (a copy for planes of one pixel).
template <class L>
[[gnu::always_inline]] inline void transpose_block(const float* planes, int64_t size, int64_t channels, float* t) {
  if constexpr (std::is_same_v<L, Vec16>) {
    if (channels == kLanes && size == 4) {  // 2x2 maps: 16 x 4 in two rounds of 4 two-vector shuffles
      Vec16 v[4], w[4];
      for (int k = 0; k < 4; ++k) load16(v[k], planes + k * kLanes);
      for (int k = 0; k < 2; ++k) {
        const Vec16 &a = v[2 * k], &b = v[2 * k + 1];  // channels 8k to 8k + 7
        w[2 * k] = __builtin_shufflevector(a, b, 0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
        w[2 * k + 1] = __builtin_shufflevector(a, b, 2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
      }
      for (int k = 0; k < 2; ++k) {
        const Vec16 &a = w[k], &b = w[k + 2];  // pixels 2k and 2k + 1
        store16(t + 2 * k * kLanes,
                __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23));
        store16(t + (2 * k + 1) * kLanes,
                __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31));
      }
      return;
    }
  }
  if (channels < kLanes) {
    for (int64_t l = 0; l < channels; ++l)
      for (int64_t p = 0; p < size; ++p) t[p * kLanes + l] = planes[l * size + p];
  } else if (size == 1) {
    std::copy(planes, planes + kLanes, t);
  } else {
    for (int64_t p = 0; p < size; ++p)
      for (int64_t l = 0; l < kLanes; ++l) t[p * kLanes + l] = planes[l * size + p];
  }
}

// planes[l * size + p] = t[p * 16 + l] for l < channels (at most 16): transpose_block undone.
template <class L>
[[gnu::always_inline]] inline void untranspose_block(const float* t, int64_t size, int64_t channels,
                                                     float* planes) {
  if constexpr (std::is_same_v<L, Vec16>) {
    if (channels == kLanes && size == 4) {  // pixels 0 and 1, 2 and 3 interleaved, then 4 channels a vector
      Vec16 v[4], u[4];
      for (int p = 0; p < 4; ++p) load16(v[p], t + p * kLanes);
      for (int k = 0; k < 2; ++k) {
        const Vec16 &a = v[2 * k], &b = v[2 * k + 1];  // pixels 2k and 2k + 1
        u[2 * k] = __builtin_shufflevector(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        u[2 * k + 1] = __builtin_shufflevector(a, b, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
      }
      for (int k = 0; k < 2; ++k) {
        const Vec16 &a = u[k], &b = u[k + 2];  // channels 8k to 8k + 7
        store16(planes + 2 * k * kLanes,
                __builtin_shufflevector(a, b, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23));
        store16(planes + (2 * k + 1) * kLanes,
                __builtin_shufflevector(a, b, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31));
      }
      return;
    }
  }
  if (channels == kLanes && size == 1) {
    std::copy(t, t + kLanes, planes);
    return;
  }
  for (int64_t l = 0; l < channels; ++l)
    for (int64_t p = 0; p < size; ++p) planes[l * size + p] = t[p * kLanes + l];
}

// t[p * ld + c] = planes[c * size + p] for `channels` planes of `size` pixels: pixel-major, the
// channels of a pixel contiguous (rows of ld floats).
void transpose_planes(const float* planes, int64_t size, int64_t channels, int64_t ld, float* t) {
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t p = 0; p < size; ++p) t[p * ld + c] = planes[c * size + p];
}

// The channels' 16-lane blocks split into contiguous runs, one per thread where the work is large
// enough: per run, images in order, each image's blocks in order, so that every image's planes are
// read front to back (block by block per image, the images' planes interleaved, 240 channels of
// 1x1 took a third longer from cold caches).
struct BlockRuns {
  int64_t blocks = 1, runs = 1;
  BlockRuns(int64_t channels, int64_t work, int threads)
      : blocks((channels + kLanes - 1) / kLanes),
        runs(blocks > 1 && threads > 1 && work >= (1 << 15) ? std::min<int64_t>(threads, blocks) : 1) {}
  int64_t first(int64_t r) const { return r * blocks / runs; }  // run r: blocks [first(r), first(r + 1))
  int64_t most() const { return (blocks + runs - 1) / runs; }    // blocks in the longest run
};

class DepthwiseConvGradWeight final : public Kernel {
 public:
  using Pairs = std::vector<std::pair<int32_t, int32_t>>;  // (output pixel, input pixel) of a plane
  DepthwiseConvGradWeight(int64_t batch, int64_t channels, int64_t in_size, int64_t out_size,
                          const std::vector<Pairs>& taps, int threads)
      : batch_(batch), channels_(channels), in_size_(in_size), out_size_(out_size),
        taps_(static_cast<int64_t>(taps.size())), threads_(std::max(threads, 1)), isa_(vector_isa()),
        runs_(channels, batch * channels * pair_count(taps), threads_) {
    for (const Pairs& t : taps) {
      first_.push_back(static_cast<int32_t>(pairs_.size()));
      pairs_.insert(pairs_.end(), t.begin(), t.end());
    }
    first_.push_back(static_cast<int32_t>(pairs_.size()));
  }

  // Per run: the taps' sums of its blocks (blocks x taps x 16), one block's dY and X planes
  // transposed (pixels x 16 each).
  size_t scratch_bytes() const override { return static_cast<size_t>(runs_.runs * per_run()) * sizeof(float); }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float* dy = in[0].as<const float>();
    const float* x = in[1].as<const float>();
    float* dw = out[0].as<float>();
    parallel_for(runs_.runs, threads_, runs_.runs > 1, [&](int64_t r) {
      blocks(dy, x, runs_.first(r), runs_.first(r + 1), static_cast<float*>(scratch) + r * per_run(), dw);
    });
  }

 private:
  static int64_t pair_count(const std::vector<Pairs>& taps) {
    int64_t n = 0;
    for (const Pairs& t : taps) n += static_cast<int64_t>(t.size());
    return n;
  }
  int64_t per_run() const { return (runs_.most() * taps_ + out_size_ + in_size_) * kLanes; }

  // Blocks [b0, b1) of dW, with `mine`: this run's scratch.
  void blocks(const float* dy, const float* x, int64_t b0, int64_t b1, float* mine, float* dw) const {
    float* dt = mine + runs_.most() * taps_ * kLanes;
    float* xt = dt + out_size_ * kLanes;
    std::fill(mine, mine + per_run(), 0.f);  // lanes past the last channel stay 0
    on_vector_isa(isa_, [&](auto on) __attribute__((always_inline)) {
      using L = typename decltype(on)::Lanes;
      for (int64_t n = 0; n < batch_; ++n)
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t c0 = b * kLanes, w = std::min<int64_t>(kLanes, channels_ - c0);
          float* acc = mine + (b - b0) * taps_ * kLanes;
          transpose_block<L>(dy + (n * channels_ + c0) * out_size_, out_size_, w, dt);
          transpose_block<L>(x + (n * channels_ + c0) * in_size_, in_size_, w, xt);
          for (int64_t t = 0; t < taps_; ++t) {
            if (first_[t] == first_[t + 1]) continue;
            L sum, d, v;
            load16(sum, acc + t * kLanes);
            for (int32_t k = first_[t]; k < first_[t + 1]; ++k) {
              load16(d, dt + pairs_[k].first * kLanes);
              load16(v, xt + pairs_[k].second * kLanes);
              sum += d * v;
            }
            store16(acc + t * kLanes, sum);
          }
        }
    });
    for (int64_t c = b0 * kLanes; c < std::min(channels_, b1 * kLanes); ++c) {
      const float* acc = mine + (c / kLanes - b0) * taps_ * kLanes + c % kLanes;
      for (int64_t t = 0; t < taps_; ++t) dw[c * taps_ + t] = acc[t * kLanes];
    }
  }

  int64_t batch_, channels_, in_size_, out_size_, taps_;
  std::vector<std::pair<int32_t, int32_t>> pairs_;  // every tap's pairs, taps in row-major order
  std::vector<int32_t> first_;                      // tap t's pairs: [first_[t], first_[t + 1])
  int threads_;
  VectorIsa isa_;
  BlockRuns runs_;
};

// Y = Conv(X, W, B) of a depthwise Conv, and dX = ConvGradInput(dY, W) of one, where both maps are
// of at most kSmallDepthwiseMap pixels and the channels fill a 16-lane block at least
// (MobileNetV2's late 3x3s on 2x2 and 1x1 maps, 96 to 240 channels). oneDNN's jit_dw runs them on
// 16-channel blocks (nChw16c), and reordering X, dY, Y or dX into and out of those cost more than
// the convolution: 8 images of 96 channels of 2x2 took 6.2 us a call forward and 5.2 the input
// gradient, now 2.3 and 1.8; the sample's 20 such calls, 113 us a micro-batch, now 45 (`train
// --profile`, one stage, five runs each way). Here, 16 channels a vector as DepthwiseConvGradWeight
// takes them, per image the block's source planes (X, or dY) are transposed into scratch and each
// destination pixel (of Y, or dX) is the sum over its (tap, source pixel) pairs of the source's 16
// values times the tap's 16 weights, after B's where given, then transposed back. Y's pairs are its
// window's taps in row-major order; dX's, those (output, tap) whose window meets the input pixel,
// outputs in row-major order. Per channel one thread, the order fixed: the bits do not depend on
// the thread count.
constexpr int64_t kSmallDepthwiseMap = 4;

class DepthwiseSmallMaps final : public Kernel {
 public:
  using Pairs = std::vector<std::pair<int32_t, int32_t>>;  // (tap, source pixel)
  DepthwiseSmallMaps(int64_t batch, int64_t channels, int64_t src_size, int64_t dst_size, int64_t taps,
                     std::vector<Pairs> per_dst, bool bias, int threads)
      : batch_(batch), channels_(channels), src_size_(src_size), dst_size_(dst_size), taps_(taps),
        bias_(bias), threads_(std::max(threads, 1)), isa_(vector_isa()),
        runs_(channels, batch * channels * taps * dst_size, threads_) {
    for (const Pairs& d : per_dst) {
      first_.push_back(static_cast<int32_t>(pairs_.size()));
      pairs_.insert(pairs_.end(), d.begin(), d.end());
    }
    first_.push_back(static_cast<int32_t>(pairs_.size()));
  }

  // Per run: its blocks' weights and B (blocks x (taps + 1) x 16), one block's source and
  // destination planes transposed (pixels x 16 each).
  size_t scratch_bytes() const override { return static_cast<size_t>(runs_.runs * per_run()) * sizeof(float); }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float* src = in[0].as<const float>();
    const float* w = in[1].as<const float>();
    const float* b = bias_ ? in[2].as<const float>() : nullptr;
    float* dst = out[0].as<float>();
    parallel_for(runs_.runs, threads_, runs_.runs > 1, [&](int64_t r) {
      blocks(src, w, b, runs_.first(r), runs_.first(r + 1), static_cast<float*>(scratch) + r * per_run(), dst);
    });
  }

 private:
  int64_t per_run() const { return (runs_.most() * (taps_ + 1) + src_size_ + dst_size_) * kLanes; }

  // Blocks [b0, b1) of the destination, with `mine`: this run's scratch.
  void blocks(const float* src, const float* w, const float* bias, int64_t b0, int64_t b1, float* mine,
              float* dst) const {
    float* st = mine + runs_.most() * (taps_ + 1) * kLanes;
    float* dt = st + src_size_ * kLanes;
    std::fill(mine, mine + per_run(), 0.f);  // lanes past the last channel stay 0
    for (int64_t c = b0 * kLanes; c < std::min(channels_, b1 * kLanes); ++c) {
      float* wt = mine + (c / kLanes - b0) * (taps_ + 1) * kLanes + c % kLanes;  // then B's lanes
      for (int64_t t = 0; t < taps_; ++t) wt[t * kLanes] = w[c * taps_ + t];
      if (bias) wt[taps_ * kLanes] = bias[c];
    }
    on_vector_isa(isa_, [&](auto on) __attribute__((always_inline)) {
      using L = typename decltype(on)::Lanes;
      for (int64_t m = 0; m < batch_; ++m)
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t c0 = b * kLanes, n = std::min<int64_t>(kLanes, channels_ - c0);
          const float* wt = mine + (b - b0) * (taps_ + 1) * kLanes;
          transpose_block<L>(src + (m * channels_ + c0) * src_size_, src_size_, n, st);
          for (int64_t d = 0; d < dst_size_; ++d) {
            L sum, x, v;
            load16(sum, wt + taps_ * kLanes);
            for (int32_t k = first_[d]; k < first_[d + 1]; ++k) {
              load16(x, st + pairs_[k].second * kLanes);
              load16(v, wt + pairs_[k].first * kLanes);
              sum += x * v;
            }
            store16(dt + d * kLanes, sum);
          }
          untranspose_block<L>(dt, dst_size_, n, dst + (m * channels_ + c0) * dst_size_);
        }
    });
  }

  int64_t batch_, channels_, src_size_, dst_size_, taps_;
  bool bias_;
  std::vector<std::pair<int32_t, int32_t>> pairs_;  // every destination pixel's pairs, in order
  std::vector<int32_t> first_;                      // pixel d's pairs: [first_[d], first_[d + 1])
  int threads_;
  VectorIsa isa_;
  BlockRuns runs_;
};

// Whether DepthwiseSmallMaps runs a depthwise conv of X (N, C, in...) and Y (N, C, out...).
bool small_depthwise_maps(const Dims& x, const Dims& y) {
  int64_t in = 1, out = 1;
  for (size_t i = 2; i < x.size(); ++i) in *= x[i], out *= y[i];
  return x.size() >= 3 && x.size() <= 5 && x[1] >= kLanes && in <= kSmallDepthwiseMap && out <= kSmallDepthwiseMap;
}

// The kernel for Y = Conv(X, W, B) (forward) or dX = ConvGradInput(dY, W), W (C, 1, k...).
std::unique_ptr<Kernel> make_depthwise_small_maps(const Dims& x, const Dims& y, const Dims& w, const Window& window,
                                                  bool forward, bool bias, int threads) {
  const DepthwiseWindow d = depthwise_window(x, y, w, window);
  std::vector<DepthwiseSmallMaps::Pairs> per(static_cast<size_t>(forward ? d.out_size : d.in_size));
  for (const auto& [o, t, i] : d.triples) per[static_cast<size_t>(forward ? o : i)].emplace_back(t, forward ? i : o);
  return std::make_unique<DepthwiseSmallMaps>(x[0], x[1], forward ? d.in_size : d.out_size,
                                              forward ? d.out_size : d.in_size, d.taps, std::move(per), bias, threads);
}

// The same for a 2-D depthwise Conv of stride 1, no dilation and a kernel at most 16 wide whose
// output rows times kernel width fill 16 lanes (a ConvNeXt's 7x7 on 8x8 maps): per channel c and
// image n the plane is copied once into rows of OW + 15 values, its padding's zeros around it
// (above and below too, so that every kernel row meets a row), and each dY value scales 16 of
// them at once into a kernel row's 16 lanes: lane kw of kernel row kh gathers
// dY[n, c, oh, ow] * X[n, c, oh - pad + kh, ow - pad + kw], the lanes past the kernel's width
// unused. Each lane's sum runs over images, output rows and columns in that order. The pair-by-pair
// kernel above ran such a layer at ~2 cycles a pair (samples/exports' convnext, 8 channels of 8x8:
// 17 us, 6x what a convolution of its FLOPs costs); one kernel row at a time, its lanes a chain of
// dependent FMAs, took 4.5x the forward's time at 96 channels of 28x28. Here kRowsAtOnce kernel
// rows share each dY value, their lanes independent chains. Per channel one thread: the bits do
// not depend on the thread count.
constexpr int64_t kRowLanes = 16;
constexpr int64_t kRowsAtOnce = 4;

// acc[j * 16 + k] += sum over output rows y < oh, then columns x < ow, of
// dy[y * ow + x] * plane[(y + j) * ld + x + k], for R kernel rows j and the 16 lanes k.
template <int R, class L>
[[gnu::always_inline]] inline void correlate_rows(const float* dy, const float* plane, int64_t ld, int64_t oh,
                                                  int64_t ow, float* acc) {
  L lanes[R], r;
  for (int j = 0; j < R; ++j) load16(lanes[j], acc + j * kRowLanes);
  for (int64_t y = 0; y < oh; ++y) {
    const float* d = dy + y * ow;
    const float* row = plane + y * ld;
    for (int64_t x = 0; x < ow; ++x)
      for (int j = 0; j < R; ++j) {
        load16(r, row + j * ld + x);
        lanes[j] += d[x] * r;
      }
  }
  for (int j = 0; j < R; ++j) store16(acc + j * kRowLanes, lanes[j]);
}

// The depthwise kernels that run plane by plane (unit_plane_window): X (N, C, H, W) read, Y (N, C,
// OH, OW) made by a KH x KW window padded PH, PW on the left and top, each plane of X padded into
// scratch first, one scratch per thread.
class DepthwisePlanes : public Kernel {
 public:
  DepthwisePlanes(const Dims& x, const Dims& y, int64_t kh, int64_t kw, int64_t ph, int64_t pw, int threads)
      : n_(x[0]), c_(x[1]), h_(x[2]), w_(x[3]), oh_(y[2]), ow_(y[3]), kh_(kh), kw_(kw), ph_(ph), pw_(pw),
        threads_(threads), isa_(vector_isa()) {}

  size_t scratch_bytes() const override {
    return static_cast<size_t>(threads_) * static_cast<size_t>(per_thread()) * sizeof(float);
  }

 protected:
  // Floats of one thread's scratch.
  virtual int64_t per_thread() const = 0;
  float* mine(void* scratch) const { return static_cast<float*>(scratch) + omp_get_thread_num() * per_thread(); }

  int64_t x_rows() const { return oh_ + kh_ - 1; }  // padded row r holds input row r - ph
  // One plane x of X as x_rows() rows of ld floats, plane[(j + ph) * ld + pw + i] = x[j, i], zeros
  // around it (above and below too, so that every kernel row meets a row).
  void pad_input(const float* x, int64_t ld, float* plane) const {
    std::fill(plane, plane + x_rows() * ld, 0.f);
    const int64_t from = std::max<int64_t>(0, -pw_), to = std::min(w_, ld - pw_);
    for (int64_t j = std::max<int64_t>(0, -ph_); j < h_ && j + ph_ < x_rows() && to > from; ++j)
      std::copy(x + j * w_ + from, x + j * w_ + to, plane + (j + ph_) * ld + pw_ + from);
  }

  int64_t n_, c_, h_, w_, oh_, ow_, kh_, kw_, ph_, pw_;
  int threads_;
  VectorIsa isa_;
};

// The weight gradient kernels of a 2-D depthwise Conv of stride 1, undilated, by rows and by
// columns: the channel loop (per channel one thread, so the bits do not depend on the thread
// count) over the planes of X and dY.
class DepthwisePlaneGradWeight : public DepthwisePlanes {
 public:
  DepthwisePlaneGradWeight(const ConvGeometry& g, int threads)
      : DepthwisePlanes(g.x, g.y, g.w[2], g.w[3], g.window.pad_l[0], g.window.pad_l[1], threads) {}

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float* dy = in[0].as<const float>();
    const float* x = in[1].as<const float>();
    float* dw = out[0].as<float>();
    const bool parallel = c_ > 1 && n_ * c_ * oh_ * ow_ * kh_ * kw_ >= (1 << 15);
    parallel_for(c_, threads_, parallel, [&](int64_t c) { channel(dy, x, c, dw + c * kh_ * kw_, mine(scratch)); });
  }

 protected:
  // dW[c] (kh x kw) from every image's plane of channel c, with `mine`, this thread's scratch.
  virtual void channel(const float* dy, const float* x, int64_t c, float* dw, float* mine) const = 0;
};

class DepthwiseRowsGradWeight final : public DepthwisePlaneGradWeight {
 public:
  using DepthwisePlaneGradWeight::DepthwisePlaneGradWeight;

 private:
  // One padded input plane and the kernel's rows of lanes.
  int64_t per_thread() const override { return x_rows() * row_floats() + kh_ * kRowLanes; }
  int64_t row_floats() const { return ow_ + kRowLanes - 1; }

  void channel(const float* dy, const float* x, int64_t c, float* dw, float* plane) const override {
    float* acc = plane + x_rows() * row_floats();
    std::fill(acc, acc + kh_ * kRowLanes, 0.f);
    for (int64_t n = 0; n < n_; ++n) {
      pad_input(x + (n * c_ + c) * h_ * w_, row_floats(), plane);
      const float* d = dy + (n * c_ + c) * oh_ * ow_;
      on_vector_isa(isa_, [&](auto on) __attribute__((always_inline)) {
        using L = typename decltype(on)::Lanes;
        for (int64_t k = 0; k < kh_; k += kRowsAtOnce) {
          const float* p = plane + k * row_floats();
          float* a = acc + k * kRowLanes;
          switch (std::min(kRowsAtOnce, kh_ - k)) {
            case 1: correlate_rows<1, L>(d, p, row_floats(), oh_, ow_, a); break;
            case 2: correlate_rows<2, L>(d, p, row_floats(), oh_, ow_, a); break;
            case 3: correlate_rows<3, L>(d, p, row_floats(), oh_, ow_, a); break;
            default: correlate_rows<4, L>(d, p, row_floats(), oh_, ow_, a); break;
          }
        }
      });
    }
    for (int64_t kh = 0; kh < kh_; ++kh) std::copy(acc + kh * kRowLanes, acc + kh * kRowLanes + kw_, dw + kh * kw_);
  }
};

// The same where output rows are at least 16 wide (a ConvNeXt's 7x7 on 28x28 maps and larger):
// lanes along the output row instead of the kernel row, so that a row of 28 fills 28 of 32 lanes
// where the kernel's 7 filled 7 of 16. Per channel c and image n, dY's plane is copied into rows of
// OWp values (OW rounded up to 16 lanes, zeros after) and X's into rows of OWp + KW - 1 with its
// padding's zeros around it; per kernel row kh and up to kTapsAtOnce taps kw at once, each block
// of 16 dY values of an output row scales the 16 X values kw to its right into tap (kh, kw)'s 16
// lanes, which hold lane l's sum over images, output rows and blocks in that order. A tap's value
// is its lanes added in lane order. 96 channels of 28x28, 7x7, 8 images, one thread: 0.94 ms a
// call, where by rows (above) it took 1.35 and the forward takes 0.48. Per channel one thread: the
// bits do not depend on the thread count.
constexpr int64_t kTapsAtOnce = 8;

// acc[j * 16 + l] += sum over rows y < oh, then blocks x of 16 in [0, ow), of
// dy[y * owp + x + l] * xrow[(y * ldx) + x + j + l], for taps j < R (xrow at the group's first tap).
// In a row's last block, if partial, the lanes past ow take zeros for X as well as for dY (a
// select): an infinite X read there would make 0 * inf, a NaN no tap's true sum holds.
template <int R, class L>
[[gnu::always_inline]] inline void correlate_cols(const float* dy, const float* xrow, int64_t ldx, int64_t oh,
                                                  int64_t ow, int64_t owp, float* acc) {
  L lanes[R], d, x, keep;
  for (int j = 0; j < R; ++j) load16(lanes[j], acc + j * kLanes);
  const int64_t whole = ow / kLanes * kLanes, tail = ow - whole;
  float flags[kLanes] = {};
  std::fill_n(flags, tail, 1.f);
  load16(keep, flags);
  for (int64_t y = 0; y < oh; ++y) {
    for (int64_t b = 0; b < whole; b += kLanes) {
      load16(d, dy + y * owp + b);
      for (int j = 0; j < R; ++j) {
        load16(x, xrow + y * ldx + b + j);
        lanes[j] += d * x;
      }
    }
    if (tail == 0) continue;
    load16(d, dy + y * owp + whole);
    for (int j = 0; j < R; ++j) {
      load16(x, xrow + y * ldx + whole + j);
      keep16(x, keep);
      lanes[j] += d * x;
    }
  }
  for (int j = 0; j < R; ++j) store16(acc + j * kLanes, lanes[j]);
}

class DepthwiseColsGradWeight final : public DepthwisePlaneGradWeight {
 public:
  DepthwiseColsGradWeight(const ConvGeometry& g, int threads)
      : DepthwisePlaneGradWeight(g, threads), owp_((ow_ + kLanes - 1) / kLanes * kLanes) {}

 private:
  // X's padded plane, dY's, and the taps' lanes.
  int64_t per_thread() const override { return x_rows() * ldx() + oh_ * owp_ + kh_ * kw_ * kLanes; }
  int64_t ldx() const { return owp_ + kw_ - 1; }  // a padded X row: output column x's window at x

  void channel(const float* dy, const float* x, int64_t c, float* dw, float* xp) const override {
    float* dyp = xp + x_rows() * ldx();
    float* acc = dyp + oh_ * owp_;
    std::fill(acc, acc + kh_ * kw_ * kLanes, 0.f);
    for (int64_t n = 0; n < n_; ++n) {
      pad_input(x + (n * c_ + c) * h_ * w_, ldx(), xp);
      const float* d = dy + (n * c_ + c) * oh_ * ow_;
      for (int64_t y = 0; y < oh_; ++y) {
        std::copy(d + y * ow_, d + (y + 1) * ow_, dyp + y * owp_);
        std::fill(dyp + y * owp_ + ow_, dyp + (y + 1) * owp_, 0.f);
      }
      on_vector_isa(isa_, [&](auto on) __attribute__((always_inline)) {
        using L = typename decltype(on)::Lanes;
        for (int64_t kh = 0; kh < kh_; ++kh)
          for (int64_t k = 0; k < kw_; k += kTapsAtOnce) {
            const float* row = xp + kh * ldx() + k;
            float* a = acc + (kh * kw_ + k) * kLanes;
            switch (std::min(kTapsAtOnce, kw_ - k)) {
              case 1: correlate_cols<1, L>(dyp, row, ldx(), oh_, ow_, owp_, a); break;
              case 2: correlate_cols<2, L>(dyp, row, ldx(), oh_, ow_, owp_, a); break;
              case 3: correlate_cols<3, L>(dyp, row, ldx(), oh_, ow_, owp_, a); break;
              case 4: correlate_cols<4, L>(dyp, row, ldx(), oh_, ow_, owp_, a); break;
              case 5: correlate_cols<5, L>(dyp, row, ldx(), oh_, ow_, owp_, a); break;
              case 6: correlate_cols<6, L>(dyp, row, ldx(), oh_, ow_, owp_, a); break;
              case 7: correlate_cols<7, L>(dyp, row, ldx(), oh_, ow_, owp_, a); break;
              default: correlate_cols<8, L>(dyp, row, ldx(), oh_, ow_, owp_, a); break;
            }
          }
      });
    }
    for (int64_t t = 0; t < kh_ * kw_; ++t) {
      float sum = 0.f;
      for (int64_t l = 0; l < kLanes; ++l) sum += acc[t * kLanes + l];
      dw[t] = sum;
    }
  }

  int64_t owp_;
};

// Where DepthwisePlaneConv runs a depthwise conv rather than oneDNN: fewer channels than one of
// oneDNN's 16-channel blocks (which it then fills in part, and X and Y are reordered around it for
// nothing) and output rows that fill its lanes. With a block or more oneDNN's kernel, its lanes
// along channels, was faster: 96 channels of 28x28, 7x7, 8 images, 0.36 ms a call against 0.91;
// 144 of 16x16, 3x3, 0.083 against 0.13; 384 of 14x14, 7x7, the same (one thread, AMD EPYC Zen 5).
bool depthwise_plane_fits(int64_t channels, int64_t out_width) {
  return channels < kLanes && out_width >= kLanes;
}

// Y = Conv(X, W, B) of a 2-D depthwise Conv of stride 1, undilated, between plain NCHW tensors
// (depthwise_plane_fits), as a loop: per image and channel, X's plane is copied into rows of
// OWp + KW - 1 floats (OW rounded up to 16 lanes) with its padding's zeros around it, and each
// block of 16 outputs of a row is the sum over taps (kh, kw) in that order of W[kh, kw] times the
// 16 values at (row + kh, column + kw), then plus B. oneDNN runs such a conv on 16-channel blocks
// (nChw16c) only, so X and Y were reordered around it, which cost as much as the conv, and 8
// channels filled half of each block: MobileNetV2's 8 channels of 16x16, 3x3, 8 images, 12-14 us
// a call, here 7 (`pipetrain run` and `train --profile`, one thread). `flipped` reads W rotated
// by 180 degrees: the input gradient of such a conv is this conv of dY with W flipped, padded
// K - 1 - pad (build_depthwise_grad_input). Per plane one thread: the bits do not depend on the
// thread count.
class DepthwisePlaneConv final : public DepthwisePlanes {
 public:
  DepthwisePlaneConv(const Dims& x, const Dims& y, int64_t kh, int64_t kw, int64_t ph, int64_t pw, bool flipped,
                     bool bias, int threads)
      : DepthwisePlanes(x, y, kh, kw, ph, pw, threads), owp_((ow_ + kLanes - 1) / kLanes * kLanes),
        flipped_(flipped), bias_(bias) {}

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const float* x = in[0].as<const float>();
    const float* w = in[1].as<const float>();
    const float* b = bias_ ? in[2].as<const float>() : nullptr;
    float* y = out[0].as<float>();
    const int64_t taps = kh_ * kw_;
    const bool parallel = n_ * c_ > 1 && n_ * c_ * oh_ * ow_ * taps >= (1 << 15);
    parallel_for(n_ * c_, threads_, parallel, [&](int64_t plane) {
      const int64_t c = plane % c_;
      float* lanes = mine(scratch);
      float* xp = lanes + taps * kLanes;
      for (int64_t t = 0; t < taps; ++t)  // each tap in 16 lanes
        std::fill_n(lanes + t * kLanes, kLanes, w[c * taps + (flipped_ ? taps - 1 - t : t)]);
      pad_input(x + plane * h_ * w_, ldx(), xp);
      convolve(lanes, xp, b ? b[c] : 0.f, y + plane * oh_ * ow_);
    });
  }

 private:
  int64_t ldx() const { return owp_ + kw_ - 1; }
  // The taps, each in 16 lanes, and X's padded plane.
  int64_t per_thread() const override { return kh_ * kw_ * kLanes + x_rows() * ldx(); }

  // One plane's outputs from its padded input xp and its taps, each in 16 lanes: R output rows at
  // a time, so that R sums, each a chain of dependent FMAs, run side by side (the loop alone on
  // MobileNetV2's 8 channels of 16x16: 6 us a call one row at a time, 3 at 8). R = 8 fills 8 of
  // AVX-512's 32 registers; 4 on the narrower copies, whose 16 lanes take two or four registers.
  void convolve(const float* taps, const float* xp, float bias, float* y) const {
    on_vector_isa(isa_, [&](auto on) __attribute__((always_inline)) {
      using L = typename decltype(on)::Lanes;
      constexpr int R = std::is_same_v<L, Vec16> ? 8 : 4;
      L b;
      splat16(b, bias);
      int64_t r = 0;
      for (; r + R <= oh_; r += R)
        for (int64_t col = 0; col < ow_; col += kLanes) rows<R, L>(taps, xp, r, col, b, y);
      for (; r < oh_; ++r)
        for (int64_t col = 0; col < ow_; col += kLanes) rows<1, L>(taps, xp, r, col, b, y);
    });
  }

  // Output rows [r, r + R), columns [col, col + 16) (those below OW): the sum over taps (kh, kw) in
  // that order of the tap times X's padded plane at (row + kh, column + kw), then plus B.
  template <int R, class L>
  [[gnu::always_inline]] inline void rows(const float* taps, const float* xp, int64_t r, int64_t col, const L& b,
                                          float* y) const {
    L acc[R], v, tap;
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) splat16(acc[q], 0.f);
    for (int64_t i = 0; i < kh_; ++i)
      for (int64_t j = 0; j < kw_; ++j) {
        load16(tap, taps + (i * kw_ + j) * kLanes);
#pragma GCC unroll 8
        for (int q = 0; q < R; ++q) {
          load16(v, xp + (r + q + i) * ldx() + col + j);
          acc[q] += tap * v;
        }
      }
    float last[kLanes];
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) {
      acc[q] += b;
      float* out = y + (r + q) * ow_ + col;
      if (col + kLanes <= ow_) {
        store16(out, acc[q]);
      } else {
        store16(last, acc[q]);
        std::copy(last, last + (ow_ - col), out);
      }
    }
  }

  int64_t owp_;
  bool flipped_, bias_;
};

// Whether oneDNN has a JIT kernel for the weight gradient of a depthwise Conv of geometry g.
bool dnnl_depthwise_weights_jit(const KernelSpec& s, const ConvGeometry& g) {
  const dnnl::engine& engine = *s.cpu->engine;
  const Window& w = g.window;
  const dnnl::convolution_backward_weights::primitive_desc pd(
      {dnnl::algorithm::convolution_direct, conv_layout(g, g.x), conv_layout(g, g.w_grouped),
       conv_layout(g, g.y), w.strides, w.dilation, w.pad_l, w.pad_r},
      engine, conv_hint(g, engine));
  return implementation_is(pd, "jit_dw");
}

// The direct depthwise kernel for g (by rows where it is 2-D, of stride 1 and undilated; else by
// pairs), or nullptr where the Conv is not depthwise or oneDNN has a JIT kernel for it.
std::unique_ptr<Kernel> make_depthwise_grad_weight(const KernelSpec& s, const ConvGeometry& g) {
  if (!g.depthwise || g.x.size() > 5 || dnnl_depthwise_weights_jit(s, g)) return nullptr;
  // By rows where an output row's products fill a vector's lanes at least (not MobileNetV2's late
  // 3x3s on 4x4 to 1x1 maps: a row call per kernel row costs more than their few pairs).
  const bool plane = unit_plane_window(g.window, g.x);
  if (plane && g.y[3] >= kLanes) return std::make_unique<DepthwiseColsGradWeight>(g, s.cpu->threads);
  if (plane && g.w[3] <= kRowLanes && g.y[3] * g.w[3] >= kRowLanes)
    return std::make_unique<DepthwiseRowsGradWeight>(g, s.cpu->threads);
  const DepthwiseWindow d = depthwise_window(g.x, g.y, g.w, g.window);
  std::vector<DepthwiseConvGradWeight::Pairs> taps(static_cast<size_t>(d.taps));
  for (const auto& [o, t, i] : d.triples) taps[static_cast<size_t>(t)].emplace_back(o, i);
  return std::make_unique<DepthwiseConvGradWeight>(g.x[0], g.x[1], d.in_size, d.out_size, taps, s.cpu->threads);
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

// The direct pointwise kernel for g: by rows of transposed X on a small plane with long rows, by
// lanes along a larger plane with fewer channels than the lanes; else nullptr (oneDNN's).
std::unique_ptr<Kernel> make_pointwise_grad_weight(const ConvGeometry& g) {
  if (!g.pointwise) return nullptr;
  const Window& w = g.window;
  if (!all_are(w.strides, 1) || !all_are(w.pad_l, 0) || !all_are(w.pad_r, 0) || !all_are(w.dilation, 0)) return nullptr;
  if (g.y[1] != g.w[0] || g.x[1] != g.w[1]) return nullptr;
  const int64_t hw = product(g.x, 2, g.x.size());
  // The planes conv_layout gives oneDNN's blocked kernels: the same bound.
  if (pointwise_on_plain_layouts(g.x))
    return g.x[1] < kLanes ? std::make_unique<PointwiseLanesGradWeight>(g.x[0], g.w[0], g.w[1], hw) : nullptr;
  if (g.x[1] < kLongRow) return nullptr;
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

// dX = ConvGradInput(dY, W) of a 2-D depthwise Conv of stride 1 and no dilation, padded less than
// its kernel: the forward convolution of dY with W flipped in both spatial dims, padded K - 1 -
// pad on each side, as the forward's Conv runs: DepthwisePlaneConv where it fits
// (depthwise_plane_fits), else oneDNN's depthwise JIT in 16-channel blocks (build_conv, nn.cc).
// oneDNN's backward-data depthwise kernel took 4x the forward's time on samples/exports' convnext
// (8 channels of 8x8, 7x7: 4 us against 1) and 1.5x at 96 channels of 28x28. The flipped W is
// written into scratch before the steps.
std::unique_ptr<Kernel> build_depthwise_grad_input(const KernelSpec& s, const ConvGeometry& g) {
  const Window& w = g.window;
  if (!g.depthwise || !unit_plane_window(w, g.x)) return nullptr;
  const int64_t channels = g.x[1];
  const int64_t kh = g.w[2], kw = g.w[3];
  const Dims pad_l = {kh - 1 - w.pad_l[0], kw - 1 - w.pad_l[1]}, pad_r = {kh - 1 - w.pad_r[0], kw - 1 - w.pad_r[1]};
  if (std::min({pad_l[0], pad_l[1], pad_r[0], pad_r[1]}) < 0) return nullptr;
  if (depthwise_plane_fits(channels, g.x[3]))
    return std::make_unique<DepthwisePlaneConv>(g.y, g.x, kh, kw, pad_l[0], pad_l[1], true, false, s.cpu->threads);
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto blocked = [](const Dims& d) {
    return memory::desc(d, memory::data_type::f32, memory::format_tag::nChw16c);
  };
  const dnnl::convolution_forward::primitive_desc pd(
      {dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, blocked(g.y), any_layout(g.w_grouped),
       blocked(g.x), w.strides, w.dilation, pad_l, pad_r},
      attr, k->engine());
  if (!implementation_is(pd, "jit_dw")) return nullptr;  // else the backward-data kernels
  const memory::desc w_md = plain_desc(DType::kFloat32, g.w_grouped);
  const Place flipped = k->reserve(w_md.get_size());
  const int64_t taps = kh * kw;
  k->set_prologue([flipped, channels, taps](std::span<const Buffer> in, std::span<const Buffer>, std::byte* base) {
    const float* from = in[1].as<const float>();
    auto* to = reinterpret_cast<float*>(base + flipped.at);
    for (int64_t c = 0; c < channels; ++c)
      std::reverse_copy(from + c * taps, from + (c + 1) * taps, to + c * taps);
  });
  const Place dyp = k->reordered({Place::kInput, 0}, plain_desc(DType::kFloat32, g.y), pd.src_desc());
  const Place wp = k->reordered(flipped, w_md, pd.weights_desc());
  const memory::desc dx_md = plain_desc(DType::kFloat32, g.x);
  const bool dx_plain = same_bytes(pd.dst_desc(), dx_md);
  const Place dxp = dx_plain ? Place{Place::kOutput, 0} : k->reserve(pd.dst_desc().get_size());
  k->add_step(dnnl::convolution_forward(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_SRC, pd.src_desc(), dyp},
               {DNNL_ARG_WEIGHTS, pd.weights_desc(), wp},
               {DNNL_ARG_DST, pd.dst_desc(), dxp}});
  if (!dx_plain) k->add_reorder(dxp, pd.dst_desc(), {Place::kOutput, 0}, dx_md);
  return k;
}

}  // namespace

std::unique_ptr<Kernel> make_depthwise_conv(const KernelSpec& s, const Window& w, int64_t group) {
  const Dims &x = s.inputs[0].shape, &wt = s.inputs[1].shape, &y = s.outputs[0].shape;
  // Plain X and Y, no epilogue (KernelSpec::epilogue): the loop writes Y as the conv alone
  // computes it, in NCHW.
  if (s.epilogue || s.prologue || s.input_channels_last(0) || s.output_channels_last(0))
    return nullptr;
  if (!is_depthwise(group, x, wt)) return nullptr;
  if (small_depthwise_maps(x, y))
    return make_depthwise_small_maps(x, y, wt, w, true, s.has_input(2), s.cpu->threads);
  if (!unit_plane_window(w, x) || !depthwise_plane_fits(x[1], y[3])) return nullptr;
  return std::make_unique<DepthwisePlaneConv>(x, y, wt[2], wt[3], w.pad_l[0], w.pad_l[1], false, s.has_input(2),
                                              s.cpu->threads);
}

// ConvGradInput(dY, W) -> dX, attributes of Conv plus input_shape (X's shape).
std::unique_ptr<Kernel> make_conv_grad_input(const KernelSpec& s) {
  if (!two_to_one_float(s, "input_shape")) return nullptr;
  const auto g = conv_geometry(s.node, s.outputs[0].shape, s.inputs[1].shape, s.inputs[0].shape);
  if (!g) return nullptr;
  if (std::unique_ptr<Kernel> k = build_or_null(s, [&] { return build_pixel_grad_input(s, *g); })) return k;
  if (g->depthwise && small_depthwise_maps(g->x, g->y))
    return make_depthwise_small_maps(g->x, g->y, g->w, g->window, false, false, s.cpu->threads);
  if (std::unique_ptr<Kernel> k = build_or_null(s, [&] { return build_depthwise_grad_input(s, *g); })) return k;
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
    if (auto direct = make_pointwise_grad_weight(*g)) return direct;
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
