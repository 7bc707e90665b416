// tests/exec/cuda/cuda_kernels_test.cc: every CUDA kernel against the CPU kernel on the same
// one-node graph and the same inputs (kernel_cases.h), both run through StageProgram (so through
// each backend's registry, memory hooks and constants). Floats agree within the case's tolerance
// (1e-4 relative to the larger of the element and the output's largest magnitude), integers and
// booleans exactly; the CUDA program also gives the same bits on a second run (determinism).
//
// Without a usable GPU every comparison is SKIPPED with the reason (never passed). The registry
// checks at the end need no GPU: every CUDA op has a CPU kernel and at least one case here.
//
// PT_CUDA_FIGURES=path writes one CSV line per case: name, op, the worst error as a fraction of
// the allowed one, and the CPU and CUDA run times in microseconds (the second run of each).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "exec/cpu/cpu_backend.h"
#include "exec/cuda/cuda_backend.h"
#include "exec/stage_program.h"
#include "tests/exec/cuda/kernel_cases.h"
#include "tests/exec/test_tensors.h"

namespace pt::testing {
namespace {

struct Figure {
  std::string name, op;
  double worst = 0;  // max over elements of |cuda - cpu| / allowed
  double cpu_us = 0, cuda_us = 0;
};

std::mutex figures_mu;
std::vector<Figure> figures;

class FiguresWriter : public ::testing::Environment {
 public:
  void TearDown() override {
    const char* path = std::getenv("PT_CUDA_FIGURES");
    if (!path || figures.empty()) return;
    std::ofstream out(path);
    out << "case,op,worst_error_fraction,cpu_us,cuda_us\n";
    for (const Figure& f : figures)
      out << f.name << "," << f.op << "," << f.worst << "," << f.cpu_us << "," << f.cuda_us << "\n";
  }
};
const auto* const kFigures = ::testing::AddGlobalTestEnvironment(new FiguresWriter);

// Outputs of a program as host tensors (through the backend's copy).
std::vector<Tensor> outputs(const StageProgram& p, const Graph& g, Backend& b) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < g.outputs.size(); ++k) out.push_back(testing::download(b, p.output(k)));
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs the case twice on the backend; the outputs of both runs and the second run's time.
struct Runs {
  std::vector<Tensor> first, second;
  double seconds = 0;
};
Runs run_twice(const OneNode& one, Backend& backend) {
  StageProgram program(one.graph, backend);
  std::vector<void*> memory;
  std::vector<Buffer> feeds;
  for (size_t k = 0; k < one.feeds.size(); ++k) {
    const Tensor& t = one.feeds[k];
    void* p = backend.allocate(std::max<size_t>(t.data.size(), 1));
    backend.copy(p, t.data.data(), t.data.size());
    memory.push_back(p);
    feeds.push_back({p, &one.graph.value(one.graph.inputs[k]).type});
  }
  Runs r;
  program.run(feeds);
  r.first = outputs(program, one.graph, backend);
  const auto t0 = std::chrono::steady_clock::now();
  program.run(feeds);
  r.seconds = seconds_since(t0);
  r.second = outputs(program, one.graph, backend);
  for (void* p : memory) backend.release(p);
  return r;
}

// The worst |have - want| / allowed over the output (<= 1 passes); integers: 0 or infinity.
double worst_error(const Tensor& have, const Tensor& want, double tol, std::string* where) {
  const int64_t n = want.type.numel();
  if (want.type.dtype != DType::kFloat32 && want.type.dtype != DType::kFloat64) {
    if (std::memcmp(have.data.data(), want.data.data(), want.data.size()) == 0) return 0;
    *where = "integer or boolean values differ";
    return INFINITY;
  }
  auto at = [&](const Tensor& t, int64_t i) {
    return t.type.dtype == DType::kFloat32 ? double(t.as<float>()[i]) : t.as<double>()[i];
  };
  double largest = 0;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, std::fabs(at(want, i)));
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double h = at(have, i), w = at(want, i);
    if (std::isnan(h) && std::isnan(w)) continue;
    const double allowed = tol * (std::fabs(w) + largest) + 1e-30;
    const double e = std::isnan(h) || std::isnan(w) ? INFINITY : std::fabs(h - w) / allowed;
    if (e > worst) {
      worst = e;
      std::ostringstream s;
      s << "[" << i << "] cuda " << h << ", cpu " << w;
      *where = s.str();
    }
  }
  return worst;
}

class CudaVsCpu : public ::testing::TestWithParam<KernelCase> {};

TEST_P(CudaVsCpu, SameOutputs) {
  const KernelCase& c = GetParam();
  const std::string reason = cuda::no_device_reason();
  if (!reason.empty()) GTEST_SKIP() << reason << ": the CUDA kernel of " << c.key() << " was not run";
  const OneNode one = build_case(c, 1234);
  CpuBackend cpu(2);
  const Runs want = run_twice(one, cpu);
  cuda::CudaBackend gpu;
  const Runs have = run_twice(one, gpu);
  ASSERT_EQ(have.second.size(), want.second.size());
  Figure fig{c.name, c.key(), 0, want.seconds * 1e6, have.seconds * 1e6};
  for (size_t k = 0; k < want.second.size(); ++k) {
    ASSERT_EQ(have.second[k].type, want.second[k].type) << "output " << k;
    EXPECT_EQ(have.first[k].data, have.second[k].data)
        << "output " << k << ": the CUDA kernel gave other bits on its second run";
    std::string where;
    const double e = worst_error(have.second[k], want.second[k], c.tol, &where);
    fig.worst = std::max(fig.worst, e);
    EXPECT_LE(e, 1.0) << "output " << k << " " << where << " (tolerance " << c.tol << ")";
  }
  std::lock_guard<std::mutex> lock(figures_mu);
  figures.push_back(fig);
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaVsCpu, ::testing::ValuesIn(kernel_cases()),
                         [](const ::testing::TestParamInfo<KernelCase>& info) {
                           return info.param.name;
                         });

// cuDNN's fused attention in bf16 and fp16 modes (exec/cuda/cudnn_attention.cc) against the CPU's
// fp32 kernel, within each case's bound (bf16's: fp16 rounds finer) and bitwise repeatable; and
// 16-bit indeed: the rounding shows (an fp32 kernel in its place would sit about a thousand times
// inside the bound).
struct HalfCase {
  KernelCase c;
  cuda::Precision precision;
  std::string name() const { return (precision == cuda::Precision::kBf16 ? "Bf16_" : "Fp16_") + c.name; }
};

std::vector<HalfCase> half_cases() {
  std::vector<HalfCase> out;
  for (cuda::Precision p : {cuda::Precision::kBf16, cuda::Precision::kFp16})
    for (const KernelCase& c : half_attention_cases()) out.push_back({c, p});
  return out;
}

class CudaHalfVsCpu : public ::testing::TestWithParam<HalfCase> {};

TEST_P(CudaHalfVsCpu, WithinTheBound) {
  const KernelCase& c = GetParam().c;
  const std::string reason = cuda::no_device_reason();
  if (!reason.empty()) GTEST_SKIP() << reason << ": the 16-bit CUDA kernel of " << c.key() << " was not run";
  const OneNode one = build_case(c, 1234);
  CpuBackend cpu(2);
  const Runs want = run_twice(one, cpu);
  cuda::CudaBackend gpu({0, GetParam().precision});
  const Runs have = run_twice(one, gpu);
  ASSERT_EQ(have.second.size(), want.second.size());
  Figure fig{GetParam().name(), c.key(), 0, want.seconds * 1e6, have.seconds * 1e6};
  for (size_t k = 0; k < want.second.size(); ++k) {
    ASSERT_EQ(have.second[k].type, want.second[k].type) << "output " << k;
    EXPECT_EQ(have.first[k].data, have.second[k].data) << "output " << k << ": other bits on the second run";
    std::string where;
    const double e = worst_error(have.second[k], want.second[k], c.tol, &where);
    fig.worst = std::max(fig.worst, e);
    EXPECT_LE(e, 1.0) << "output " << k << " " << where << " (tolerance " << c.tol << ")";
  }
  EXPECT_GT(fig.worst, 1e-4) << "no 16-bit rounding shows: the fp32 kernel ran in place of cuDNN's";
  std::lock_guard<std::mutex> lock(figures_mu);
  figures.push_back(fig);
}

INSTANTIATE_TEST_SUITE_P(HalfAttention, CudaHalfVsCpu, ::testing::ValuesIn(half_cases()),
                         [](const ::testing::TestParamInfo<HalfCase>& info) { return info.param.name(); });

// ---- without a GPU ----

TEST(CudaRegistry, EveryOpHasACpuKernelToBeComparedWith) {
  for (const std::string& op : cuda::kernel_ops())
    EXPECT_NE(cpu_kernel_factory(op), nullptr) << op;
}

TEST(CudaRegistry, EveryOpHasACase) {
  std::set<std::string> covered;
  for (const KernelCase& c : kernel_cases()) covered.insert(c.key());
  for (const std::string& op : cuda::kernel_ops()) EXPECT_TRUE(covered.count(op)) << op;
  for (const std::string& key : covered) EXPECT_NE(cuda::kernel_factory(key), nullptr) << key;
}

// Every case is a node the CPU backend runs (so a GPU failure is the CUDA kernel's), and the
// comparison finds no difference between two CPU runs and a difference where there is one.
TEST(CudaCases, EveryCaseRunsOnTheCpu) {
  for (const KernelCase& c : kernel_cases()) {
    const OneNode one = build_case(c, 1234);
    CpuBackend cpu(2);
    Runs r;
    try {
      r = run_twice(one, cpu);
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << ": " << e.what();
      continue;
    }
    for (size_t k = 0; k < r.second.size(); ++k) {
      std::string where;
      EXPECT_EQ(worst_error(r.second[k], r.first[k], c.tol, &where), 0.0) << c.name << " " << where;
      if (r.second[k].type.dtype != DType::kFloat32 || r.second[k].type.numel() == 0) continue;
      Tensor off = r.second[k];
      off.as<float>()[0] += 1e-2f * (std::fabs(off.as<float>()[0]) + 1.f);
      EXPECT_GT(worst_error(off, r.first[k], c.tol, &where), 1.0) << c.name;
    }
  }
}

TEST(CudaRegistry, CaseNamesAreUnique) {
  std::set<std::string> names;
  for (const KernelCase& c : kernel_cases()) EXPECT_TRUE(names.insert(c.name).second) << c.name;
}

}  // namespace
}  // namespace pt::testing
