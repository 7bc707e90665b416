// bench/forward_bench.cc: forward latency of a model on the CPU backend.
//
//   forward_bench MODEL.onnx BATCH THREADS REPEATS [plain | unfused]
// Compiles once (as `pipetrain run` does, BatchNormalizations after Convs folded into them;
// `plain` compiles it as training does: every tensor in the plain layout, nothing folded,
// constants laid out on every run, exec/stage_program.h; `unfused` as `run`
// does but with every Relu and Clip run by its own kernel, KernelSpec::epilogue), runs 3 warm-up
// passes, then REPEATS timed passes on random inputs; prints the median and best in
// milliseconds, then (on stderr) the time per op type and the ten slowest nodes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <random>
#include <vector>

#include "core/error.h"
#include "exec/cpu/cpu_backend.h"
#include "onnx_import/fold_batch_norm.h"
#include "exec/stage_program.h"
#include "onnx_import/import.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: forward_bench MODEL.onnx BATCH THREADS REPEATS [plain | unfused]\n");
    return 2;
  }
  try {
    pt::ImportOptions o;
    o.batch = std::atoi(argv[2]);
    const int threads = std::atoi(argv[3]);
    const int repeats = std::atoi(argv[4]);
    pt::Graph g = pt::import_model(argv[1], o);
    const char* variant_arg = argc > 5 ? argv[5] : "";
    const std::string_view variant = variant_arg;
    if (!variant.empty() && variant != "plain" && variant != "unfused") {
      std::fprintf(stderr, "error: the fifth argument is 'plain' or 'unfused', not '%s'\n", variant_arg);
      return 2;
    }
    pt::CpuBackend backend(threads, variant == "unfused" ? pt::CpuBackend::Fusion::kNone
                                                         : pt::CpuBackend::Fusion::kEpilogues);
    const bool plain = variant == "plain";
    if (!plain) pt::fold_batch_norms(g);  // as `pipetrain run` does
    pt::StageProgram program(g, backend, plain ? pt::ProgramUse::kTraining : pt::ProgramUse::kInference);
    std::mt19937 rng(0);
    std::normal_distribution<float> normal;
    std::vector<pt::Tensor> inputs;
    std::vector<pt::Buffer> feeds;
    for (pt::ValueId v : g.inputs) {
      pt::Tensor t;
      t.type = g.value(v).type;
      t.data.resize(static_cast<size_t>(t.type.bytes()));
      for (int64_t i = 0; i < t.type.numel(); ++i) {
        if (t.type.dtype == pt::DType::kFloat32) t.as<float>()[i] = normal(rng);
        if (t.type.dtype == pt::DType::kInt64) t.as<int64_t>()[i] = static_cast<int64_t>(rng() % 16);
      }
      inputs.push_back(std::move(t));
    }
    for (size_t k = 0; k < inputs.size(); ++k) feeds.push_back({inputs[k].data.data(), &g.value(g.inputs[k]).type});
    for (int w = 0; w < 3; ++w) program.run(feeds);
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      program.run(feeds);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%.4f %.4f\n", ms[ms.size() / 2], ms.front());
    // Where the time goes: per op type over REPEATS profiled runs, largest first.
    std::vector<double> seconds;
    for (int r = 0; r < repeats; ++r) program.run_profiled(feeds, &seconds);
    std::map<std::string, double> by_op;
    for (size_t i = 0; i < seconds.size(); ++i) by_op[g.nodes[i].op_type] += seconds[i];
    std::vector<std::pair<double, std::string>> sorted;
    for (const auto& [op, s] : by_op) sorted.push_back({s, op});
    std::sort(sorted.rbegin(), sorted.rend());
    for (const auto& [s, op] : sorted) std::fprintf(stderr, "  %-20s %8.3f ms\n", op.c_str(), 1e3 * s / repeats);
    // And the ten slowest nodes, with their input's shape.
    std::vector<std::pair<double, size_t>> nodes;
    for (size_t i = 0; i < seconds.size(); ++i) nodes.push_back({seconds[i], i});
    std::sort(nodes.rbegin(), nodes.rend());
    for (size_t j = 0; j < std::min<size_t>(10, nodes.size()); ++j) {
      const pt::Node& node = g.nodes[nodes[j].second];
      std::string shape;
      for (int64_t d : g.value(node.inputs[0]).type.shape) {
        if (!shape.empty()) shape += 'x';
        shape += std::to_string(d);
      }
      std::fprintf(stderr, "    %8.4f ms  %s of %s\n", 1e3 * nodes[j].first / repeats, node.label().c_str(), shape.c_str());
    }
  } catch (const pt::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
