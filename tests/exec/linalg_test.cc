// tests/exec/linalg_test.cc: MatMul and Gemm against ONNX's node conformance data, and batched
// MatMuls against a plain triple loop.
#include <gtest/gtest.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "tests/exec/isa_cap.h"
#include "tests/exec/node_case.h"

namespace pt {
namespace {

using testing::NodeCaseResult;

using testing::NodeCase;

std::vector<NodeCase> matmul_cases() {
  return testing::op_cases("test_matmul", cpu::make_matmul);
}
std::vector<NodeCase> gemm_cases() { return testing::op_cases("test_gemm", cpu::make_gemm); }

class LinalgConformance : public ::testing::TestWithParam<NodeCase> {};

TEST_P(LinalgConformance, MatchesReference) {
  const NodeCaseResult r = testing::run_node_case(GetParam().name, GetParam().factory);
  if (r.kind == NodeCaseResult::kSkipped) GTEST_SKIP() << r.message;
  EXPECT_EQ(r.kind, NodeCaseResult::kPassed) << r.message;
}

std::string case_name(const ::testing::TestParamInfo<NodeCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(MatMul, LinalgConformance, ::testing::ValuesIn(matmul_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Gemm, LinalgConformance, ::testing::ValuesIn(gemm_cases()), case_name);

// Skips must not hide a broken kernel: every MatMul and Gemm case in ONNX 1.12 passes.
TEST(LinalgConformanceCount, EveryCasePasses) {
  EXPECT_GE(testing::count_passed(matmul_cases()), 3);
  EXPECT_GE(testing::count_passed(gemm_cases()), 11);
}

// Runs one node built by hand (inputs named in0.., one output) through `factory`, twice.
std::vector<float> run_node(Node node, KernelFactory factory, const std::vector<TensorType>& in,
                            const std::vector<std::vector<float>>& data, const TensorType& y) {
  Graph g;
  for (size_t i = 0; i < in.size(); ++i)
    node.inputs.push_back(g.add_value("in" + std::to_string(i), in[i]));
  node.outputs = {g.add_value("y", y)};
  g.add_node(node);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  CpuContext ctx{&engine, &stream, 2};
  const KernelSpec spec{g, g.nodes[0], in, {y}, &ctx};
  const std::unique_ptr<Kernel> k = factory(spec);
  EXPECT_NE(k, nullptr);
  if (!k) return {};
  std::vector<Buffer> ins;
  for (size_t i = 0; i < in.size(); ++i) ins.push_back({const_cast<float*>(data[i].data()), &in[i]});
  std::vector<float> out(static_cast<size_t>(y.numel()));
  const Buffer outs[] = {{out.data(), &y}};
  std::vector<std::byte> scratch(k->scratch_bytes());
  for (int step = 0; step < 2; ++step) {  // twice, as a program would: no state may carry over
    k->run(ins, outs, scratch.data());
    stream.wait();
  }
  return out;
}

std::vector<float> run_matmul(const TensorType& a, const TensorType& b, const TensorType& y,
                              const std::vector<float>& a_data, const std::vector<float>& b_data) {
  Node node;
  node.op_type = "MatMul";
  return run_node(node, cpu::make_matmul, {a, b}, {a_data, b_data}, y);
}

// (2, 4, 8, 16) x (2, 4, 16, 8): attention scores, every batch its own pair.
TEST(MatMul, Batched4dMatchesLoop) {
  const TensorType a{DType::kFloat32, {2, 4, 8, 16}}, b{DType::kFloat32, {2, 4, 16, 8}};
  const TensorType y{DType::kFloat32, {2, 4, 8, 8}};
  const auto ad = testing::wave(a.numel(), 1.f), bd = testing::wave(b.numel(), 0.5f);
  std::vector<float> want(static_cast<size_t>(y.numel()));
  for (int bt = 0; bt < 8; ++bt)
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) {
        float acc = 0;
        for (int k = 0; k < 16; ++k) acc += ad[bt * 128 + i * 16 + k] * bd[bt * 128 + k * 8 + j];
        want[bt * 64 + i * 8 + j] = acc;
      }
  testing::expect_near_all(run_matmul(a, b, y, ad, bd), want);
}

// (2, 8, 16) x (16, 4): a Linear without bias, B shared by every batch.
TEST(MatMul, BroadcastWeightMatchesLoop) {
  const TensorType a{DType::kFloat32, {2, 8, 16}}, b{DType::kFloat32, {16, 4}};
  const TensorType y{DType::kFloat32, {2, 8, 4}};
  const auto ad = testing::wave(a.numel(), 1.f), bd = testing::wave(b.numel(), 0.5f);
  std::vector<float> want(static_cast<size_t>(y.numel()));
  for (int r = 0; r < 16; ++r)
    for (int j = 0; j < 4; ++j) {
      float acc = 0;
      for (int k = 0; k < 16; ++k) acc += ad[r * 16 + k] * bd[k * 4 + j];
      want[r * 4 + j] = acc;
    }
  testing::expect_near_all(run_matmul(a, b, y, ad, bd), want);
}

// (3, 1, 2, 5) x (4, 5, 3): batch dims broadcast both ways to (3, 4).
TEST(MatMul, BatchDimsBroadcastBothWays) {
  const TensorType a{DType::kFloat32, {3, 1, 2, 5}}, b{DType::kFloat32, {4, 5, 3}};
  const TensorType y{DType::kFloat32, {3, 4, 2, 3}};
  const auto ad = testing::wave(a.numel(), 1.f), bd = testing::wave(b.numel(), 0.5f);
  std::vector<float> want(static_cast<size_t>(y.numel()));
  for (int p = 0; p < 3; ++p)
    for (int q = 0; q < 4; ++q)
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) {
          float acc = 0;
          for (int k = 0; k < 5; ++k) acc += ad[p * 10 + i * 5 + k] * bd[q * 15 + k * 3 + j];
          want[((p * 4 + q) * 2 + i) * 3 + j] = acc;
        }
  testing::expect_near_all(run_matmul(a, b, y, ad, bd), want);
}

// (5) x (2, 5, 3) -> (2, 3) and (2, 3, 5) x (5) -> (2, 3): 1-D operands promoted and dropped.
TEST(MatMul, VectorOperands) {
  const TensorType v{DType::kFloat32, {5}}, m{DType::kFloat32, {2, 5, 3}};
  const TensorType mt{DType::kFloat32, {2, 3, 5}}, y{DType::kFloat32, {2, 3}};
  const auto vd = testing::wave(5, 1.f), md = testing::wave(30, 0.5f);
  std::vector<float> want_left(6), want_right(6);
  for (int bt = 0; bt < 2; ++bt)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 5; ++k) {
        want_left[bt * 3 + j] += vd[k] * md[bt * 15 + k * 3 + j];
        want_right[bt * 3 + j] += md[bt * 15 + j * 5 + k] * vd[k];
      }
  testing::expect_near_all(run_matmul(v, m, y, vd, md), want_left);
  testing::expect_near_all(run_matmul(mt, v, y, md, vd), want_right);
}

// Y = 0.5 * A^T @ B^T + 2 * C with A stored (4, 3), B stored (5, 4) and C (3, 1) broadcast
// along rows: the one broadcast the conformance data lacks.
TEST(Gemm, TransposedWithColumnBias) {
  const TensorType a{DType::kFloat32, {4, 3}}, b{DType::kFloat32, {5, 4}};
  const TensorType c{DType::kFloat32, {3, 1}}, y{DType::kFloat32, {3, 5}};
  const auto ad = testing::wave(12, 1.f), bd = testing::wave(20, 0.5f), cd = testing::wave(3, 2.f);
  std::vector<float> want(15);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) {
      float acc = 0;
      for (int k = 0; k < 4; ++k) acc += ad[k * 3 + i] * bd[j * 4 + k];
      want[i * 5 + j] = 0.5f * acc + 2.f * cd[i];
    }
  Node node;
  node.op_type = "Gemm";
  node.attrs = {{"alpha", 0.5f}, {"beta", 2.f}, {"transA", int64_t{1}}, {"transB", int64_t{1}}};
  testing::expect_near_all(run_node(node, cpu::make_gemm, {a, b, c}, {ad, bd, cd}, y), want);
}

// A stored transposed (a weight gradient, X^T @ dY): read in place where oneDNN runs it on a
// brgemm kernel, copied row-major first elsewhere (make_kernel in exec/cpu/linalg.cc), with B as
// stored and transposed, the row bias torch's Linear uses and a scaled full C, against a plain
// loop (on an AVX-512 machine every case takes the in-place path).
TEST(Gemm, TransposedALayoutsMatchLoop) {
  using Dims = std::vector<int64_t>;
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape sh : {Shape{40, 24, 33}, Shape{24, 40, 33}, Shape{32, 32, 17}})
    for (const int64_t trans_b : {0, 1})
      for (const bool full_c : {false, true}) {
        const int64_t m = sh.m, n = sh.n, k = sh.k;
        const TensorType a{DType::kFloat32, {k, m}}, y{DType::kFloat32, {m, n}};
        const TensorType b{DType::kFloat32, trans_b ? Dims{n, k} : Dims{k, n}};
        const TensorType c{DType::kFloat32, full_c ? Dims{m, n} : Dims{n}};
        const auto ad = testing::wave(a.numel(), 1.f), bd = testing::wave(b.numel(), 0.5f);
        const auto cd = testing::wave(c.numel(), 2.f);
        const float alpha = full_c ? 0.5f : 1.f, beta = full_c ? 2.f : 1.f;
        std::vector<float> want(static_cast<size_t>(m * n));
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            float acc = 0;
            for (int64_t q = 0; q < k; ++q)
              acc += ad[q * m + i] * (trans_b ? bd[j * k + q] : bd[q * n + j]);
            want[i * n + j] = alpha * acc + beta * (full_c ? cd[i * n + j] : cd[j]);
          }
        Node node;
        node.op_type = "Gemm";
        node.attrs = {
            {"alpha", alpha}, {"beta", beta}, {"transA", int64_t{1}}, {"transB", trans_b}};
        SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                     " transB " + std::to_string(trans_b) + (full_c ? " full C" : " row bias"));
        testing::expect_near_all(run_node(node, cpu::make_gemm, {a, b, c}, {ad, bd, cd}, y), want);
      }
}

TEST(MatMul, DeclinesMismatchedInnerDims) {
  Graph g;
  Node node;
  node.op_type = "MatMul";
  const TensorType a{DType::kFloat32, {2, 3}}, b{DType::kFloat32, {4, 5}};
  const TensorType y{DType::kFloat32, {2, 5}};
  node.inputs = {g.add_value("a", a), g.add_value("b", b)};
  node.outputs = {g.add_value("y", y)};
  g.add_node(node);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  CpuContext ctx{&engine, &stream, 2};
  EXPECT_EQ(cpu::make_matmul(KernelSpec{g, g.nodes[0], {a, b}, {y}, &ctx}), nullptr);
}

// A small product of an inference program (B constant, laid out once: small_product.cc): Gemm
// with B transposed and a row bias, and MatMul of a 3-D A, each plain, with a Relu, a Clip, or
// (MatMul) the Add of a row bias fed at run time, against a plain loop; on each copy this CPU
// runs (PT_MAX_CPU_ISA), the AVX2 one giving the AVX-512 one's bits. 7 rows and 70 columns: a
// group of four rows and three alone, a block of 64 columns (AVX2: four of 16) and 6 more.
TEST(SmallProduct, EveryFormMatchesLoop) {
  using Dims = std::vector<int64_t>;
  constexpr int64_t m = 7, k = 33, n = 70;
  const auto ad = testing::wave(m * k, 1.f), bd = testing::wave(k * n, 0.5f), bias = testing::wave(n, 2.f);
  std::map<std::string, std::vector<float>> widest;  // by form: the first copy's output
  const testing::IsaCap cap;  // the isa_avx2 run's, put back at the end
  for (const char* isa : {"", "avx2", "sse2"})
  for (const bool gemm : {true, false})
    for (const std::string epilogue : {"", "Relu", "Clip", "Add"}) {
      if (gemm && epilogue == "Add") continue;
      const std::string form = std::string(gemm ? "Gemm" : "MatMul") + (epilogue.empty() ? "" : " + " + epilogue);
      SCOPED_TRACE(form + " on " + (*isa ? isa : "the widest copy"));
      cap.set(isa);
      Graph g;
      const TensorType at{DType::kFloat32, gemm ? Dims{m, k} : Dims{1, m, k}};
      const TensorType bt{DType::kFloat32, gemm ? Dims{n, k} : Dims{k, n}};  // Gemm: transB
      const TensorType yt{DType::kFloat32, gemm ? Dims{m, n} : Dims{1, m, n}};
      const TensorType rt{DType::kFloat32, {n}};
      Node node;
      node.op_type = gemm ? "Gemm" : "MatMul";
      node.inputs = {g.add_value("a", at), g.add_value("b", bt)};
      auto w = std::make_shared<Tensor>();
      w->type = bt;
      w->data.resize(static_cast<size_t>(bt.bytes()));
      for (int64_t p = 0; p < k; ++p)  // B (k, n) as the loop reads it; stored (n, k) for Gemm
        for (int64_t j = 0; j < n; ++j) w->as<float>()[gemm ? j * k + p : p * n + j] = bd[p * n + j];
      g.values[static_cast<size_t>(node.inputs[1])].init = w;
      if (gemm) {
        node.inputs.push_back(g.add_value("c", rt));
        auto c = std::make_shared<Tensor>();
        c->type = rt;
        c->data.resize(static_cast<size_t>(rt.bytes()));
        std::memcpy(c->data.data(), bias.data(), static_cast<size_t>(rt.bytes()));
        g.values[static_cast<size_t>(node.inputs[2])].init = c;
        node.attrs = {{"transB", int64_t{1}}};
      }
      node.outputs = {g.add_value("y", yt)};
      g.add_node(node);
      Node e;
      e.op_type = epilogue;
      e.inputs = {node.outputs[0]};
      if (epilogue == "Add") e.inputs.push_back(g.add_value("bias", rt));
      if (epilogue == "Clip") {
        e.inputs.push_back(g.add_value("lo", {DType::kFloat32, {}}));
        e.inputs.push_back(g.add_value("hi", {DType::kFloat32, {}}));
        for (const auto& [v, x] : {std::pair{e.inputs[1], -0.5f}, std::pair{e.inputs[2], 1.5f}}) {
          auto t = std::make_shared<Tensor>();
          t->type = {DType::kFloat32, {}};
          t->data.resize(4);
          t->as<float>()[0] = x;
          g.values[static_cast<size_t>(v)].init = t;
        }
      }
      e.outputs = {g.add_value("z", yt)};
      g.add_node(e);
      dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      dnnl::stream stream(engine);
      CpuContext ctx{&engine, &stream, 1};
      std::vector<TensorType> in = {at, bt};
      if (gemm) in.push_back(rt);
      KernelSpec spec{g, g.nodes[0], in, {yt}, &ctx};
      spec.constants_fixed = true;
      std::vector<TensorType> e_in = {yt};
      for (size_t i = 1; i < e.inputs.size(); ++i) e_in.push_back(g.value(e.inputs[i]).type);
      const KernelSpec epi{g, g.nodes[1], e_in, {yt}, &ctx};
      if (!epilogue.empty()) spec.epilogue = &epi;
      const std::unique_ptr<Kernel> kernel = cpu::make_small_product(spec);
      ASSERT_NE(kernel, nullptr);
      std::vector<float> y(static_cast<size_t>(m * n));
      std::vector<Buffer> ins = {{const_cast<float*>(ad.data()), &at}, {w->data.data(), &bt}};
      if (gemm) ins.push_back({const_cast<float*>(bias.data()), &rt});
      if (epilogue == "Add") ins.push_back({const_cast<float*>(bias.data()), &rt});
      if (epilogue == "Clip") ins.insert(ins.end(), {Buffer{}, Buffer{}});  // constants: read when made
      const Buffer outs[] = {{y.data(), &yt}};
      kernel->run(ins, outs, nullptr);
      std::vector<float> want(static_cast<size_t>(m * n));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          float acc = 0;
          for (int64_t p = 0; p < k; ++p) acc += ad[i * k + p] * bd[p * n + j];
          if (gemm || epilogue == "Add") acc += bias[j];
          if (epilogue == "Relu") acc = std::max(acc, 0.f);
          if (epilogue == "Clip") acc = std::min(std::max(acc, -0.5f), 1.5f);
          want[i * n + j] = acc;
        }
      testing::expect_near_all(y, want);
      if (!widest.count(form)) {
        widest[form] = y;
      } else if (std::string(isa) == "avx2") {
        EXPECT_EQ(y, widest.at(form));  // FMAs in the same order
      }
    }
}

// Past 2^18 multiply-adds, or in a training program (B read on every run), the product is
// oneDNN's.
TEST(SmallProduct, OnlySmallConstantProductsOfInferencePrograms) {
  for (const auto& [rows, fixed] : {std::pair{int64_t{8}, false}, std::pair{int64_t{4096}, true}}) {
    Graph g;
    const TensorType at{DType::kFloat32, {rows, 64}}, bt{DType::kFloat32, {64, 64}};
    const TensorType yt{DType::kFloat32, {rows, 64}};
    Node node;
    node.op_type = "MatMul";
    node.inputs = {g.add_value("a", at), g.add_value("b", bt)};
    auto w = std::make_shared<Tensor>();
    w->type = bt;
    w->data.resize(static_cast<size_t>(bt.bytes()));
    g.values[static_cast<size_t>(node.inputs[1])].init = w;
    node.outputs = {g.add_value("y", yt)};
    g.add_node(node);
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    CpuContext ctx{&engine, &stream, 1};
    KernelSpec spec{g, g.nodes[0], {at, bt}, {yt}, &ctx};
    spec.constants_fixed = fixed;
    EXPECT_EQ(cpu::make_small_product(spec), nullptr) << rows << " rows, constants fixed " << fixed;
    spec.constants_fixed = true;
    if (rows == 8) {
      EXPECT_NE(cpu::make_small_product(spec), nullptr);
    }
  }
}

}  // namespace
}  // namespace pt
