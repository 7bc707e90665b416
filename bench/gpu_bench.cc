// bench/gpu_bench.cc: the CUDA backend's kernels at model sizes, against the CPU backend on the
// same one-node graphs (scripts/gpu_check.sh runs it on a GPU machine). Per op: the GPU's time
// per run (mean of runs after a warm-up, StageProgram::run including its synchronisation), its
// rate (TFLOP/s for GEMMs and convolutions, GB/s of compulsory traffic for the rest), the CPU's
// time on `--threads` threads, and the speed-up. MatMul and FusedAttention also in bf16 and
// fp16 modes.
//
// Usage: gpu_bench [--threads N] [--runs N] [--no-cpu]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/pipetrain_ops.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/cuda/cuda_backend.h"
#include "exec/stage_program.h"

namespace pt {
namespace {

using Dims = std::vector<int64_t>;
using Attrs = std::map<std::string, AttrValue>;

struct In {
  TensorType type;
  double lo = -1, hi = 1;  // uniform values (integers: [lo, hi])
  bool constant = false;
};

struct Op {
  std::string name, op, domain;
  std::vector<In> inputs;
  std::vector<TensorType> outputs;
  Attrs attrs;
  double flops = 0;  // 0: rate in GB/s of inputs + outputs
  cuda::Precision precision = cuda::Precision::kFloat32;
};

Tensor make(const In& in, std::mt19937& rng) {
  Tensor t;
  t.type = in.type;
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  const int64_t n = t.type.numel();
  if (in.type.dtype == DType::kInt64) {
    std::uniform_int_distribution<int64_t> u(static_cast<int64_t>(in.lo), static_cast<int64_t>(in.hi));
    for (int64_t i = 0; i < n; ++i) t.as<int64_t>()[i] = u(rng);
  } else {
    std::uniform_real_distribution<float> u(static_cast<float>(in.lo), static_cast<float>(in.hi));
    for (int64_t i = 0; i < n; ++i) t.as<float>()[i] = u(rng);
  }
  return t;
}

struct Built {
  Graph g;
  std::vector<Tensor> feeds;
  int64_t bytes = 0;
};

Built build(const Op& o) {
  Built b;
  b.g.name = o.name;
  b.g.opsets[""] = 17;
  b.g.opsets[kPipetrainDomain] = 1;
  std::mt19937 rng(7);
  Node n;
  n.name = o.name;
  n.op_type = o.op;
  n.domain = o.domain;
  n.attrs = o.attrs;
  for (size_t i = 0; i < o.inputs.size(); ++i) {
    Tensor t = make(o.inputs[i], rng);
    b.bytes += t.type.bytes();
    if (o.inputs[i].constant) {
      n.inputs.push_back(b.g.add_initializer("in" + std::to_string(i), std::move(t), true));
    } else {
      n.inputs.push_back(b.g.add_value("in" + std::to_string(i), t.type));
      b.g.inputs.push_back(n.inputs.back());
      b.feeds.push_back(std::move(t));
    }
  }
  for (size_t k = 0; k < o.outputs.size(); ++k) {
    b.bytes += o.outputs[k].bytes();
    n.outputs.push_back(b.g.add_value("out" + std::to_string(k), o.outputs[k]));
    b.g.outputs.push_back(n.outputs.back());
  }
  b.g.add_node(std::move(n));
  b.g.rebuild_uses();
  return b;
}

// Seconds per run after one warm-up run.
double time_runs(const Built& b, Backend& backend, int runs) {
  StageProgram p(b.g, backend);
  std::vector<void*> mem;
  std::vector<Buffer> feeds;
  for (size_t k = 0; k < b.feeds.size(); ++k) {
    void* m = backend.allocate(b.feeds[k].data.size());
    backend.copy(m, b.feeds[k].data.data(), b.feeds[k].data.size());
    mem.push_back(m);
    feeds.push_back({m, &b.g.value(b.g.inputs[k]).type});
  }
  p.run(feeds);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < runs; ++r) p.run(feeds);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / runs;
  for (void* m : mem) backend.release(m);
  return s;
}

TensorType f(Dims d) { return {DType::kFloat32, std::move(d)}; }
In in(Dims d, double lo = -1, double hi = 1) { return {f(std::move(d)), lo, hi, false}; }

std::vector<Op> ops() {
  const int64_t m = 4096;
  std::vector<Op> v;
  v.push_back({"MatMul 4096^3 fp32", "MatMul", "", {in({m, m}), in({m, m})}, {f({m, m})}, {}, 2.0 * m * m * m});
  v.push_back({"MatMul 4096^3 bf16", "MatMul", "", {in({m, m}), in({m, m})}, {f({m, m})}, {}, 2.0 * m * m * m,
               cuda::Precision::kBf16});
  v.push_back({"MatMul 4096^3 fp16", "MatMul", "", {in({m, m}), in({m, m})}, {f({m, m})}, {}, 2.0 * m * m * m,
               cuda::Precision::kFp16});
  v.push_back({"Gemm+bias 8192x1024x4096", "Gemm", "", {in({8192, 1024}), in({4096, 1024}), in({4096})},
               {f({8192, 4096})}, {{"transB", int64_t{1}}}, 2.0 * 8192 * 1024 * 4096});
  v.push_back({"MatMul attn 16x12x512x64x512", "MatMul", "", {in({16, 12, 512, 64}), in({16, 12, 64, 512})},
               {f({16, 12, 512, 512})}, {}, 2.0 * 16 * 12 * 512 * 64 * 512});
  v.push_back({"Conv 3x3 32x64x56x56", "Conv", "", {in({32, 64, 56, 56}), in({64, 64, 3, 3}), in({64})},
               {f({32, 64, 56, 56})}, {{"pads", Dims{1, 1, 1, 1}}}, 2.0 * 32 * 64 * 56 * 56 * 64 * 9});
  v.push_back({"ConvGradWeight 3x3 32x64x56x56", "ConvGradWeight", kPipetrainDomain,
               {in({32, 64, 56, 56}), in({32, 64, 56, 56})}, {f({64, 64, 3, 3})},
               {{"pads", Dims{1, 1, 1, 1}}, {"weight_shape", Dims{64, 64, 3, 3}}},
               2.0 * 32 * 64 * 56 * 56 * 64 * 9});
  v.push_back({"LayerNorm 8192x1024", "LayerNormalization", "", {in({8192, 1024}), in({1024}), in({1024})},
               {f({8192, 1024})}, {}, 0});
  v.push_back({"LayerNormGrad 8192x1024", "LayerNormGrad", kPipetrainDomain,
               {in({8192, 1024}), in({8192, 1024}), in({1024}), in({8192, 1}), in({8192, 1}, 0.5, 2)},
               {f({8192, 1024}), f({1024}), f({1024})}, {}, 0});
  v.push_back({"Softmax 8192x1024", "Softmax", "", {in({8192, 1024}, -5, 5)}, {f({8192, 1024})}, {}, 0});
  v.push_back({"BatchNorm train 32x64x56x56", "BatchNormalization", "",
               {in({32, 64, 56, 56}), in({64}), in({64}), in({64}), in({64}, 0.5, 2)},
               {f({32, 64, 56, 56})}, {{"training_mode", int64_t{1}}}, 0});
  v.push_back({"MaxPool 3x3/2 32x64x112x112", "MaxPool", "", {in({32, 64, 112, 112})}, {f({32, 64, 56, 56})},
               {{"kernel_shape", Dims{3, 3}}, {"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}}, 0});
  v.push_back({"Add broadcast 8192x4096 + 4096", "Add", "", {in({8192, 4096}), in({4096})}, {f({8192, 4096})}, {}, 0});
  v.push_back({"Gelu 8192x4096", "Gelu", "", {in({8192, 4096}, -4, 4)}, {f({8192, 4096})}, {}, 0});
  v.push_back({"ReduceSum rows 8192x4096", "ReduceSum", "", {in({8192, 4096}), {{DType::kInt64, {1}}, 0, 0, true}},
               {f({1, 4096})}, {}, 0});
  v.push_back({"Transpose 0213 16x512x12x64", "Transpose", "", {in({16, 512, 12, 64})}, {f({16, 12, 512, 64})},
               {{"perm", Dims{0, 2, 1, 3}}}, 0});
  v.push_back({"SoftmaxCrossEntropy 4096x50257", "SoftmaxCrossEntropy", kPipetrainDomain,
               {in({4096, 50257}, -5, 5), {{DType::kInt64, {4096}}, 0, 50256}, in({}, 1.0 / 4096, 1.0 / 4096)},
               {f({})}, {}, 0});
  v.push_back({"GatherGrad embedding 50257x768, 4096 ids", "GatherGrad", kPipetrainDomain,
               {in({4096, 768}), {{DType::kInt64, {4096}}, 0, 50256}}, {f({50257, 768})},
               {{"data_shape", Dims{50257, 768}}}, 0});
  // Causal attention at context 2048, 2 x 16 heads of 64, fp32: FLOPs as FlashAttention counts
  // them, 4 B H S T D / 2 forward and 2.5 times that backward. The gradient's LogSumExp lies
  // above every score, as a forward's does.
  const Dims qd{2, 16, 2048, 64};
  const double attention = 4.0 * 2 * 16 * 2048 * 2048 * 64 / 2;
  const Attrs causal{{"causal", int64_t{1}}};
  v.push_back({"FusedAttention causal 2x16x2048x64", "FusedAttention", kPipetrainDomain, {in(qd), in(qd), in(qd)},
               {f(qd), f({2, 16, 2048})}, causal, attention});
  v.push_back({"FusedAttentionGrad causal 2x16x2048x64", "FusedAttentionGrad", kPipetrainDomain,
               {in(qd), in(qd), in(qd), in(qd), in(qd), in({2, 16, 2048}, 8, 10)}, {f(qd), f(qd), f(qd)}, causal,
               2.5 * attention});
  // The same in bf16 and fp16 modes: cuDNN's fused attention (exec/cuda/cudnn_attention.cc), the
  // 16-bit copies of the inputs and outputs included.
  for (const auto& [suffix, p] : {std::pair{" bf16", cuda::Precision::kBf16}, std::pair{" fp16", cuda::Precision::kFp16}}) {
    v.push_back({"FusedAttention causal 2x16x2048x64" + std::string(suffix), "FusedAttention", kPipetrainDomain,
                 {in(qd), in(qd), in(qd)}, {f(qd), f({2, 16, 2048})}, causal, attention, p});
    v.push_back({"FusedAttentionGrad causal 2x16x2048x64" + std::string(suffix), "FusedAttentionGrad",
                 kPipetrainDomain, {in(qd), in(qd), in(qd), in(qd), in(qd), in({2, 16, 2048}, 8, 10)},
                 {f(qd), f(qd), f(qd)}, causal, 2.5 * attention, p});
  }
  return v;
}

int run(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int runs = 10;
  bool cpu = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
    else if (a == "--runs" && i + 1 < argc) runs = std::stoi(argv[++i]);
    else if (a == "--no-cpu") cpu = false;
    else throw UserError("gpu_bench", "unknown argument '" + a + "'", "see the usage in bench/gpu_bench.cc");
  }
  const std::string why = cuda::no_device_reason();
  if (!why.empty()) {
    std::fprintf(stderr, "gpu_bench: %s\n", why.c_str());
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU: %s; CPU backend on %d threads; %d runs each\n\n", prop.name, threads, runs);
  std::printf("%-44s %10s %12s %10s %9s\n", "op", "GPU ms", "GPU rate", "CPU ms", "speed-up");
  cuda::CudaBackend fp32, bf16({0, cuda::Precision::kBf16}), fp16({0, cuda::Precision::kFp16});
  CpuBackend host(threads);
  for (const Op& o : ops()) {
    const Built b = build(o);
    const double g = time_runs(b,
                               o.precision == cuda::Precision::kBf16   ? bf16
                               : o.precision == cuda::Precision::kFp16 ? fp16
                                                                       : fp32,
                               runs);
    char rate[32];
    if (o.flops > 0) std::snprintf(rate, sizeof rate, "%.1f TF/s", o.flops / g / 1e12);
    else std::snprintf(rate, sizeof rate, "%.0f GB/s", double(b.bytes) / g / 1e9);
    if (cpu && o.precision == cuda::Precision::kFloat32) {
      const double c = time_runs(b, host, std::max(1, runs / 5));
      std::printf("%-44s %10.3f %12s %10.2f %8.1fx\n", o.name.c_str(), g * 1e3, rate, c * 1e3, c / g);
    } else {
      std::printf("%-44s %10.3f %12s %10s %9s\n", o.name.c_str(), g * 1e3, rate, "-", "-");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace pt

int main(int argc, char** argv) {
  try {
    return pt::run(argc, argv);
  } catch (const pt::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
