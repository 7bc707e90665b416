// exec/cpu/depthwise.h: the makers of the depthwise convolutions' own loops (depthwise.cc,
// depthwise_planes.cc) that nn_grad.cc and depthwise.cc call; make_depthwise_conv, the forward's,
// is in cpu_kernels.h. In: the Conv's geometry; out: a kernel, or nullptr where the loops do not
// take it.
#pragma once

#include <cstdint>
#include <memory>

#include "exec/cpu/conv_geometry.h"
#include "exec/kernel.h"

namespace pt::cpu {

// The weight gradient of a depthwise Conv (g.depthwise) as one of depthwise.cc's loops where
// oneDNN has no JIT kernel for it; nullptr where it has one, or g is not depthwise.
std::unique_ptr<Kernel> make_depthwise_grad_weight(const KernelSpec& s, const ConvGeometry& g);

// The input gradient of a depthwise Conv as depthwise.cc's loops, or as the forward convolution
// of dY with W flipped on oneDNN's depthwise JIT; nullptr where neither fits.
std::unique_ptr<Kernel> make_depthwise_grad_input(const KernelSpec& s, const ConvGeometry& g);

// Where DepthwisePlaneConv runs a 2-D depthwise Conv of stride 1, undilated: fewer channels than
// a 16-channel block and output rows of 16 or more (depthwise_planes.cc).
bool depthwise_plane_fits(int64_t channels, int64_t out_width);

// Y = Conv(X, W, B) of such a Conv, X (N, C, H, W), Y (N, C, OH, OW), a KH x KW window padded
// PH, PW on the left and top, W read rotated by 180 degrees where `flipped` (the input gradient:
// this conv of dY, padded K - 1 - pad).
std::unique_ptr<Kernel> make_depthwise_plane_conv(const Dims& x, const Dims& y, int64_t kh, int64_t kw, int64_t ph,
                                                  int64_t pw, bool flipped, bool bias, int threads);

// dW of a 2-D depthwise Conv of stride 1, undilated, by output columns where its output rows are
// 16 wide or more, by kernel rows where a row's products fill 16 lanes; else nullptr.
std::unique_ptr<Kernel> make_depthwise_plane_grad_weight(const ConvGeometry& g, int threads);

}  // namespace pt::cpu
