#include "exec/stage_program.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/error.h"
#include "exec/cpu/cpu_backend.h"
#include "onnx_import/import.h"

namespace pt {
namespace {

// Random inputs of the graph's types; integer inputs (token ids) drawn from [0, 16).
std::vector<Tensor> random_inputs(const Graph& g, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<Tensor> out;
  for (ValueId v : g.inputs) {
    Tensor t;
    t.type = g.value(v).type;
    t.data.resize(static_cast<size_t>(t.type.bytes()));
    for (int64_t i = 0; i < t.type.numel(); ++i) {
      if (t.type.dtype == DType::kFloat32) t.as<float>()[i] = normal(rng);
      if (t.type.dtype == DType::kInt64) t.as<int64_t>()[i] = static_cast<int64_t>(rng() % 16);
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<Buffer> buffers(const Graph& g, std::vector<Tensor>& inputs) {
  std::vector<Buffer> b;
  for (size_t k = 0; k < inputs.size(); ++k) b.push_back({inputs[k].data.data(), &g.value(g.inputs[k]).type});
  return b;
}

TEST(StageProgram, MeasuredPeakEqualsPlannedPeak) {
  for (const char* name : {"mlp", "gpt", "bert", "vit", "resnet", "mobilenet"}) {
    ImportOptions o;
    o.batch = 2;
    Graph g = import_model(std::string("samples/") + name + "/" + name + ".onnx", o);
    CpuBackend backend(2);
    StageProgram program(g, backend);
    std::vector<Tensor> inputs = random_inputs(g, 1);
    std::vector<Buffer> feeds = buffers(g, inputs);
    EXPECT_EQ(program.measure_peak_bytes(feeds), program.planned_peak_bytes()) << name;
    EXPECT_GE(program.planned_peak_bytes(), program.memory_plan().peak_live_bytes) << name;
  }
}

TEST(StageProgram, RunsAreRepeatable) {
  ImportOptions o;
  o.batch = 3;
  Graph g = import_model("samples/gpt/gpt.onnx", o);
  CpuBackend backend(2);
  StageProgram program(g, backend);
  std::vector<Tensor> inputs = random_inputs(g, 2);
  std::vector<Buffer> feeds = buffers(g, inputs);
  program.run(feeds);
  const Buffer out = program.output(0);
  std::vector<float> first(out.as<float>(), out.as<float>() + out.numel());
  program.run(feeds);
  EXPECT_EQ(0, std::memcmp(first.data(), program.output(0).data, first.size() * sizeof(float)));
}

TEST(StageProgram, UnsupportedNodeIsAUserError) {
  Graph g;
  ValueId x = g.add_value("x", {DType::kFloat32, {2}});
  ValueId y = g.add_value("y", {DType::kFloat32, {2}});
  g.add_node(Node{"strange", "Frobnicate", "", {x}, {y}, {}});
  g.inputs = {x};
  g.outputs = {y};
  g.name = "g";
  g.rebuild_uses();
  CpuBackend backend(1);
  try {
    StageProgram p(g, backend);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("node 'strange' (Frobnicate) in graph 'g': the CPU backend has no kernel for Frobnicate", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace pt
