// plan/memory.h: the memory a plan needs per device is a closed form of its parameters and the
// activations its schedule keeps: 4 bytes per float32 parameter, once for the weights, once for
// the gradients, moments times for the optimizer (AdamW 2, SGD with momentum 1, plain SGD 0,
// ZeRO-1 a share), plus the simulated peak of the kept activations.
#include "plan/memory.h"

#include <gtest/gtest.h>

#include "autodiff/parameter_sites.h"
#include "autodiff/training_mode.h"
#include "onnx_import/import.h"
#include "plan/pipeline.h"
#include "plan/plan_report.h"

namespace pt {
namespace {

TEST(PlanMemory, OptimizerMoments) {
  EXPECT_EQ(optimizer_moments("adamw", 0), 2);
  EXPECT_EQ(optimizer_moments("sgd", 0.9), 1);
  EXPECT_EQ(optimizer_moments("sgd", 0), 0);
}

// One device of P trained parameter bytes and A kept: P + P + moments x P / shards + A; a process
// holding it on the CPU adds the overhead (the accumulators are the host gradients); on a GPU its
// host holds P (parameters) + P (the gradients' host copy) and the overhead.
TEST(PlanMemory, ClosedFormPerDeviceAndProcess) {
  const int64_t P = 4 * 1000, A = 3000;
  const std::vector<DeviceLoad> loads = {{P, P, A}};
  struct Case {
    int moments, shards;
    int64_t optimizer;
  };
  for (const Case& c : {Case{2, 1, 2 * P}, Case{1, 1, P}, Case{0, 1, 0}, Case{2, 2, P}, Case{2, 3, (2 * P + 2) / 3}}) {
    const MemoryNeeds m = memory_needs(loads, MemoryOptions{c.moments, c.shards});
    ASSERT_EQ(m.devices.size(), 1u);
    EXPECT_EQ(m.devices[0].parameters, P);
    EXPECT_EQ(m.devices[0].gradients, P);
    EXPECT_EQ(m.devices[0].optimizer, c.optimizer) << c.moments << " moments, " << c.shards << " shards";
    EXPECT_EQ(m.devices[0].activations, A);
    EXPECT_EQ(m.devices[0].total(), 2 * P + c.optimizer + A);
    EXPECT_EQ(m.process_bytes({0}), 2 * P + c.optimizer + A + kProcessOverhead);
    EXPECT_EQ(m.process_bytes({0}, true), 2 * P + kProcessOverhead);
  }
  // AdamW: the 4 x parameter bytes plus the activations, per device.
  EXPECT_EQ(memory_needs(loads, MemoryOptions{}).devices[0].total(), 4 * P + A);
}

// g on 2 stages of 4 micro-batches under `schedule`.
PipelinePlan two_stages(const Graph& g, const std::string& schedule) {
  PipelineRequest r;
  r.config.stages = 2;
  r.config.micro_batches = 4;
  r.config.schedule = schedule;
  r.where = [](const std::string& key) { return key; };
  return plan_pipeline(g, r);
}

// The mlp (64 -> 128 -> 128 -> 64 -> 10, four Gemms with bias) on 2 stages under GPipe, M
// micro-batches: each device holds its Gemms' weights and biases (4 bytes per element), and its
// activations peak when every micro-batch's forward has run: M x what its chunk keeps per
// micro-batch; beside them the arena of its programs.
TEST(PlanMemory, TrainPlanOfTheMlpIsItsParametersAndActivations) {
  ImportOptions io;
  io.batch = 4;
  Graph g = training_form(import_model("samples/mlp/mlp.onnx", io), {}, true);
  const PipelinePlan p = two_stages(g, "gpipe");
  const std::vector<DeviceLoad> loads = device_loads(p.chunks, p.lowered, p.planned);
  ASSERT_EQ(loads.size(), 2u);
  int64_t all = 0;
  for (int d = 0; d < 2; ++d) {
    int64_t count = 0;
    for (const std::string& name : p.chunks[static_cast<size_t>(d)].params)
      count += p.chunks[static_cast<size_t>(d)].forward.value(p.chunks[static_cast<size_t>(d)].forward.find(name)).type.numel();
    all += count;
    EXPECT_EQ(loads[static_cast<size_t>(d)].trained_bytes, 4 * count) << "device " << d;
    EXPECT_EQ(loads[static_cast<size_t>(d)].parameter_bytes, 4 * count) << "device " << d;
    EXPECT_EQ(loads[static_cast<size_t>(d)].activation_bytes, 4 * p.chunks[static_cast<size_t>(d)].kept_bytes) << "device " << d;
    // One chunk per device: its arena is that chunk's programs' largest, held beside the rest.
    const int64_t arena = chunk_arena_bytes(p.chunks, static_cast<size_t>(d));
    EXPECT_GT(arena, 0) << "device " << d;
    EXPECT_EQ(loads[static_cast<size_t>(d)].arena_bytes, arena) << "device " << d;
    const MemoryNeeds m = memory_needs(loads, MemoryOptions{});
    EXPECT_EQ(m.devices[static_cast<size_t>(d)].total(), 16 * count + 4 * p.chunks[static_cast<size_t>(d)].kept_bytes + arena);
  }
  EXPECT_EQ(all, 128 * 64 + 128 + 128 * 128 + 128 + 64 * 128 + 64 + 10 * 64 + 10);
}

// A tied parameter (samples/exports/gpt2.onnx: the LM head reads the token embedding, split into
// two sites) on 2 stages: in one process its weight and optimizer state count once and each site
// keeps an accumulator; on two processes each holder has the weight, the state and both sites'
// gradients (train/ties.h). Every other parameter counts once either way.
TEST(PlanMemory, ATiedParameterCountsOncePerProcessWithAnAccumulatorPerSite) {
  ImportOptions io;
  io.batch = 2;
  const Graph g = training_form(import_model("samples/exports/gpt2.onnx", io), {}, true);  // sites split
  std::vector<std::string> copies;
  for (ValueId v : g.initializers)
    if (g.value(v).name.find("@site") != std::string::npos) copies.push_back(g.value(v).name);
  ASSERT_EQ(copies, (std::vector<std::string>{"model.lm_head.weight@site1"}));  // the token embedding
  const int64_t tied = g.value(g.find("model.lm_head.weight")).type.bytes();
  int64_t all = 0;  // every parameter's bytes once (the sites' copies share the parameter's data)
  for (ValueId v : g.initializers)
    if (g.value(v).is_parameter() && g.value(v).name.find("@site") == std::string::npos) all += g.value(v).type.bytes();
  const PipelinePlan p = two_stages(g, "1f1b");
  const auto sum = [](const std::vector<DeviceLoad>& loads, int64_t DeviceLoad::*field) {
    int64_t total = 0;
    for (const DeviceLoad& l : loads) total += l.*field;
    return total;
  };
  const std::vector<DeviceLoad> one = device_loads(p.chunks, p.lowered, p.planned);
  EXPECT_EQ(sum(one, &DeviceLoad::parameter_bytes), all);
  EXPECT_EQ(sum(one, &DeviceLoad::trained_bytes), all);
  EXPECT_EQ(sum(one, &DeviceLoad::site_gradient_bytes), tied);
  const MemoryNeeds m = memory_needs(one, MemoryOptions{});
  EXPECT_EQ(m.process_bytes({0, 1}) - kProcessOverhead - sum(one, &DeviceLoad::activation_bytes) -
                sum(one, &DeviceLoad::arena_bytes),
            4 * all + tied);
  const std::vector<DeviceLoad> two = device_loads(p.chunks, p.lowered, p.planned, {0, 1});
  EXPECT_EQ(sum(two, &DeviceLoad::parameter_bytes), all + tied);
  EXPECT_EQ(sum(two, &DeviceLoad::trained_bytes), all + tied);
  EXPECT_EQ(sum(two, &DeviceLoad::site_gradient_bytes), 2 * tied);
}

// `plan`'s JSON gives each candidate's memory: the planner's state (4 x parameter bytes) split
// into parameters, gradients and the two moments, and its kept bytes as activations.
TEST(PlanMemory, PlanCandidateJsonSplitsTheState) {
  PlanCandidate c;
  c.state_bytes = {4000, 800};
  c.kept_bytes = {300, 50};
  const nlohmann::json j = candidate_json(c)["memory"];
  ASSERT_EQ(j["devices"].size(), 2u);
  EXPECT_EQ(j["devices"][0]["parameter_bytes"], 1000);
  EXPECT_EQ(j["devices"][0]["gradient_bytes"], 1000);
  EXPECT_EQ(j["devices"][0]["optimizer_bytes"], 2000);
  EXPECT_EQ(j["devices"][0]["activation_bytes"], 300);
  EXPECT_EQ(j["devices"][1]["total_bytes"], 850);
  EXPECT_EQ(j["process_bytes"], 4300 + 850 + kProcessOverhead);  // one process on the CPU: the devices' totals
}

}  // namespace
}  // namespace pt
