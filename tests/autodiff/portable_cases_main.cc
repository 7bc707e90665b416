// tests/autodiff/portable_cases_main.cc: writes every case of portable_cases.h for the
// onnxruntime oracle (tests/oracle/portable_ops.py):
//   DIR/<case>/model.onnx              the case's graph after lower_to_standard (save_model)
//   DIR/<case>/inputs/<name>.npy       its random inputs
//   DIR/<case>/expected/<name>.npy     what the pipetrain node gave on the CPU backend
// Usage: portable_cases DIR. Exits 1 when the CPU backend cannot run a case (a missing kernel is
// a failure, not a skip).
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>

#include "autodiff/portable.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/npy.h"
#include "exec/stage_program.h"
#include "onnx_import/export.h"
#include "tests/autodiff/portable_cases.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

// Runs the pipetrain node on the CPU backend; one Tensor per graph output.
std::vector<Tensor> run_on_cpu(const Graph& g, const PortableCase& c) {
  CpuBackend backend(2);
  StageProgram program(g, backend);
  std::vector<Buffer> feeds;
  for (const auto& [name, tensor] : c.inputs)
    if (!name.empty()) feeds.push_back({const_cast<std::byte*>(tensor.data.data()), &tensor.type});
  program.run(feeds);
  std::vector<Tensor> outs;
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    const Buffer b = program.output(k);
    Tensor t{*b.type, std::vector<std::byte>(static_cast<size_t>(b.type->bytes()))};
    std::memcpy(t.data.data(), b.data, t.data.size());
    outs.push_back(std::move(t));
  }
  return outs;
}

void write_case(const PortableCase& c, const fs::path& dir) {
  const Graph g = case_graph(c);
  const std::vector<Tensor> expected = run_on_cpu(g, c);
  Graph lowered = g;
  lower_to_standard(lowered);
  fs::create_directories(dir / "inputs");
  fs::create_directories(dir / "expected");
  save_model(to_model_proto(lowered), (dir / "model.onnx").string());
  for (const auto& [name, tensor] : c.inputs)
    if (!name.empty()) write_npy(tensor, (dir / "inputs" / (name + ".npy")).string());
  for (size_t k = 0; k < g.outputs.size(); ++k)
    write_npy(expected[k], (dir / "expected" / (g.value(g.outputs[k]).name + ".npy")).string());
}

}  // namespace
}  // namespace pt

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: portable_cases DIR\n");
    return 2;
  }
  int failed = 0;
  const auto cases = pt::portable_cases();
  for (const pt::PortableCase& c : cases) {
    try {
      pt::write_case(c, std::filesystem::path(argv[1]) / c.name);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "FAIL %s: %s\n", c.name.c_str(), e.what());
      ++failed;
    }
  }
  std::printf("portable_cases: %zu cases written, %d failed\n", cases.size() - failed, failed);
  return failed ? 1 : 0;
}
