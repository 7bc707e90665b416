// `pipetrain train` with `device: cuda`: a build without the CUDA backend refuses it in one line
// naming the YAML line; a CUDA build on a machine without a GPU says no GPU was found; with a
// GPU it trains (2 stages on the GPUs found) to a loss close to the CPU run's. The CUDA-against-
// CPU comparison of trained models is scripts/gpu_check.sh's (bench/gpu_compare.py).
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "tests/cli/run_cli.h"
#ifdef PT_HAVE_CUDA
#include "exec/cuda/cublas_api.h"
#include "exec/cuda/cuda_backend.h"
#endif

namespace {

// mlp, 2 stages, 2 steps; `device:` on line 5.
std::string config(const fs::path& dir, const std::string& device) {
  std::ostringstream c;
  c << "model: samples/mlp/mlp.onnx\n"
    << "dims: {batch: 4}\n"
    << "data: {kind: synthetic, samples: 64, shuffle: false}\n"
    << "pipeline: {stages: 2, micro_batches: 4, schedule: 1f1b}\n"
    << "device: " << device << "\n"
    << "steps: 2\n"
    << "output: {metrics: " << (dir / (device.substr(0, 4) + ".jsonl")).string() << "}\n";
  const fs::path p = dir / (device.substr(0, 4) + ".yaml");
  std::ofstream(p) << c.str();
  return p.string();
}

bool have_gpu() {
#ifdef PT_HAVE_CUDA
  return pt::cuda::device_count() > 0;
#else
  return false;
#endif
}

// The last step's loss in a metrics file.
double last_loss(const fs::path& metrics) {
  std::ifstream in(metrics);
  double loss = -1;
  const std::regex re("\"loss\":([-0-9.e+]+)");
  std::smatch m;
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(line, m, re)) loss = std::stod(m[1]);
  return loss;
}

TEST(TrainDevice, CudaRunsOrSaysWhyNot) {
  const fs::path d = scratch("cuda");
  const std::string cfg = config(d, "cuda");
  const Result r = run("train " + cfg + " --quiet");
#ifndef PT_HAVE_CUDA
  expect_one_line_error(r, cfg + ":5: device: this build has no CUDA backend; set device: cpu, or "
                                 "build with -DPT_CUDA=ON (needs nvcc)");
#else
  if (!have_gpu()) {
    expect_one_line_error_starting(r, cfg + ":5: device: no GPU was found (");
    return;
  }
  ASSERT_EQ(r.code, 0) << r.err;
  const Result cpu = run("train " + config(d, "cpu") + " --quiet");
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  const double want = last_loss(d / "cpu.jsonl"), have = last_loss(d / "cuda.jsonl");
  ASSERT_GT(want, 0);
  EXPECT_NEAR(have, want, 1e-3 * want);
#endif
}

// A GPU index past the ones found names the line, in a CUDA build on any machine.
TEST(TrainDevice, MissingGpuNamesTheLine) {
#ifndef PT_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend";
#else
  if (!have_gpu()) GTEST_SKIP() << "no GPU: the 'no GPU was found' case is CudaRunsOrSaysWhyNot's";
  const fs::path d = scratch("missing");
  const std::string cfg = config(d, "cuda:0,4096");
  expect_one_line_error_starting(run("train " + cfg + " --quiet"), cfg + ":5: device: GPU 4096 does not exist (");
#endif
}

// A CUDA build's process maps cuBLAS and cuBLASLt only once a CUDA backend asks for them: a rank
// on `device: cpu` does not carry cuBLASLt's 151 MiB. Then every entry point the backend calls is
// found (no GPU needed for that).
TEST(TrainDevice, CublasLoadsOnlyWhenACudaBackendAsks) {
#ifndef PT_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend";
#else
  auto mapped = [] {
    std::ifstream maps("/proc/self/maps");
    std::stringstream all;
    all << maps.rdbuf();
    return all.str().find("libcublasLt.so") != std::string::npos;
  };
  if (pt::cuda::cublas_loaded()) GTEST_SKIP() << "another test of this process made a CUDA backend";
  EXPECT_FALSE(mapped());
  const pt::cuda::CublasApi& api = pt::cuda::cublas_api();
  EXPECT_TRUE(pt::cuda::cublas_loaded());
  EXPECT_TRUE(mapped());
#define PT_EXPECT_FOUND(symbol, type) EXPECT_NE(api.symbol, nullptr) << #symbol;
  PT_CUBLAS_ENTRY_POINTS(PT_EXPECT_FOUND)
#undef PT_EXPECT_FOUND
#endif
}

}  // namespace
