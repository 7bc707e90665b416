// exec/cpu/depthwise_planes.cc: the depthwise loops that run plane by plane (depthwise.h): the
// forward of a 2-D depthwise Conv of stride 1, undilated, on fewer than 16 channels whose output
// rows fill the vector lanes (its input gradient is the same loop on dY with W flipped), and the
// weight gradient of such a Conv by kernel rows or by output columns. In: plain NCHW tensors; out:
// plain NCHW or W (C, 1, KH, KW).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "exec/cpu/conv_geometry.h"
#include "exec/cpu/depthwise.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"
#include "exec/cpu/vector_clones.h"

namespace pt::cpu {
namespace {

// dW = ConvGradWeight(dY, X) of a 2-D depthwise Conv of stride 1, no dilation and a kernel at most
// 16 wide whose output rows times kernel width fill 16 lanes (a ConvNeXt's 7x7 on 8x8 maps): per
// channel c and image n the plane is copied once into rows of OW + 15 values, its padding's zeros
// around it (above and below too, so that every kernel row meets a row), and each dY value scales
// 16 of them at once into a kernel row's 16 lanes: lane kw of kernel row kh gathers dY[n, c, oh,
// ow] * X[n, c, oh - pad + kh, ow - pad + kw], the lanes past the kernel's width unused. Each
// lane's sum runs over images, output rows and columns in that order. The pair-by-pair kernel
// (DepthwiseConvGradWeight, depthwise.cc, then 4 lanes wide) ran such a layer at ~2 cycles a pair
// (samples/exports' convnext, 8 channels of 8x8: 17 us, 6x what a convolution of its FLOPs costs);
// one kernel row at a time, its lanes a chain of dependent FMAs, took 4.5x the forward's time at 96
// channels of 28x28. Here kRowsAtOnce kernel rows share each dY value, their lanes independent
// chains. Per channel one thread: the bits do not depend on the thread count.
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

}  // namespace

// Where DepthwisePlaneConv runs a depthwise conv rather than oneDNN: fewer channels than one of
// oneDNN's 16-channel blocks (which it then fills in part, and X and Y are reordered around it for
// nothing) and output rows that fill its lanes. With a block or more oneDNN's kernel, its lanes
// along channels, was faster: 96 channels of 28x28, 7x7, 8 images, 0.36 ms a call against 0.91;
// 144 of 16x16, 3x3, 0.083 against 0.13; 384 of 14x14, 7x7, the same (one thread, AMD EPYC Zen 5).
bool depthwise_plane_fits(int64_t channels, int64_t out_width) {
  return channels < kLanes && out_width >= kLanes;
}

std::unique_ptr<Kernel> make_depthwise_plane_conv(const Dims& x, const Dims& y, int64_t kh, int64_t kw, int64_t ph,
                                                  int64_t pw, bool flipped, bool bias, int threads) {
  return std::make_unique<DepthwisePlaneConv>(x, y, kh, kw, ph, pw, flipped, bias, threads);
}

std::unique_ptr<Kernel> make_depthwise_plane_grad_weight(const ConvGeometry& g, int threads) {
  // By rows where an output row's products fill a vector's lanes at least (not MobileNetV2's late
  // 3x3s on 4x4 to 1x1 maps: a row call per kernel row costs more than their few pairs).
  if (!unit_plane_window(g.window, g.x)) return nullptr;
  if (g.y[3] >= kLanes) return std::make_unique<DepthwiseColsGradWeight>(g, threads);
  if (g.w[3] <= kRowLanes && g.y[3] * g.w[3] >= kRowLanes)
    return std::make_unique<DepthwiseRowsGradWeight>(g, threads);
  return nullptr;
}

}  // namespace pt::cpu
