// tests/exec/movement_test.cc: the movement and reduction kernels (exec/cpu/movement.cc,
// exec/cpu/reduce.cc) against ONNX's node conformance cases, and hand cases against their
// definitions: shapes big enough to take the parallel and tiled paths, bool and int64 data,
// reductions on every path, Gather as an embedding and its out-of-range error.
#include <gtest/gtest.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "exec/cpu/cpu_kernels.h"
#include "tests/exec/node_case.h"

namespace pt::cpu {
namespace {

using pt::testing::NodeCaseResult;

// One op family: the case-name prefix, the factory, the fewest cases that must pass, and names
// containing `exclude`: other ops (gather_elements, reduce_sum_square) or inputs that are not
// tensors (identity_opt: optional, identity_sequence: sequence), which run_node_case cannot load.
struct OpCases {
  std::string op;
  std::string prefix;
  KernelFactory factory;
  int min_passed;
  std::vector<std::string> exclude;
};

const std::vector<OpCases>& op_cases() {
  static const std::vector<OpCases> ops = {
      {"Reshape", "test_reshape", make_reshape, 10, {}},
      {"Flatten", "test_flatten", make_reshape, 9, {}},
      {"Squeeze", "test_squeeze", make_reshape, 2, {}},
      {"Unsqueeze", "test_unsqueeze", make_reshape, 7, {}},
      {"Identity", "test_identity", make_reshape, 1, {"identity_opt", "identity_sequence"}},
      {"Transpose", "test_transpose", make_transpose, 7, {}},
      {"Concat", "test_concat", make_concat, 12, {}},
      {"Split", "test_split", make_split, 7, {}},
      {"Slice", "test_slice", make_slice, 8, {}},
      {"Gather", "test_gather", make_gather, 4, {"gather_elements", "gathernd"}},
      {"Expand", "test_expand", make_expand, 2, {}},
      {"ReduceMean", "test_reduce_mean", make_reduce_mean, 8, {}},
      {"ReduceSum", "test_reduce_sum", make_reduce_sum, 10, {"reduce_sum_square"}},
  };
  return ops;
}

using pt::testing::NodeCase;

std::vector<NodeCase> cases_of(const OpCases& op) {
  return pt::testing::op_cases(op.prefix, op.factory, op.exclude);
}

std::vector<NodeCase> all_cases() {
  std::vector<NodeCase> out;
  for (const OpCases& op : op_cases())
    for (const NodeCase& c : cases_of(op)) out.push_back(c);
  return out;
}

class MovementNodeCase : public ::testing::TestWithParam<NodeCase> {};

TEST_P(MovementNodeCase, MatchesReference) {
  const NodeCaseResult r = pt::testing::run_node_case(GetParam().name, GetParam().factory);
  if (r.kind == NodeCaseResult::kSkipped) GTEST_SKIP() << r.message;
  EXPECT_EQ(r.kind, NodeCaseResult::kPassed) << r.message;
}

INSTANTIATE_TEST_SUITE_P(Onnx, MovementNodeCase, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<NodeCase>& info) { return info.param.name; });

// Skips cannot make the suite pass: each op must pass at least its floor of cases.
TEST(MovementNodeCases, EnoughPassPerOp) {
  for (const OpCases& op : op_cases())
    EXPECT_GE(pt::testing::count_passed(cases_of(op)), op.min_passed) << op.op;
}

// A one-node graph for hand cases: inputs are typed byte blobs, constant ones (shapes, axes,
// tables) become initializers so spec.constant(i) sees them.
struct OneNode {
  Graph g;
  Node node;
  std::vector<std::vector<std::byte>> in_data;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  CpuContext ctx{&engine, &stream, 2};

  OneNode(const std::string& op, const std::string& name) {
    node.op_type = op;
    node.name = name;
  }
  void input(const TensorType& t, std::vector<std::byte> bytes, bool constant = false) {
    const std::string name = "in" + std::to_string(node.inputs.size());
    if (constant) {
      node.inputs.push_back(g.add_initializer(name, Tensor{t, bytes}, true));
    } else {
      node.inputs.push_back(g.add_value(name, t));
      g.inputs.push_back(node.inputs.back());
    }
    in_data.push_back(std::move(bytes));
  }
  void output(const TensorType& t) {
    node.outputs.push_back(g.add_value("out" + std::to_string(node.outputs.size()), t));
  }
  std::unique_ptr<Kernel> make(KernelFactory factory, int threads = 2) {
    ctx = {&engine, &stream, threads};  // this object may have moved since construction
    if (g.nodes.empty()) {
      g.add_node(node);
      g.outputs = node.outputs;
      g.rebuild_uses();
    }
    KernelSpec spec{g, g.nodes[0], {}, {}, &ctx};
    for (ValueId v : node.inputs) spec.inputs.push_back(g.value(v).type);
    for (ValueId v : node.outputs) spec.outputs.push_back(g.value(v).type);
    return factory(spec);
  }
  // Runs `k` on in_data; returns the outputs' bytes.
  std::vector<std::vector<std::byte>> run(Kernel& k) {
    std::vector<Buffer> ins, outs;
    for (size_t i = 0; i < node.inputs.size(); ++i)
      ins.push_back({in_data[i].data(), &g.value(node.inputs[i]).type});
    std::vector<std::vector<std::byte>> out(node.outputs.size());
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const TensorType& t = g.value(node.outputs[i]).type;
      out[i].assign(static_cast<size_t>(t.bytes()), std::byte{0xAB});
      outs.push_back({out[i].data(), &t});
    }
    std::vector<std::byte> scratch(k.scratch_bytes());
    k.run(ins, outs, scratch.data());
    stream.wait();
    return out;
  }
};

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <class T>
std::vector<T> values_of(const std::vector<std::byte>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// 0, 1, 2, ... as T; for bool data (T = uint8_t), every third element true.
template <class T>
std::vector<T> iota_of(int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::is_same_v<T, uint8_t> ? T(i % 3 == 0) : T(i);
  return v;
}

TensorType i64_type(size_t n) { return {DType::kInt64, {static_cast<int64_t>(n)}}; }

// Multi-index of a row-major flat index.
std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

// Transpose of a tensor big enough to run in parallel, against the definition
// out[i] = in[j] with j[perm[k]] = i[k].
template <class T>
void check_transpose(DType dtype, const std::vector<int64_t>& shape,
                     const std::vector<int64_t>& perm) {
  std::vector<int64_t> out_shape;
  for (int64_t p : perm) out_shape.push_back(shape[p]);
  const std::vector<T> x = iota_of<T>(TensorType{dtype, shape}.numel());
  OneNode n("Transpose", "t");
  n.node.attrs["perm"] = perm;
  n.input({dtype, shape}, bytes_of(x));
  n.output({dtype, out_shape});
  std::unique_ptr<Kernel> k = n.make(make_transpose);
  ASSERT_NE(k, nullptr);
  const std::vector<T> y = values_of<T>(n.run(*k)[0]);
  for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) {
    const std::vector<int64_t> oi = unravel(i, out_shape);
    std::vector<int64_t> ii(shape.size());
    for (size_t d = 0; d < perm.size(); ++d) ii[perm[d]] = oi[d];
    ASSERT_EQ(y[i], x[ravel(ii, shape)]) << "output element " << i;
  }
}

TEST(Transpose, HeadsSplitBSHDtoBHSD) { check_transpose<float>(DType::kFloat32, {2, 64, 8, 32}, {0, 2, 1, 3}); }
TEST(Transpose, LastTwoSwapInt64) { check_transpose<int64_t>(DType::kInt64, {3, 50, 45}, {0, 2, 1}); }
TEST(Transpose, NchwToNhwc) { check_transpose<float>(DType::kFloat32, {2, 16, 20, 24}, {0, 2, 3, 1}); }
// 4-byte elements move through 8 x 8 register blocks (exec/cpu/movement.cc) with the edges
// element by element: sizes that leave remainders along both dims, and int32 bits.
TEST(Transpose, LastTwoSwapFloatBlocksAndEdges) { check_transpose<float>(DType::kFloat32, {3, 50, 45}, {0, 2, 1}); }
TEST(Transpose, KeysToColumnsInt32) { check_transpose<int32_t>(DType::kInt32, {2, 40, 4, 64}, {0, 2, 3, 1}); }
TEST(Transpose, ReversedBool) { check_transpose<uint8_t>(DType::kBool, {70, 33, 41}, {2, 1, 0}); }

// Slice with negative and positive steps on both axes of a [64, 300] float tensor.
TEST(Slice, StepsBothWays) {
  const std::vector<int64_t> shape = {64, 300};
  const std::vector<float> x = iota_of<float>(64 * 300);
  OneNode n("Slice", "s");
  n.input({DType::kFloat32, shape}, bytes_of(x));
  n.input(i64_type(2), bytes_of(std::vector<int64_t>{5, -1}), true);       // starts
  n.input(i64_type(2), bytes_of(std::vector<int64_t>{60, -1000}), true);   // ends
  n.input(i64_type(2), bytes_of(std::vector<int64_t>{0, 1}), true);        // axes
  n.input(i64_type(2), bytes_of(std::vector<int64_t>{2, -3}), true);       // steps
  n.output({DType::kFloat32, {28, 100}});  // rows 5, 7, .., 59; columns 299, 296, .., 2
  std::unique_ptr<Kernel> k = n.make(make_slice);
  ASSERT_NE(k, nullptr);
  const std::vector<float> y = values_of<float>(n.run(*k)[0]);
  for (int64_t r = 0; r < 28; ++r)
    for (int64_t c = 0; c < 100; ++c)
      ASSERT_EQ(y[r * 100 + c], x[(5 + 2 * r) * 300 + (299 - 3 * c)]) << r << "," << c;
}

TEST(Slice, DeclinesStepZero) {
  OneNode n("Slice", "s");
  n.input({DType::kFloat32, {4}}, bytes_of(iota_of<float>(4)));
  n.input(i64_type(1), bytes_of(std::vector<int64_t>{0}), true);
  n.input(i64_type(1), bytes_of(std::vector<int64_t>{4}), true);
  n.input(i64_type(1), bytes_of(std::vector<int64_t>{0}), true);
  n.input(i64_type(1), bytes_of(std::vector<int64_t>{0}), true);
  n.output({DType::kFloat32, {4}});
  EXPECT_EQ(n.make(make_slice), nullptr);
}

// A causal mask [1, 1, 64, 64] bool broadcast to [4, 8, 64, 64].
TEST(Expand, BoolMaskOverBatchAndHeads) {
  const std::vector<uint8_t> m = iota_of<uint8_t>(64 * 64);
  OneNode n("Expand", "e");
  n.input({DType::kBool, {1, 1, 64, 64}}, bytes_of(m));
  n.input(i64_type(4), bytes_of(std::vector<int64_t>{4, 8, 1, 64}), true);
  n.output({DType::kBool, {4, 8, 64, 64}});
  std::unique_ptr<Kernel> k = n.make(make_expand);
  ASSERT_NE(k, nullptr);
  const std::vector<uint8_t> y = values_of<uint8_t>(n.run(*k)[0]);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], m[i % m.size()]) << i;
}

// Concat of int64 [8, a_k, 1000] on axis 1, then Split back into the same parts.
TEST(ConcatSplit, RoundTripInt64) {
  const std::vector<int64_t> parts = {3, 1, 5};
  OneNode c("Concat", "c");
  c.node.attrs["axis"] = int64_t{-2};
  std::vector<std::vector<int64_t>> xs;
  for (int64_t a : parts) {
    std::vector<int64_t> x = iota_of<int64_t>(8 * a * 1000);
    for (int64_t& v : x) v += 1000000 * a;
    c.input({DType::kInt64, {8, a, 1000}}, bytes_of(x));
    xs.push_back(std::move(x));
  }
  c.output({DType::kInt64, {8, 9, 1000}});
  std::unique_ptr<Kernel> ck = c.make(make_concat);
  ASSERT_NE(ck, nullptr);
  const std::vector<std::byte> joined = c.run(*ck)[0];
  const std::vector<int64_t> y = values_of<int64_t>(joined);
  EXPECT_EQ(y[(0 * 9 + 3) * 1000 + 7], xs[1][7]);
  EXPECT_EQ(y[(7 * 9 + 8) * 1000 + 999], xs[2][(7 * 5 + 4) * 1000 + 999]);

  OneNode s("Split", "s");
  s.node.attrs["axis"] = int64_t{1};
  s.input({DType::kInt64, {8, 9, 1000}}, joined);
  s.input(i64_type(3), bytes_of(parts), true);
  for (int64_t a : parts) s.output({DType::kInt64, {8, a, 1000}});
  std::unique_ptr<Kernel> sk = s.make(make_split);
  ASSERT_NE(sk, nullptr);
  const std::vector<std::vector<std::byte>> back = s.run(*sk);
  for (size_t k = 0; k < parts.size(); ++k) EXPECT_EQ(values_of<int64_t>(back[k]), xs[k]) << k;
}

// ReduceMean (axes attribute) and ReduceSum (axes input) on x [8, 64, 96] against double sums:
// the innermost axis (LayerNorm statistics), leading axes (bias gradients), the middle one, two
// separate blocks, and all axes.
void check_reduce(const std::vector<int64_t>& axes, bool keepdims) {
  const std::vector<int64_t> shape = {8, 64, 96};
  std::vector<float> x(8 * 64 * 96);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 10.f - 5.f;
  std::vector<bool> reduced(3, axes.empty());
  for (int64_t a : axes) reduced[a < 0 ? a + 3 : a] = true;
  std::vector<int64_t> out_shape, kept_shape;
  for (size_t d = 0; d < 3; ++d) {
    kept_shape.push_back(reduced[d] ? 1 : shape[d]);
    if (!reduced[d] || keepdims) out_shape.push_back(kept_shape.back());
  }
  std::vector<double> want(static_cast<size_t>(TensorType{DType::kFloat32, kept_shape}.numel()));
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
    std::vector<int64_t> idx = unravel(i, shape);
    for (size_t d = 0; d < 3; ++d)
      if (reduced[d]) idx[d] = 0;
    want[ravel(idx, kept_shape)] += x[i];
  }
  const double count = static_cast<double>(x.size()) / static_cast<double>(want.size());
  for (const bool mean : {true, false}) {
    OneNode n(mean ? "ReduceMean" : "ReduceSum", "r");
    n.node.attrs["keepdims"] = int64_t{keepdims};
    n.input({DType::kFloat32, shape}, bytes_of(x));
    if (mean && !axes.empty()) n.node.attrs["axes"] = axes;
    if (!mean) n.input(i64_type(axes.size()), bytes_of(axes), true);
    n.output({DType::kFloat32, out_shape});
    std::unique_ptr<Kernel> k = n.make(mean ? make_reduce_mean : make_reduce_sum);
    ASSERT_NE(k, nullptr);
    const std::vector<float> y = values_of<float>(n.run(*k)[0]);
    ASSERT_EQ(y.size(), want.size());
    for (size_t j = 0; j < y.size(); ++j) {
      const double w = mean ? want[j] / count : want[j];
      ASSERT_NEAR(y[j], w, 1e-5 * count + 1e-4 * std::abs(w)) << (mean ? "mean " : "sum ") << j;
    }
  }
}

TEST(Reduce, InnermostAxis) { check_reduce({-1}, true); }
TEST(Reduce, LeadingAxes) { check_reduce({0, 1}, false); }
TEST(Reduce, MiddleAxis) { check_reduce({1}, true); }
TEST(Reduce, SeparateAxes) { check_reduce({0, 2}, false); }
TEST(Reduce, AllAxes) { check_reduce({}, false); }

// A bias gradient, dY [1024, 256] summed over its rows: both threads take a block of columns,
// and the bits are those of one thread.
TEST(Reduce, RowSumsSameBitsOnOneAndTwoThreads) {
  std::vector<float> x(1024 * 256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1009) / 97.f - 5.f;
  std::vector<std::vector<float>> sums;
  for (const int threads : {1, 2}) {
    OneNode n("ReduceSum", "db");
    n.input({DType::kFloat32, {1024, 256}}, bytes_of(x));
    n.input(i64_type(1), bytes_of(std::vector<int64_t>{0}), true);
    n.output({DType::kFloat32, {256}});
    n.node.attrs["keepdims"] = int64_t{0};
    std::unique_ptr<Kernel> k = n.make(make_reduce_sum, threads);
    ASSERT_NE(k, nullptr);
    sums.push_back(values_of<float>(n.run(*k)[0]));
  }
  ASSERT_EQ(sums[0].size(), 256u);
  EXPECT_EQ(std::memcmp(sums[0].data(), sums[1].data(), 256 * sizeof(float)), 0);
  double want = 0;
  for (int64_t r = 0; r < 1024; ++r) want += x[static_cast<size_t>(r * 256 + 3)];
  EXPECT_NEAR(sums[1][3], want, 1e-3);
}

// A convolution's bias gradient, dY [N, C, H, W] summed to [C], bit for bit what `plane_sum`
// gives each plane, the planes added image after image.
void expect_plane_sums(const std::vector<int64_t>& shape, float (*plane_sum)(const float*, int64_t)) {
  const int64_t n = shape[0], c = shape[1], pixels = shape[2] * shape[3];
  std::vector<float> x(static_cast<size_t>(n * c * pixels));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1009) / 97.f - 5.f;
  std::vector<float> want(static_cast<size_t>(c), 0.f);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      want[static_cast<size_t>(ch)] += plane_sum(&x[static_cast<size_t>((b * c + ch) * pixels)], pixels);
  OneNode node("ReduceSum", "db");
  node.input({DType::kFloat32, shape}, bytes_of(x));
  node.input(i64_type(3), bytes_of(std::vector<int64_t>{0, 2, 3}), true);
  node.output({DType::kFloat32, {c}});
  node.node.attrs["keepdims"] = int64_t{0};
  std::unique_ptr<Kernel> k = node.make(make_reduce_sum);
  ASSERT_NE(k, nullptr);
  const std::vector<float> y = values_of<float>(node.run(*k)[0]);
  ASSERT_EQ(y.size(), want.size());
  EXPECT_EQ(std::memcmp(y.data(), want.data(), want.size() * sizeof(float)), 0) << shape[2] << "x" << shape[3];
}

// On small planes each plane is summed in order from 0; 70 channels run past one block of 64
// rows, and planes of 4, 3 and 2 pixels take the short-row loops.
TEST(Reduce, ShortPlaneSumsInImageThenPixelOrder) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{3, 70, 2, 2}, {2, 5, 1, 3}, {4, 9, 2, 1}})
    expect_plane_sums(shape, [](const float* plane, int64_t pixels) {
      float sum = 0.f;
      for (int64_t p = 0; p < pixels; ++p) sum += plane[p];
      return sum;
    });
}

// On planes of 8 pixels or more each plane is summed in 8 lanes (lane l takes pixels l, l + 8,
// ...; the lanes added pairwise, then the pixels past the last whole 8); 7x7 leaves a tail.
TEST(Reduce, LongPlaneSumsInLaneOrder) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{3, 70, 16, 16}, {2, 6, 7, 7}, {1, 3, 2, 4}})
    expect_plane_sums(shape, [](const float* plane, int64_t pixels) {
      float lane[8] = {}, tail = 0.f;
      const int64_t whole = pixels / 8 * 8;
      for (int64_t p = 0; p < whole; ++p) lane[p % 8] += plane[p];
      for (int64_t p = whole; p < pixels; ++p) tail += plane[p];
      return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7])) + tail;
    });
}

// noop_with_empty_axes = 1 with no axes: a copy.
TEST(Reduce, NoopWithEmptyAxes) {
  OneNode n("ReduceSum", "s");
  n.node.attrs["noop_with_empty_axes"] = int64_t{1};
  n.input({DType::kFloat32, {4, 5}}, bytes_of(iota_of<float>(20)));
  n.output({DType::kFloat32, {4, 5}});
  std::unique_ptr<Kernel> k = n.make(make_reduce_sum);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(values_of<float>(n.run(*k)[0]), iota_of<float>(20));
}

// An empty input: the sum of nothing is 0.
TEST(Reduce, SumOfEmptyIsZero) {
  OneNode n("ReduceSum", "s");
  n.input({DType::kFloat32, {0, 3}}, {});
  n.input(i64_type(1), bytes_of(std::vector<int64_t>{0}), true);
  n.output({DType::kFloat32, {1, 3}});
  std::unique_ptr<Kernel> k = n.make(make_reduce_sum);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(values_of<float>(n.run(*k)[0]), std::vector<float>(3, 0.f));
}

TEST(Reduce, DeclinesInt64) {
  OneNode n("ReduceSum", "s");
  n.input({DType::kInt64, {2, 3}}, bytes_of(iota_of<int64_t>(6)));
  n.output({DType::kInt64, {1, 1}});
  EXPECT_EQ(n.make(make_reduce_sum), nullptr);
}

// An embedding table wte [50, 8] float32 (row r holds 8r .. 8r+7) and ids [2, 5] int64.
OneNode embedding(const std::vector<int64_t>& ids) {
  OneNode n("Gather", "embed_tokens");
  n.node.attrs["axis"] = int64_t{0};
  n.input({DType::kFloat32, {50, 8}}, bytes_of(iota_of<float>(50 * 8)), true);
  n.input({DType::kInt64, {2, 5}}, bytes_of(ids));
  n.output({DType::kFloat32, {2, 5, 8}});
  return n;
}

TEST(Gather, EmbeddingRows) {
  const std::vector<int64_t> ids = {0, 49, 7, 7, 3, -1, 12, 25, -50, 1};
  OneNode n = embedding(ids);
  std::unique_ptr<Kernel> k = n.make(make_gather);
  ASSERT_NE(k, nullptr);
  const std::vector<float> y = values_of<float>(n.run(*k)[0]);
  ASSERT_EQ(y.size(), 2u * 5u * 8u);
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t row = ids[t] < 0 ? ids[t] + 50 : ids[t];
    for (int64_t d = 0; d < 8; ++d)
      EXPECT_EQ(y[t * 8 + static_cast<size_t>(d)], static_cast<float>(row * 8 + d))
          << "token " << t << " dim " << d;
  }
}

TEST(Gather, OutOfRangeIdIsUserErrorNamingTheNode) {
  OneNode n = embedding({0, 1, 2, 3, 4, 5, 6, 50, 8, 9});
  std::unique_ptr<Kernel> k = n.make(make_gather);
  ASSERT_NE(k, nullptr);
  try {
    n.run(*k);
    FAIL() << "no UserError for id 50 with a vocabulary of 50";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "Gather node 'embed_tokens': index 50 out of range [-50, 50); check the token ids "
                 "against the vocabulary size");
  }
  n.in_data[1] = bytes_of(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, -51, 8, 9});
  EXPECT_THROW(n.run(*k), UserError);
}

TEST(Gather, DeclinesFloatIndices) {
  OneNode n("Gather", "g");
  n.input({DType::kFloat32, {50, 8}}, bytes_of(iota_of<float>(50 * 8)), true);
  n.input({DType::kFloat32, {2, 5}}, bytes_of(iota_of<float>(10)));
  n.output({DType::kFloat32, {2, 5, 8}});
  EXPECT_EQ(n.make(make_gather), nullptr);
}

}  // namespace
}  // namespace pt::cpu
