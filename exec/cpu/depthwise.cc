// exec/cpu/depthwise.cc: depthwise convolutions (group = C = M, W (C, 1, k...)) as pipetrain's own
// loops, forward and both gradients, between plain tensors, where oneDNN's kernels run them on
// 16-channel blocks with reorders around them or have no JIT kernel at all: MobileNetV2's late
// 3x3s on maps of at most 4 pixels (DepthwiseSmallMaps, DepthwiseConvGradWeight), and, in
// depthwise_planes.cc, fewer channels than a block on planes whose rows fill the vector lanes.
// make_conv, make_conv_grad_input and make_conv_grad_weight ask here first; nullptr leaves a conv
// to oneDNN.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
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

// Lists of pixel pairs, one per tap or per destination pixel, laid end to end: list i is
// pairs[first[i], first[i + 1]).
struct PairLists {
  std::vector<std::pair<int32_t, int32_t>> pairs;
  std::vector<int32_t> first;
  explicit PairLists(const std::vector<std::vector<std::pair<int32_t, int32_t>>>& lists) {
    for (const auto& l : lists) {
      first.push_back(static_cast<int32_t>(pairs.size()));
      pairs.insert(pairs.end(), l.begin(), l.end());
    }
    first.push_back(static_cast<int32_t>(pairs.size()));
  }
};

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
        by_tap_(taps),
        runs_(channels, batch * channels * static_cast<int64_t>(by_tap_.pairs.size()), threads_) {}

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
            const int32_t k0 = by_tap_.first[t], k1 = by_tap_.first[t + 1];
            if (k0 == k1) continue;
            L sum, d, v;
            load16(sum, acc + t * kLanes);
            for (int32_t k = k0; k < k1; ++k) {
              load16(d, dt + by_tap_.pairs[k].first * kLanes);
              load16(v, xt + by_tap_.pairs[k].second * kLanes);
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
  int threads_;
  VectorIsa isa_;
  PairLists by_tap_;  // per tap in row-major order, its (output, input) pairs
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
                     const std::vector<Pairs>& per_dst, bool bias, int threads)
      : batch_(batch), channels_(channels), src_size_(src_size), dst_size_(dst_size), taps_(taps),
        bias_(bias), threads_(std::max(threads, 1)), isa_(vector_isa()),
        by_dst_(per_dst), runs_(channels, batch * channels * taps * dst_size, threads_) {}

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
            for (int32_t k = by_dst_.first[d]; k < by_dst_.first[d + 1]; ++k) {
              load16(x, st + by_dst_.pairs[k].second * kLanes);
              load16(v, wt + by_dst_.pairs[k].first * kLanes);
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
  int threads_;
  VectorIsa isa_;
  PairLists by_dst_;  // per destination pixel, its (tap, source pixel) pairs in order
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
  const int64_t src = forward ? d.in_size : d.out_size, dst = forward ? d.out_size : d.in_size;
  return std::make_unique<DepthwiseSmallMaps>(x[0], x[1], src, dst, d.taps, per, bias, threads);
}

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
    return make_depthwise_plane_conv(g.y, g.x, kh, kw, pad_l[0], pad_l[1], true, false, s.cpu->threads);
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

// The direct depthwise kernel for g (by rows where it is 2-D, of stride 1 and undilated; else by
// pairs), or nullptr where the Conv is not depthwise or oneDNN has a JIT kernel for it.
std::unique_ptr<Kernel> make_depthwise_grad_weight(const KernelSpec& s, const ConvGeometry& g) {
  if (!g.depthwise || g.x.size() > 5 || dnnl_depthwise_weights_jit(s, g)) return nullptr;
  if (std::unique_ptr<Kernel> k = make_depthwise_plane_grad_weight(g, s.cpu->threads)) return k;
  const DepthwiseWindow d = depthwise_window(g.x, g.y, g.w, g.window);
  std::vector<DepthwiseConvGradWeight::Pairs> taps(static_cast<size_t>(d.taps));
  for (const auto& [o, t, i] : d.triples) taps[static_cast<size_t>(t)].emplace_back(o, i);
  return std::make_unique<DepthwiseConvGradWeight>(g.x[0], g.x[1], d.in_size, d.out_size, taps, s.cpu->threads);
}

std::unique_ptr<Kernel> make_depthwise_grad_input(const KernelSpec& s, const ConvGeometry& g) {
  if (g.depthwise && small_depthwise_maps(g.x, g.y))
    return make_depthwise_small_maps(g.x, g.y, g.w, g.window, false, false, s.cpu->threads);
  return build_depthwise_grad_input(s, g);
}

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
  return make_depthwise_plane_conv(x, y, wt[2], wt[3], w.pad_l[0], w.pad_l[1], false, s.has_input(2),
                                   s.cpu->threads);
}

}  // namespace pt::cpu
