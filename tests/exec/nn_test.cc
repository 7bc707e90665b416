// tests/exec/nn_test.cc: Conv, pooling, normalisations and softmax against ONNX's node
// conformance data, and grouped / dilated convolutions against a plain loop.
#include <gtest/gtest.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "tests/exec/isa_cap.h"
#include "tests/exec/node_case.h"

namespace pt {
namespace {

using testing::NodeCaseResult;

using testing::NodeCase;

struct OpCases {
  const char* op;
  std::vector<NodeCase> cases;
  int must_pass;  // cases of ONNX 1.12's data this kernel passes; the rest are declined on purpose
};

const std::vector<OpCases>& op_cases() {
  static const std::vector<OpCases> all = [] {
    std::vector<NodeCase> conv = testing::op_cases("test_conv", cpu::make_conv);
    for (const NodeCase& c : testing::op_cases("test_basic_conv", cpu::make_conv))
      conv.push_back(c);
    return std::vector<OpCases>{
        {"Conv", conv, 6},
        // with_argmax cases ask for Indices, which the kernel declines.
        {"MaxPool", testing::op_cases("test_maxpool", cpu::make_max_pool), 13},
        {"AveragePool", testing::op_cases("test_averagepool", cpu::make_average_pool), 13},
        {"GlobalAveragePool", testing::op_cases("test_globalaveragepool", cpu::make_global_average_pool), 2},
        {"BatchNormalization", testing::op_cases("test_batchnorm", cpu::make_batch_norm), 4},
        {"LayerNormalization", testing::op_cases("test_layer_normalization", cpu::make_layer_norm), 19},
        {"Softmax", testing::op_cases("test_softmax", cpu::make_softmax), 7},
        {"LogSoftmax", testing::op_cases("test_logsoftmax", cpu::make_log_softmax), 7},
    };
  }();
  return all;
}

std::vector<NodeCase> cases_for(const std::string& op) {
  for (const OpCases& o : op_cases())
    if (op == o.op) return o.cases;
  return {};
}

class NnConformance : public ::testing::TestWithParam<NodeCase> {};

TEST_P(NnConformance, MatchesReference) {
  const NodeCaseResult r = testing::run_node_case(GetParam().name, GetParam().factory);
  if (r.kind == NodeCaseResult::kSkipped) GTEST_SKIP() << r.message;
  EXPECT_EQ(r.kind, NodeCaseResult::kPassed) << r.message;
}

std::string case_name(const ::testing::TestParamInfo<NodeCase>& info) { return info.param.name; }

#define PT_NN_CASES(op) \
  INSTANTIATE_TEST_SUITE_P(op, NnConformance, ::testing::ValuesIn(cases_for(#op)), case_name)
PT_NN_CASES(Conv);
PT_NN_CASES(MaxPool);
PT_NN_CASES(AveragePool);
PT_NN_CASES(GlobalAveragePool);
PT_NN_CASES(BatchNormalization);
PT_NN_CASES(LayerNormalization);
PT_NN_CASES(Softmax);
PT_NN_CASES(LogSoftmax);
#undef PT_NN_CASES

// Skips must not hide a broken kernel: each op passes at least the cases it is known to pass.
TEST(NnConformanceCount, EnoughCasesPassPerOp) {
  for (const OpCases& o : op_cases()) EXPECT_GE(testing::count_passed(o.cases), o.must_pass) << o.op;
}

// Runs one node built by hand (inputs in0.., outputs out0..) through `factory`, twice, as a
// program would: the second run's outputs are returned. channels_last: the first input and
// output are stored channels-last (exec/channels_last.h).
std::vector<std::vector<float>> run_node(Node node, KernelFactory factory,
                                         const std::vector<TensorType>& in,
                                         const std::vector<std::vector<float>>& data,
                                         const std::vector<TensorType>& out, bool channels_last = false) {
  Graph g;
  g.opsets[""] = 17;
  for (size_t i = 0; i < in.size(); ++i)
    node.inputs.push_back(g.add_value("in" + std::to_string(i), in[i]));
  for (size_t i = 0; i < out.size(); ++i)
    node.outputs.push_back(g.add_value("out" + std::to_string(i), out[i]));
  g.add_node(node);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  CpuContext ctx{&engine, &stream, 2};
  KernelSpec spec{g, g.nodes[0], in, out, &ctx};
  if (channels_last) {
    spec.channels_last_in = {true};
    spec.channels_last_out = {true};
  }
  const std::unique_ptr<Kernel> k = factory(spec);
  EXPECT_NE(k, nullptr);
  if (!k) return {};
  std::vector<Buffer> ins, outs;
  for (size_t i = 0; i < in.size(); ++i) ins.push_back({const_cast<float*>(data[i].data()), &in[i]});
  std::vector<std::vector<float>> results;
  for (const TensorType& t : out) results.emplace_back(static_cast<size_t>(t.numel()), -7.f);
  for (size_t i = 0; i < out.size(); ++i) outs.push_back({results[i].data(), &out[i]});
  std::vector<std::byte> scratch(k->scratch_bytes());
  for (int step = 0; step < 2; ++step) {
    k->run(ins, outs, scratch.data());
    stream.wait();
  }
  return results;
}

std::vector<float> run_node(Node node, KernelFactory factory, const std::vector<TensorType>& in,
                            const std::vector<std::vector<float>>& data, const TensorType& y) {
  auto outs = run_node(std::move(node), factory, in, data, std::vector<TensorType>{y});
  return outs.empty() ? std::vector<float>{} : outs[0];
}

struct ConvCase {
  int64_t n, c, h, w, m, group, k, stride, dilation, pad;
};

// Y[b, o, y, x] = B[o] + sum_{i, ky, kx} X[b, g*C/G + i, y*s - p + ky*d, x*s - p + kx*d] *
// W[o, i, ky, kx] with g = o / (M/G): the definition, with zero padding.
std::vector<float> conv_loop(const ConvCase& p, const std::vector<float>& x,
                             const std::vector<float>& wt, const std::vector<float>& b,
                             int64_t oh, int64_t ow) {
  const int64_t cg = p.c / p.group, mg = p.m / p.group;
  std::vector<float> y(static_cast<size_t>(p.n * p.m * oh * ow));
  for (int64_t bi = 0; bi < p.n; ++bi)
    for (int64_t o = 0; o < p.m; ++o)
      for (int64_t yy = 0; yy < oh; ++yy)
        for (int64_t xx = 0; xx < ow; ++xx) {
          float acc = b[o];
          for (int64_t i = 0; i < cg; ++i)
            for (int64_t ky = 0; ky < p.k; ++ky)
              for (int64_t kx = 0; kx < p.k; ++kx) {
                const int64_t sy = yy * p.stride - p.pad + ky * p.dilation;
                const int64_t sx = xx * p.stride - p.pad + kx * p.dilation;
                if (sy < 0 || sy >= p.h || sx < 0 || sx >= p.w) continue;
                const int64_t ci = o / mg * cg + i;
                acc += x[((bi * p.c + ci) * p.h + sy) * p.w + sx] *
                       wt[((o * cg + i) * p.k + ky) * p.k + kx];
              }
          y[((bi * p.m + o) * oh + yy) * ow + xx] = acc;
        }
  return y;
}

void check_conv(const ConvCase& p) {
  const int64_t dk = (p.k - 1) * p.dilation + 1;
  const int64_t oh = (p.h + 2 * p.pad - dk) / p.stride + 1, ow = (p.w + 2 * p.pad - dk) / p.stride + 1;
  const TensorType x{DType::kFloat32, {p.n, p.c, p.h, p.w}};
  const TensorType wt{DType::kFloat32, {p.m, p.c / p.group, p.k, p.k}};
  const TensorType b{DType::kFloat32, {p.m}}, y{DType::kFloat32, {p.n, p.m, oh, ow}};
  const auto xd = testing::wave(x.numel(), 1.f), wd = testing::wave(wt.numel(), 0.3f), bd = testing::wave(p.m, 0.1f);
  Node node;
  node.op_type = "Conv";
  node.attrs = {{"group", p.group},
                {"strides", std::vector<int64_t>{p.stride, p.stride}},
                {"dilations", std::vector<int64_t>{p.dilation, p.dilation}},
                {"pads", std::vector<int64_t>{p.pad, p.pad, p.pad, p.pad}}};
  const auto have = run_node(node, cpu::make_conv, {x, wt, b}, {xd, wd, bd}, y);
  testing::expect_near_all(have, conv_loop(p, xd, wd, bd, oh, ow));
}

TEST(Conv, GroupedMatchesLoop) { check_conv({2, 8, 9, 9, 12, 4, 3, 1, 1, 1}); }
TEST(Conv, DepthwiseStridedMatchesLoop) { check_conv({2, 16, 10, 10, 16, 16, 3, 2, 1, 1}); }
// 24 channels: the 16-channel blocks of a depthwise conv's layout (build_conv) end half full.
TEST(Conv, DepthwiseOnPartialChannelBlocksMatchesLoop) { check_conv({3, 24, 9, 9, 24, 24, 3, 2, 1, 1}); }
// A depthwise conv of stride 1 on fewer than 16 channels whose output rows are 16 wide or more
// runs as a loop of pipetrain's own (DepthwisePlaneConv) on each copy this CPU runs: MobileNetV2's
// 8 channels of 16x16, a row of 20 (a partial last block of 16) under 5x5 pads, a 7x7 on 28x28
// (27 rows: 8 at a time, then 3 one by one), a row of 31 unpadded.
TEST(Conv, DepthwisePlaneLoopMatchesLoop) {
  testing::on_every_copy([&](const std::string&) {
    check_conv({2, 8, 16, 16, 8, 8, 3, 1, 1, 1});
    check_conv({3, 12, 9, 20, 12, 12, 5, 1, 1, 2});
    check_conv({1, 8, 27, 28, 8, 8, 7, 1, 1, 3});
    check_conv({2, 4, 5, 33, 4, 4, 3, 1, 1, 0});
  });
}
// MobileNetV2's late 3x3 depthwise convolutions on maps of at most 4 pixels, 16 channels or more,
// run as pipetrain's own loop (DepthwiseSmallMaps) on each copy this CPU runs: 96 channels of 2x2,
// 144 of 2x2 to 1x1 at stride 2, 240 of 1x1, and 24 (a last block of 8) of 1x4 under a 5x5 window.
TEST(Conv, DepthwiseSmallMapsMatchLoop) {
  testing::on_every_copy([&](const std::string&) {
    check_conv({8, 96, 2, 2, 96, 96, 3, 1, 1, 1});
    check_conv({8, 144, 2, 2, 144, 144, 3, 2, 1, 1});
    check_conv({8, 240, 1, 1, 240, 240, 3, 1, 1, 1});
    check_conv({3, 24, 1, 4, 24, 24, 5, 1, 1, 2});
  });
}
// A 1x1 conv on one pixel per image with W an input, as in training: one matrix product
// (build_pixel_product), here at MobileNetV2's last conv's shape, and on a 1x1 map at stride 2.
TEST(Conv, PointwiseOnOnePixelMatchesLoop) {
  check_conv({8, 80, 1, 1, 1280, 1, 1, 1, 1, 0});
  check_conv({3, 7, 1, 1, 5, 1, 1, 2, 1, 0});
}
// 1x1 convs on planes of at most 16 pixels take oneDNN's blocked kernel (pointwise_on_plain_layouts,
// dnnl_util.h): MobileNetV2's 16 -> 96 expansion at 2x2, 8 -> 48 at 4x4, channels short of a block
// at 3x3; at 5x5 the plain GEMM again.
TEST(Conv, PointwiseOnSmallPlanesMatchesLoop) {
  check_conv({8, 16, 2, 2, 96, 1, 1, 1, 1, 0});
  check_conv({8, 8, 4, 4, 48, 1, 1, 1, 1, 0});
  check_conv({2, 5, 3, 3, 7, 1, 1, 1, 1, 0});
  check_conv({2, 24, 5, 5, 40, 1, 1, 1, 1, 0});
}
TEST(Conv, DilatedMatchesLoop) { check_conv({1, 3, 11, 11, 5, 1, 3, 1, 2, 2}); }
TEST(Conv, WideChannelsMatchLoop) { check_conv({2, 32, 7, 7, 64, 1, 3, 1, 1, 1}); }
// Images (at most 4 channels) are read in their plain layout (build_conv's kFewChannels): a
// ResNet's 7x7 stride-2 stem on RGB and a 3x3 one on RGBA.
TEST(Conv, ImageStemsMatchLoop) {
  check_conv({2, 3, 16, 16, 8, 1, 7, 2, 1, 3});
  check_conv({3, 4, 12, 12, 16, 1, 3, 1, 1, 1});
}

// MaxPool with dilation 2 on a 5x5 ramp: each output is the max of the 4 corners of a 3x3.
TEST(MaxPool, DilatedMatchesLoop) {
  const TensorType x{DType::kFloat32, {1, 1, 5, 5}}, y{DType::kFloat32, {1, 1, 3, 3}};
  const auto xd = testing::wave(25, 1.f);
  Node node;
  node.op_type = "MaxPool";
  node.attrs = {{"kernel_shape", std::vector<int64_t>{2, 2}},
                {"dilations", std::vector<int64_t>{2, 2}}};
  const auto have = run_node(node, cpu::make_max_pool, {x}, {xd}, y);
  ASSERT_EQ(have.size(), 9u);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      const float want = std::max({xd[i * 5 + j], xd[i * 5 + j + 2], xd[(i + 2) * 5 + j],
                                   xd[(i + 2) * 5 + j + 2]});
      EXPECT_EQ(have[i * 3 + j], want) << i << "," << j;
    }
}

// training_mode=1 on (3, 5, 37): batch statistics over 111 values per channel (not a multiple
// of the 16 summation lanes) and the running statistics, against the definition in double.
TEST(BatchNormalization, TrainingMatchesDefinition) {
  const int64_t n = 3, c = 5, s = 37;
  const TensorType x{DType::kFloat32, {n, c, s}}, ch{DType::kFloat32, {c}};
  const auto xd = testing::wave(x.numel(), 3.f), scale = testing::wave(c, 1.f), bias = testing::wave(c + 1, 0.5f);
  const std::vector<float> mean_in(5, 0.25f), var_in(5, 2.f);
  std::vector<float> want_y(static_cast<size_t>(x.numel())), want_mean(5), want_var(5);
  for (int64_t k = 0; k < c; ++k) {
    double m = 0, v = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) m += xd[(b * c + k) * s + i];
    m /= n * s;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) v += std::pow(xd[(b * c + k) * s + i] - m, 2);
    v /= n * s;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) {
        const int64_t at = (b * c + k) * s + i;
        want_y[at] = float((xd[at] - m) / std::sqrt(v + 1e-3) * scale[k] + bias[k]);
      }
    want_mean[k] = float(0.25 * 0.8 + m * 0.2);
    want_var[k] = float(2.0 * 0.8 + v * 0.2);
  }
  Node node;
  node.op_type = "BatchNormalization";
  node.attrs = {{"training_mode", int64_t{1}}, {"epsilon", 1e-3f}, {"momentum", 0.8f}};
  const auto outs = run_node(node, cpu::make_batch_norm, {x, ch, ch, ch, ch},
                             {xd, scale, bias, mean_in, var_in}, {x, ch, ch});
  ASSERT_EQ(outs.size(), 3u);
  testing::expect_near_all(outs[0], want_y);
  testing::expect_near_all(outs[1], want_mean);
  testing::expect_near_all(outs[2], want_var);
}

// (N, C, H, W) data to (N, H, W, C) and back.
std::vector<float> to_channels_last(const std::vector<float>& x, const Dims& d, bool back = false) {
  std::vector<float> y(x.size());
  const int64_t c = d[1], s = d[2] * d[3];
  for (int64_t n = 0; n < d[0]; ++n)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t p = 0; p < s; ++p) {
        const size_t plain = static_cast<size_t>((n * c + k) * s + p), last = static_cast<size_t>((n * s + p) * c + k);
        (back ? y[plain] : y[last]) = x[back ? last : plain];
      }
  return y;
}

// Between convs a BatchNormalization reads and writes channels-last data (exec/channels_last.h);
// it gives the plain kernel's bits, Y and the running statistics, in training and inference
// mode: on pixels in whole lanes of 16 and not (5 x 7 = 35, and 3 x 3 below a lane's width), on
// channels in one block of 64 or more (70), and on data large enough to be split over threads.
TEST(BatchNormalization, ChannelsLastGivesThePlainBits) {
  for (const Dims& d : {Dims{3, 70, 5, 7}, Dims{2, 16, 3, 3}, Dims{8, 64, 16, 16}})
    for (const bool training : {true, false}) {
      const TensorType x{DType::kFloat32, d}, ch{DType::kFloat32, {d[1]}};
      const std::vector<float> xd = testing::wave(x.numel(), 3.f);
      std::vector<float> var_in = testing::wave(d[1], 1.f);
      for (float& v : var_in) v = 0.5f + v * v;
      const std::vector<std::vector<float>> data = {xd, testing::wave(d[1], 1.f), testing::wave(d[1] + 1, 0.5f),
                                                    testing::wave(d[1] + 2, 0.25f), var_in};
      Node node;
      node.op_type = "BatchNormalization";
      node.attrs = {{"training_mode", int64_t{training}}, {"epsilon", 1e-3f}, {"momentum", 0.8f}};
      const std::vector<TensorType> outs = training ? std::vector<TensorType>{x, ch, ch} : std::vector<TensorType>{x};
      const auto plain = run_node(node, cpu::make_batch_norm, {x, ch, ch, ch, ch}, data, outs);
      std::vector<std::vector<float>> last_data = data;
      last_data[0] = to_channels_last(xd, d);
      const auto last = run_node(node, cpu::make_batch_norm, {x, ch, ch, ch, ch}, last_data, outs, true);
      ASSERT_EQ(plain.size(), outs.size());
      ASSERT_EQ(last.size(), outs.size());
      EXPECT_EQ(to_channels_last(last[0], d, true), plain[0]) << d[1] << " channels, training " << training;
      for (size_t k = 1; k < outs.size(); ++k) EXPECT_EQ(last[k], plain[k]) << "running statistic " << k;
    }
}

// At the end of a chain GlobalAveragePool reads channels-last X as it is, with the plain bits.
TEST(GlobalAveragePool, ChannelsLastGivesThePlainBits) {
  for (const Dims& d : {Dims{3, 70, 5, 7}, Dims{2, 16, 3, 3}, Dims{8, 64, 16, 16}}) {
    const TensorType x{DType::kFloat32, d}, y{DType::kFloat32, {d[0], d[1], 1, 1}};
    const std::vector<float> xd = testing::wave(x.numel(), 3.f);
    Node node;
    node.op_type = "GlobalAveragePool";
    const std::vector<float> plain = run_node(node, cpu::make_global_average_pool, {x}, {xd}, y);
    const auto last = run_node(node, cpu::make_global_average_pool, {x}, {to_channels_last(xd, d)}, {y}, true);
    ASSERT_EQ(last.size(), 1u);
    EXPECT_EQ(last[0], plain) << d[1] << " channels of " << d[2] << "x" << d[3];
  }
}

}  // namespace
}  // namespace pt
