// tests/exec/cuda/cuda_backend_test.cc: the CUDA backend beside its kernels: the caching
// allocator (reuse, statistics), the memory hooks StageProgram uses (copy, fill, constants and
// their refresh, the planned arena against what the allocator hands out, the measured peak),
// bf16 and fp16 GEMMs within their bounds, pinned host memory, the optimizer's updates on the GPU, and user
// data errors reported from the device as UserErrors. Every test needs a GPU and is SKIPPED
// without one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "exec/cuda/cuda_backend.h"
#include "exec/stage_program.h"
#include "tests/exec/test_tensors.h"
#include "train/optimizer.h"

namespace pt::cuda {
namespace {

#define PT_REQUIRE_GPU()                                              \
  do {                                                                \
    const std::string why = no_device_reason();                       \
    if (!why.empty()) GTEST_SKIP() << why;                            \
  } while (0)

using testing::uniform;

// y = x @ w with w an initializer: x [m, k] fed, w [k, n] constant.
Graph matmul_graph(const Tensor& w, int64_t m) {
  Graph g;
  g.name = "mm";
  g.opsets[""] = 17;
  Node n;
  n.name = "mm";
  n.op_type = "MatMul";
  n.inputs = {g.add_value("x", {DType::kFloat32, {m, w.type.shape[0]}}), g.add_initializer("w", w)};
  n.outputs = {g.add_value("y", {DType::kFloat32, {m, w.type.shape[1]}})};
  g.inputs = {n.inputs[0]};
  g.outputs = {n.outputs[0]};
  g.add_node(std::move(n));
  g.rebuild_uses();
  return g;
}

std::vector<float> run_host(StageProgram& p, Backend& b, const Graph& g, const Tensor& x) {
  void* dx = b.allocate(x.data.size());
  b.copy(dx, x.data.data(), x.data.size());
  const Buffer in{dx, &g.value(g.inputs[0]).type};
  p.run({&in, 1});
  const Buffer out = p.output(0);
  std::vector<float> y(static_cast<size_t>(out.numel()));
  b.copy(y.data(), out.data, y.size() * sizeof(float));
  b.release(dx);
  return y;
}

// y[i, j] = sum_k x[i, k] w[k, j] in double.
std::vector<double> matmul_ref(const Tensor& x, const Tensor& w, bool absolute) {
  const int64_t m = x.type.shape[0], k = x.type.shape[1], n = w.type.shape[1];
  std::vector<double> y(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < k; ++l) {
        const double a = x.as<float>()[i * k + l], b = w.as<float>()[l * n + j];
        y[static_cast<size_t>(i * n + j)] += absolute ? std::fabs(a * b) : a * b;
      }
  return y;
}

TEST(CachingAllocator, ReusesReleasedBlocksAndCountsBytes) {
  PT_REQUIRE_GPU();
  CachingAllocator a(0);
  void* p = a.allocate(1000);
  EXPECT_EQ(a.stats().in_use, 1024);
  a.release(p);
  EXPECT_EQ(a.stats().in_use, 0);
  void* q = a.allocate(1024);  // the same size class: the cached block
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().mallocs, 1);
  EXPECT_EQ(a.stats().reuses, 1);
  void* r = a.allocate(4096);  // more than twice nothing cached: a new block
  EXPECT_NE(r, q);
  EXPECT_EQ(a.stats().in_use, 1024 + 4096);
  EXPECT_EQ(a.stats().peak_in_use, 1024 + 4096);
  a.release(q);
  a.release(r);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0);
  EXPECT_EQ(a.stats().peak_in_use, 1024 + 4096);
}

TEST(CudaBackend, CopyAndFillRoundTrip) {
  PT_REQUIRE_GPU();
  CudaBackend b;
  std::vector<unsigned char> host(3000), back(3000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i * 7);
  void* d = b.allocate(host.size());
  b.copy(d, host.data(), host.size());
  b.copy(back.data(), d, back.size());
  EXPECT_EQ(back, host);
  b.fill(d, 0x5A, 1000);
  b.copy(back.data(), d, back.size());
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], i < 1000 ? 0x5A : host[i]) << i;
  b.release(d);
}

// The arena StageProgram plans is what the allocator hands out (plus the constants), and the
// measured peak (device bytes written) stays within it.
TEST(CudaBackend, AllocatorHoldsThePlannedArenaAndConstants) {
  PT_REQUIRE_GPU();
  const Tensor w = uniform({64, 48}, 1);
  const Graph g = matmul_graph(w, 32);
  CudaBackend b;
  {
    StageProgram p(g, b);
    const int64_t rounded_arena = (std::max<int64_t>(p.planned_peak_bytes(), 64) + 511) / 512 * 512;
    EXPECT_EQ(b.allocator().stats().in_use, rounded_arena + b.constant_bytes());
    EXPECT_EQ(b.constant_bytes(), 64 * 48 * 4);
    const Tensor x = uniform({32, 64}, 2);
    void* dx = b.allocate(x.data.size());
    b.copy(dx, x.data.data(), x.data.size());
    const Buffer in{dx, &g.value(g.inputs[0]).type};
    EXPECT_LE(p.measure_peak_bytes({&in, 1}), p.planned_peak_bytes());
    b.release(dx);
  }
  EXPECT_EQ(b.allocator().stats().in_use, b.constant_bytes());  // the arena went back
}

// Constants are uploaded once; refresh_constants() brings the optimizer's in-place update over.
TEST(CudaBackend, RefreshConstantsAfterTheHostTensorChanged) {
  PT_REQUIRE_GPU();
  Tensor w = uniform({16, 8}, 3);
  Graph g = matmul_graph(w, 4);
  auto& init = const_cast<Tensor&>(*g.value(g.find("w")).init);
  CudaBackend b;
  StageProgram p(g, b);
  const Tensor x = uniform({4, 16}, 4);
  const std::vector<float> before = run_host(p, b, g, x);
  for (int64_t i = 0; i < init.type.numel(); ++i) init.as<float>()[i] *= 2.f;
  EXPECT_EQ(run_host(p, b, g, x), before) << "a constant changed before refresh_constants()";
  b.refresh_constants();
  const std::vector<float> after = run_host(p, b, g, x);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_FLOAT_EQ(after[i], 2.f * before[i]) << i;
}

// The optimizer bound to the GPU (Optimizer::bind_device: its state there, the norm's sums of
// squares and the updates as CUDA kernels) against the host optimizer on the same parameters and
// gradients, over three clipped steps of SGD with Nesterov momentum and of AdamW, both with
// weight decay: the norm within 1e-12 relative (sums in double, another order), parameters and
// state within 1e-6 of their largest value (the same float formulas, where a fused multiply-add
// may round otherwise); the host tensors stay untouched, and load_state() puts a state back.
TEST(CudaBackend, DeviceOptimizerMatchesTheHostOne) {
  PT_REQUIRE_GPU();
  CudaBackend b;
  const auto to_device = [&](const Tensor& t) {
    auto* p = static_cast<float*>(b.allocate(t.data.size()));
    b.copy(p, t.data.data(), t.data.size());
    return p;
  };
  const auto from_device = [&](const float* p, const Tensor& like) {
    Tensor t = like;
    b.copy(t.data.data(), p, t.data.size());
    return t;
  };
  const auto expect_close = [](const Tensor& got, const Tensor& want, const std::string& what) {
    float largest = 0;
    for (int64_t i = 0; i < want.type.numel(); ++i) largest = std::max(largest, std::fabs(want.as<float>()[i]));
    for (int64_t i = 0; i < want.type.numel(); ++i)
      ASSERT_NEAR(got.as<float>()[i], want.as<float>()[i], 1e-6 * largest) << what << " element " << i;
  };
  for (const bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "adamw" : "sgd");
    OptimizerConfig c;
    c.kind = adamw ? OptimizerConfig::Kind::kAdamW : OptimizerConfig::Kind::kSgd;
    c.lr = adamw ? 0.01 : 0.05;
    c.momentum = 0.9;
    c.nesterov = !adamw;
    c.weight_decay = 0.01;
    c.clip_grad_norm = 0.5;  // the gradients' norm is about 100: every step clips
    // The second spans several of the norm's blocks (kSquaresChunk) and ends inside one.
    const std::vector<Tensor> start = {uniform({37, 5}, 11), uniform({100003}, 12)};
    std::vector<Tensor> on_host = start, bound = start;
    Optimizer host(c, {{"a", &on_host[0]}, {"b", &on_host[1]}});
    Optimizer device(c, {{"a", &bound[0]}, {"b", &bound[1]}});
    std::vector<float*> params = {to_device(start[0]), to_device(start[1])};
    device.bind_device(b, params);
    for (int step = 0; step < 3; ++step) {
      const std::vector<Tensor> g = {uniform({37, 5}, 20 + step), uniform({100003}, 30 + step)};
      std::vector<const float*> hg = {g[0].as<float>(), g[1].as<float>()};
      std::vector<float*> dg = {to_device(g[0]), to_device(g[1])};
      const std::vector<const float*> dgc(dg.begin(), dg.end());
      const double squares = host.squared_norm(hg);
      EXPECT_NEAR(device.squared_norm(dgc), squares, 1e-12 * squares);
      const double norm = Optimizer::global_norm({&squares, 1});
      host.step(hg, norm);
      device.step(dgc, norm);
      for (float* p : dg) b.release(p);
    }
    for (size_t k = 0; k < start.size(); ++k) {
      expect_close(from_device(params[k], start[k]), on_host[k], "parameter " + std::to_string(k));
      EXPECT_EQ(bound[k].data, start[k].data) << "the host tensor of a bound parameter changed";
    }
    const OptimizerState want = host.state(), got = device.state();
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    EXPECT_EQ(got.step, 3);
    for (size_t i = 0; i < want.tensors.size(); ++i) expect_close(got.tensors[i].second, want.tensors[i].second, want.tensors[i].first);
    // A fresh bound optimizer takes the state back, bit for bit.
    std::vector<Tensor> again = start;
    Optimizer reloaded(c, {{"a", &again[0]}, {"b", &again[1]}});
    std::vector<float*> params2 = {to_device(start[0]), to_device(start[1])};
    reloaded.bind_device(b, params2);
    reloaded.load_state(got);
    const OptimizerState back = reloaded.state();
    for (size_t i = 0; i < got.tensors.size(); ++i) EXPECT_EQ(back.tensors[i].second.data, got.tensors[i].second.data);
    for (float* p : params) b.release(p);
    for (float* p : params2) b.release(p);
  }
}

// A 96 x 512 x 64 product in `precision` against the exact one: every |y - exact| within
// bound * sum_k |x_ik w_kj|; returns the worst |y - exact| / sum_k |x_ik w_kj|.
double worst_product_error(Precision precision, double bound) {
  const Tensor w = uniform({512, 64}, 5), x = uniform({96, 512}, 6);
  const Graph g = matmul_graph(w, 96);
  CudaBackend b({0, precision});
  StageProgram p(g, b);
  const std::vector<float> y = run_host(p, b, g, x);
  const std::vector<double> exact = matmul_ref(x, w, false), scale = matmul_ref(x, w, true);
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_LE(std::fabs(y[i] - exact[i]), bound * scale[i]) << i;
    worst = std::max(worst, std::fabs(y[i] - exact[i]) / scale[i]);
  }
  return worst;
}

// bf16 products with fp32 accumulation: each input rounded to bf16 (8 significant bits, unit
// roundoff 2^-8) makes a product off by at most about 2^-7 of itself, so
// |y - exact| <= 1e-2 * sum_k |x_ik w_kj| (2^-7 = 7.8e-3, plus the fp32 sum); and not fp32 in
// disguise: bf16 rounding shows well above fp32's 1e-6.
TEST(CudaBackend, Bf16MatMulWithinItsBound) {
  PT_REQUIRE_GPU();
  EXPECT_GT(worst_product_error(Precision::kBf16, 1e-2), 1e-5);
}

// fp16: unit roundoff 2^-11 per input, so a product is off by at most about 2^-10 of itself:
// |y - exact| <= 2e-3 * sum_k |x_ik w_kj|; its rounding shows above fp32's.
TEST(CudaBackend, Fp16MatMulWithinItsBound) {
  PT_REQUIRE_GPU();
  EXPECT_GT(worst_product_error(Precision::kFp16, 2e-3), 1e-6);
}

// Which rounding the GEMM inputs see, told apart by values each format holds or not: every x is
// 1 + 2^-9 (10 significant bits: fp32, TF32 and fp16 hold it, bf16 rounds it to 1) or 3 * 2^-26
// (fp32, TF32 and bf16 hold it, fp16's smallest subnormal is 2^-24: rounded to that), w is 1, so
// y = 512 x exactly where x is held.
std::vector<float> ones_product(float x, Precision precision) {
  Tensor w = uniform({512, 4}, 1), in = uniform({8, 512}, 2);
  for (int64_t i = 0; i < w.type.numel(); ++i) w.as<float>()[i] = 1.f;
  for (int64_t i = 0; i < in.type.numel(); ++i) in.as<float>()[i] = x;
  const Graph g = matmul_graph(w, 8);
  CudaBackend b({0, precision});
  StageProgram p(g, b);
  return run_host(p, b, g, in);
}

TEST(CudaBackend, Bf16ModeRoundsGemmInputsToBf16) {
  PT_REQUIRE_GPU();
  const float x = 1.f + std::ldexp(1.f, -9);
  for (float y : ones_product(x, Precision::kFloat32)) EXPECT_EQ(y, 512.f * x);
  for (float y : ones_product(x, Precision::kBf16)) EXPECT_EQ(y, 512.f) << "the inputs were not rounded to bf16";
}

TEST(CudaBackend, Fp16ModeRoundsGemmInputsToFp16) {
  PT_REQUIRE_GPU();
  const float x = 3.f * std::ldexp(1.f, -26);
  for (float y : ones_product(x, Precision::kFloat32)) EXPECT_EQ(y, 512.f * x);
  for (float y : ones_product(x, Precision::kFp16))
    EXPECT_EQ(y, std::ldexp(1.f, -15)) << "the inputs were not rounded to fp16";
}

TEST(CudaBackend, Fp32MatMulWithin1e4) {
  PT_REQUIRE_GPU();
  const Tensor w = uniform({512, 64}, 5), x = uniform({96, 512}, 6);
  const Graph g = matmul_graph(w, 96);
  CudaBackend b;
  StageProgram p(g, b);
  const std::vector<float> y = run_host(p, b, g, x);
  const std::vector<double> exact = matmul_ref(x, w, false), scale = matmul_ref(x, w, true);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_LE(std::fabs(y[i] - exact[i]), 1e-5 * scale[i]) << i;
}

TEST(CudaBackend, PinnedHostMemoryIsPinned) {
  PT_REQUIRE_GPU();
  CudaBackend b;
  void* h = b.allocate_host(1 << 20);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, h), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  b.release_host(h);
}

// A Gather index out of range is the user's: a UserError from the run, as on the CPU.
TEST(CudaBackend, GatherIndexOutOfRangeIsAUserError) {
  PT_REQUIRE_GPU();
  Graph g;
  g.name = "gather";
  g.opsets[""] = 17;
  Node n;
  n.name = "embed";
  n.op_type = "Gather";
  n.inputs = {g.add_value("table", {DType::kFloat32, {4, 3}}), g.add_value("ids", {DType::kInt64, {2}})};
  n.outputs = {g.add_value("y", {DType::kFloat32, {2, 3}})};
  g.inputs = n.inputs;
  g.outputs = n.outputs;
  g.add_node(std::move(n));
  g.rebuild_uses();
  CudaBackend b;
  StageProgram p(g, b);
  const int64_t ids[2] = {1, 4};
  void* table = b.allocate(48);
  b.fill(table, 0, 48);
  void* d_ids = b.allocate(sizeof ids);
  b.copy(d_ids, ids, sizeof ids);
  const Buffer in[2] = {{table, &g.value(g.inputs[0]).type}, {d_ids, &g.value(g.inputs[1]).type}};
  try {
    p.run(in);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("Gather node 'embed': index 4 out of range [-4, 4)"),
              std::string::npos)
        << e.what();
  }
  const int64_t good[2] = {1, -4};
  b.copy(d_ids, good, sizeof good);
  EXPECT_NO_THROW(p.run(in));  // the fault was cleared
  b.release(table);
  b.release(d_ids);
}

TEST(CudaBackend, MissingDeviceIsAUserError) {
  PT_REQUIRE_GPU();
  EXPECT_THROW(CudaBackend({device_count(), Precision::kFloat32}), UserError);
}

}  // namespace
}  // namespace pt::cuda
