#include "exec/stage_program.h"

#include <gtest/gtest.h>

#include <dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "exec/channels_last.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/cpu/dnnl_util.h"
#include "onnx_import/fold_batch_norm.h"
#include "onnx_import/import.h"
#include "tests/exec/counting_backend.h"

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

// Whether oneDNN runs float products on a brgemm kernel here: only those add a bias or a tensor
// as they write (exec/cpu/linalg.cc). AVX-512 machines have it; under ONEDNN_MAX_CPU_ISA=AVX2
// (the isa_avx2 ctest entries) oneDNN picks another kernel and the Adds run on their own.
bool products_on_brgemm() {
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  using tag = dnnl::memory::format_tag;
  const auto f32 = dnnl::memory::data_type::f32;
  const dnnl::memory::desc a({64, 96}, f32, tag::ab), b({96, 80}, f32, tag::ab),
      y({64, 80}, f32, tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, y), engine);
  return cpu::implementation_is(pd, "brg");
}

std::vector<Buffer> buffers(const Graph& g, std::vector<Tensor>& inputs) {
  std::vector<Buffer> b;
  for (size_t k = 0; k < inputs.size(); ++k) b.push_back({inputs[k].data.data(), &g.value(g.inputs[k]).type});
  return b;
}

TEST(StageProgram, MeasuredPeakIsThePlannedTensorsAndAtMostTheirScratch) {
  for (const char* name : {"mlp", "gpt", "bert", "vit", "resnet", "mobilenet"}) {
    ImportOptions o;
    o.batch = 2;
    Graph g = import_model(std::string("samples/") + name + "/" + name + ".onnx", o);
    CpuBackend backend(2);
    StageProgram program(g, backend);
    std::vector<Tensor> inputs = random_inputs(g, 1);
    std::vector<Buffer> feeds = buffers(g, inputs);
    // The run writes every tensor whole, up to the top of the tensors' layout; the kernels'
    // scratch, placed around them, may be used only in part (a oneDNN scratchpad).
    const int64_t used = program.measure_peak_bytes(feeds);
    EXPECT_GE(used, program.planned_tensor_bytes()) << name;
    EXPECT_LE(used, program.planned_peak_bytes()) << name;
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

// The CPU backend with every tensor kept plain and every node run by its own kernel: what the
// channels-last programs must equal.
class PlainCpuBackend : public CpuBackend {
 public:
  explicit PlainCpuBackend(int threads) : CpuBackend(threads, Fusion::kNone) {}
  bool channels_last_convs() const override { return false; }
};

Tensor filled(const TensorType& type, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 0.5f);
  Tensor t;
  t.type = type;
  t.data.resize(static_cast<size_t>(type.bytes()));
  for (int64_t i = 0; i < type.numel(); ++i) t.as<float>()[i] = normal(rng);
  return t;
}

// x (graph input) -> Reshape -> r -> Relu -> y; x -> Flatten -> z, a graph output too. r is x's
// memory (no buffer, no copy: the backward's reshapes of kept tensors); z, an output, is a copy
// the program owns, so it stays valid whatever the caller does with x after the run.
TEST(StageProgram, AViewOfAnInputIsThatInputUnlessItIsAnOutput) {
  Graph g;
  const ValueId x = g.add_value("x", {DType::kFloat32, {4, 6}});
  const ValueId shape = g.add_value("shape", {DType::kInt64, {1}});
  Tensor flat;
  flat.type = {DType::kInt64, {1}};
  flat.data.resize(8);
  flat.as<int64_t>()[0] = 24;
  g.values[static_cast<size_t>(shape)].init = std::make_shared<Tensor>(flat);
  g.values[static_cast<size_t>(shape)].constant = true;
  const ValueId r = g.add_value("r", {DType::kFloat32, {24}});
  const ValueId y = g.add_value("y", {DType::kFloat32, {24}});
  const ValueId z = g.add_value("z", {DType::kFloat32, {4, 6}});
  g.add_node(Node{"reshape", "Reshape", "", {x, shape}, {r}, {}});
  g.add_node(Node{"relu", "Relu", "", {r}, {y}, {}});
  g.add_node(Node{"flatten", "Flatten", "", {x}, {z}, {{"axis", int64_t{1}}}});
  g.inputs = {x};
  g.outputs = {y, z};
  g.name = "views";
  g.rebuild_uses();
  CpuBackend backend(1);
  StageProgram program(g, backend);
  std::vector<std::string> planned;
  for (const BufferLife& b : program.memory_plan().buffers) planned.push_back(b.name);
  EXPECT_EQ(planned, (std::vector<std::string>{"y", "z"}));
  std::vector<Tensor> inputs = {filled({DType::kFloat32, {4, 6}}, 5)};
  const std::vector<float> x0(inputs[0].as<float>(), inputs[0].as<float>() + 24);
  program.run(buffers(g, inputs));
  const Buffer out_y = program.output(0), out_z = program.output(1);
  EXPECT_NE(out_z.data, inputs[0].data.data());
  std::fill(inputs[0].as<float>(), inputs[0].as<float>() + 24, -1.f);  // the caller reuses x
  for (size_t i = 0; i < 24; ++i) {
    EXPECT_EQ(out_y.as<float>()[i], std::max(0.f, x0[i])) << i;
    EXPECT_EQ(out_z.as<float>()[i], x0[i]) << i;
  }
}

// x -> Neg -> a -> GlobalAveragePool -> p -> Neg -> y. Over a spatial extent of 1 (MobileNet's
// last map) the pool gives a back as it is: p is a's memory and the pool runs nothing. Over 2 x 3
// it runs and p has a buffer of its own.
TEST(StageProgram, AGlobalAveragePoolOverOneElementIsAView) {
  for (const std::vector<int64_t>& spatial : {std::vector<int64_t>{1, 1}, std::vector<int64_t>{2, 3}}) {
    const std::vector<int64_t> in = {2, 5, spatial[0], spatial[1]}, pooled = {2, 5, 1, 1};
    Graph g;
    const ValueId x = g.add_value("x", {DType::kFloat32, in});
    const ValueId a = g.add_value("a", {DType::kFloat32, in});
    const ValueId p = g.add_value("p", {DType::kFloat32, pooled});
    const ValueId y = g.add_value("y", {DType::kFloat32, pooled});
    g.add_node(Node{"neg_a", "Neg", "", {x}, {a}, {}});
    g.add_node(Node{"pool", "GlobalAveragePool", "", {a}, {p}, {}});
    g.add_node(Node{"neg_y", "Neg", "", {p}, {y}, {}});
    g.inputs = {x};
    g.outputs = {y};
    g.name = "pool";
    g.rebuild_uses();
    const int64_t n = spatial[0] * spatial[1];
    const std::string what = n == 1 ? "over 1 x 1" : "over 2 x 3";
    EXPECT_EQ(g.moves_no_bytes(g.nodes[1]), n == 1) << what;
    CpuBackend backend(2);
    StageProgram program(g, backend, ProgramUse::kInference);
    EXPECT_EQ(program.runs_nothing(1), n == 1) << what;
    std::vector<std::string> planned;
    for (const BufferLife& b : program.memory_plan().buffers) planned.push_back(b.name);
    EXPECT_EQ(std::count(planned.begin(), planned.end(), "p"), n == 1 ? 0 : 1) << what;
    std::vector<Tensor> inputs = {filled({DType::kFloat32, in}, 9)};
    program.run(buffers(g, inputs));
    const float* xs = inputs[0].as<float>();
    for (int64_t c = 0; c < 10; ++c) {
      double sum = 0;
      for (int64_t s = 0; s < n; ++s) sum += xs[c * n + s];
      if (n == 1) {
        EXPECT_EQ(program.output(0).as<float>()[c], xs[c]) << what << " " << c;  // x's bits
      } else {
        EXPECT_NEAR(program.output(0).as<float>()[c], sum / static_cast<double>(n), 1e-6) << what << " " << c;
      }
    }
  }
}

// x -> Relu -> a -> Flatten -> f -> Neg -> y; x -> Sigmoid -> p -> Flatten -> q. Outputs a, y, x,
// p and q. a and y can be placed in the caller's memory (the pipeline's slots): the Relu writes a
// there and the Neg reads it there, through the view. x is the caller's input; p and q share one
// buffer, so neither can be placed alone.
TEST(StageProgram, PlacedOutputsAreWrittenWhereTheCallerSays) {
  Graph g;
  const TensorType square{DType::kFloat32, {4, 6}}, flat{DType::kFloat32, {4, 6}};
  const ValueId x = g.add_value("x", square), a = g.add_value("a", square), f = g.add_value("f", flat);
  const ValueId y = g.add_value("y", flat), p = g.add_value("p", square), q = g.add_value("q", flat);
  g.add_node(Node{"relu", "Relu", "", {x}, {a}, {}});
  g.add_node(Node{"flatten", "Flatten", "", {a}, {f}, {{"axis", int64_t{1}}}});
  g.add_node(Node{"neg", "Neg", "", {f}, {y}, {}});
  g.add_node(Node{"sigmoid", "Sigmoid", "", {x}, {p}, {}});
  g.add_node(Node{"flatten_p", "Flatten", "", {p}, {q}, {{"axis", int64_t{1}}}});
  g.inputs = {x};
  g.outputs = {a, y, x, p, q};
  g.name = "placed";
  g.rebuild_uses();
  CpuBackend backend(1);
  StageProgram program(g, backend);
  EXPECT_TRUE(program.placeable(0));
  EXPECT_TRUE(program.placeable(1));
  EXPECT_FALSE(program.placeable(2));
  EXPECT_FALSE(program.placeable(3));
  EXPECT_FALSE(program.placeable(4));
  EXPECT_DEATH(program.place_output(3, nullptr), "cannot be placed");

  struct alignas(64) Slot { float v[24]; };
  Slot slot_a{}, slot_y{};
  program.place_output(0, slot_a.v);
  program.place_output(1, slot_y.v);
  std::vector<Tensor> inputs = {filled(square, 7)};
  program.run(buffers(g, inputs));
  EXPECT_EQ(program.output(0).data, slot_a.v);
  EXPECT_EQ(program.output(1).data, slot_y.v);
  const float* x0 = inputs[0].as<float>();
  for (size_t i = 0; i < 24; ++i) {
    EXPECT_EQ(slot_a.v[i], std::max(0.f, x0[i])) << i;
    EXPECT_EQ(slot_y.v[i], -std::max(0.f, x0[i])) << i;
  }

  // Back in the arena: the next run leaves the caller's memory alone.
  program.place_output(0, nullptr);
  program.place_output(1, nullptr);
  const Slot before_a = slot_a, before_y = slot_y;
  inputs = {filled(square, 8)};
  program.run(buffers(g, inputs));
  EXPECT_NE(program.output(0).data, slot_a.v);
  const float* x1 = inputs[0].as<float>();
  for (size_t i = 0; i < 24; ++i) {
    EXPECT_EQ(program.output(0).as<float>()[i], std::max(0.f, x1[i])) << i;
    EXPECT_EQ(program.output(1).as<float>()[i], -std::max(0.f, x1[i])) << i;
    EXPECT_EQ(slot_a.v[i], before_a.v[i]) << i;
    EXPECT_EQ(slot_y.v[i], before_y.v[i]) << i;
  }
}

using testing::CountingBackend;

// W of two parameters: s1 = acc1 + xt @ dy1, s2 = acc2 + xt @ dy2 (each [16, 32], 2 KiB).
// Kept in the arena, s1 lives to the end beside s2, and each product beside them: 6 KiB. Placed
// by the caller on every run (the pipeline writes each sum over its accumulator), the sums take
// no room and the two products share one place: 2 KiB, which is what the program allocates;
// and the sums are computed in place over the caller's accumulators.
TEST(StageProgram, OutputsPlacedOnEveryRunTakeNoArenaRoom) {
  Graph g;
  const TensorType xt_type{DType::kFloat32, {16, 8}}, dy_type{DType::kFloat32, {8, 32}},
      grad{DType::kFloat32, {16, 32}};
  const ValueId xt = g.add_value("xt", xt_type), dy1 = g.add_value("dy1", dy_type), dy2 = g.add_value("dy2", dy_type);
  const ValueId acc1 = g.add_value("acc1", grad), acc2 = g.add_value("acc2", grad);
  const ValueId g1 = g.add_value("g1", grad), g2 = g.add_value("g2", grad);
  const ValueId s1 = g.add_value("s1", grad), s2 = g.add_value("s2", grad);
  g.add_node(Node{"mm1", "MatMul", "", {xt, dy1}, {g1}, {}});
  g.add_node(Node{"add1", "Add", "", {acc1, g1}, {s1}, {}});
  g.add_node(Node{"mm2", "MatMul", "", {xt, dy2}, {g2}, {}});
  g.add_node(Node{"add2", "Add", "", {acc2, g2}, {s2}, {}});
  g.inputs = {xt, dy1, dy2, acc1, acc2};
  g.outputs = {s1, s2};
  g.name = "weight_gradients";
  g.rebuild_uses();
  constexpr size_t kGrad = 16 * 32 * sizeof(float);

  CountingBackend own;
  StageProgram kept(g, own);
  EXPECT_EQ(kept.planned_tensor_bytes(), static_cast<int64_t>(3 * kGrad));
  ASSERT_EQ(own.allocated.size(), 1u);
  EXPECT_EQ(own.allocated[0], static_cast<size_t>(kept.planned_peak_bytes()));

  CountingBackend backend;
  StageProgram placed(g, backend, ProgramUse::kTraining, ArenaFrom::kCaller);
  EXPECT_TRUE(backend.allocated.empty());  // nothing before the caller says what it places
  placed.plan_arena({1, 1});
  EXPECT_EQ(placed.planned_tensor_bytes(), static_cast<int64_t>(kGrad));
  EXPECT_EQ(graph_arena(g).plan({1, 1}).arena_bytes, placed.planned_tensor_bytes());  // the plan's count
  placed.allocate();
  ASSERT_EQ(backend.allocated.size(), 1u);
  EXPECT_EQ(backend.allocated[0], static_cast<size_t>(placed.planned_peak_bytes()));
  EXPECT_LT(placed.planned_peak_bytes(), kept.planned_peak_bytes());

  std::vector<Tensor> inputs = {filled(xt_type, 1), filled(dy_type, 2), filled(dy_type, 3), filled(grad, 4),
                                filled(grad, 5)};
  const std::vector<Tensor> before = inputs;
  EXPECT_DEATH(placed.run(buffers(g, inputs)), "placed on every run, and was not placed");
  EXPECT_DEATH(placed.place_output(0, nullptr), "no room in the arena");
  placed.place_output(0, inputs[3].data.data());
  placed.place_output(1, inputs[4].data.data());
  placed.run(buffers(g, inputs));
  std::vector<Tensor> fresh = before;
  kept.run(buffers(g, fresh));
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(placed.output(k).data, inputs[3 + k].data.data());
    EXPECT_EQ(0, std::memcmp(inputs[3 + k].data.data(), kept.output(k).data, kGrad)) << k;
  }
}

// x -> MatMul(w) -> m -> Add(bias) -> y -> Relu -> r, and the same with the bias a graph input.
// In a training program the MatMul adds its bias Add as it writes (the Add runs nothing) where
// oneDNN runs products on brgemm (elsewhere the Add keeps its kernel), and the result is bit
// for bit the two kernels' (a Fusion::kNone backend runs each node alone); the Relu stays on its
// own. A bias read at run time is the caller's, each run.
TEST(StageProgram, ProductsAddTheirBiasAsTheAddWould) {
  for (const bool bias_is_input : {false, true}) {
    Graph g;
    const ValueId x = g.add_value("x", {DType::kFloat32, {3, 64, 96}});
    const ValueId w = g.add_value("w", {DType::kFloat32, {96, 80}});
    g.values[static_cast<size_t>(w)].init = std::make_shared<Tensor>(filled({DType::kFloat32, {96, 80}}, 11));
    const ValueId bias = g.add_value("bias", {DType::kFloat32, {80}});
    if (!bias_is_input)
      g.values[static_cast<size_t>(bias)].init = std::make_shared<Tensor>(filled({DType::kFloat32, {80}}, 12));
    const ValueId m = g.add_value("m", {DType::kFloat32, {3, 64, 80}});
    const ValueId y = g.add_value("y", {DType::kFloat32, {3, 64, 80}});
    const ValueId r = g.add_value("r", {DType::kFloat32, {3, 64, 80}});
    g.add_node(Node{"product", "MatMul", "", {x, w}, {m}, {}});
    g.add_node(Node{"bias_add", "Add", "", {m, bias}, {y}, {}});
    g.add_node(Node{"relu", "Relu", "", {y}, {r}, {}});
    g.inputs = {x};
    if (bias_is_input) g.inputs.push_back(bias);
    g.outputs = {r};
    g.name = "biased";
    g.rebuild_uses();
    CpuBackend fused(2);
    PlainCpuBackend plain(2);
    StageProgram program(g, fused), reference(g, plain);
    const std::string what = bias_is_input ? "bias fed" : "bias constant";
    EXPECT_FALSE(program.runs_nothing(0)) << what;
    EXPECT_EQ(program.runs_nothing(1), products_on_brgemm()) << what;
    EXPECT_FALSE(program.runs_nothing(2)) << what;
    EXPECT_FALSE(reference.runs_nothing(1)) << what;
    for (unsigned seed : {21u, 22u}) {
      std::vector<Tensor> inputs = {filled({DType::kFloat32, {3, 64, 96}}, seed)};
      if (bias_is_input) inputs.push_back(filled({DType::kFloat32, {80}}, seed + 100));
      program.run(buffers(g, inputs));
      reference.run(buffers(g, inputs));
      const Buffer got = program.output(0), want = reference.output(0);
      ASSERT_EQ(got.numel(), 3 * 64 * 80);
      EXPECT_EQ(std::memcmp(got.data, want.data, static_cast<size_t>(got.numel()) * 4), 0) << what << ", seed " << seed;
    }
  }
}

// A product whose lone reader is an Add of a tensor of its own shape sums that tensor as it
// writes (the Add runs nothing, where products run on brgemm), bit for bit what the two kernels
// give, at one and two threads: W's `grad_acc + g` (a weight gradient X^T dY, Gemm with transA,
// the accumulator as the Add's input 0) and a MatMul's output plus a residual (input 1). With the
// output placed on the accumulator's own memory (the pipeline's in-place sum) the result is the
// same.
TEST(StageProgram, ProductsAddATensorAsTheAddWould) {
  struct Case {
    std::string name;
    std::vector<int64_t> a, b, y;  // the product's operands and output
    bool gemm;                     // Gemm with transA (A stored K x M), else MatMul
  };
  for (const Case& c : {Case{"weight gradient", {384, 96}, {384, 160}, {96, 160}, true},
                        Case{"large weight gradient", {1024, 256}, {1024, 512}, {256, 512}, true},
                        Case{"residual", {3, 64, 96}, {96, 80}, {3, 64, 80}, false}}) {
    Graph g;
    const ValueId a = g.add_value("a", {DType::kFloat32, c.a});
    const ValueId b = g.add_value("b", {DType::kFloat32, c.b});
    const ValueId acc = g.add_value("acc", {DType::kFloat32, c.y});
    const ValueId p = g.add_value("p", {DType::kFloat32, c.y});
    const ValueId y = g.add_value("y", {DType::kFloat32, c.y});
    if (c.gemm) {
      g.add_node(Node{"", "Gemm", "", {a, b}, {p}, {{"transA", int64_t{1}}}});
      g.add_node(Node{"", "Add", "", {acc, p}, {y}, {}});
    } else {
      g.add_node(Node{"", "MatMul", "", {a, b}, {p}, {}});
      g.add_node(Node{"", "Add", "", {p, acc}, {y}, {}});
    }
    g.inputs = {a, b, acc};
    g.outputs = {y};
    g.name = "summed";
    g.rebuild_uses();
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(c.name + ", " + std::to_string(threads) + " threads");
      CpuBackend fused(threads);
      PlainCpuBackend plain(threads);
      StageProgram program(g, fused), in_place(g, fused), reference(g, plain);
      EXPECT_EQ(program.runs_nothing(1), products_on_brgemm());
      EXPECT_FALSE(reference.runs_nothing(1));
      ASSERT_TRUE(in_place.placeable(0));
      for (unsigned seed : {31u, 32u}) {
        std::vector<Tensor> inputs = {filled({DType::kFloat32, c.a}, seed), filled({DType::kFloat32, c.b}, seed + 1),
                                      filled({DType::kFloat32, c.y}, seed + 2)};
        reference.run(buffers(g, inputs));
        program.run(buffers(g, inputs));
        const Buffer want = reference.output(0), got = program.output(0);
        const size_t bytes = static_cast<size_t>(want.numel()) * 4;
        EXPECT_EQ(std::memcmp(got.data, want.data, bytes), 0) << "seed " << seed;
        // The sum in the caller's aligned memory, read as the Add's input and written as its output.
        const std::unique_ptr<float, decltype(&std::free)> sum(
            static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)), &std::free);
        std::memcpy(sum.get(), inputs[2].data.data(), bytes);
        std::vector<Buffer> feeds = buffers(g, inputs);
        feeds[2].data = sum.get();
        in_place.place_output(0, sum.get());
        in_place.run(feeds);
        EXPECT_EQ(std::memcmp(sum.get(), want.data, bytes), 0) << "in place, seed " << seed;
      }
    }
  }
}

// x -> Conv -> a -> Clip -> b -> depthwise Conv -> c -> Add(c, a) -> d -> 1x1 Conv -> e
//   -> Add(e, bias of (1, C, 1, 1)) -> y
struct ConvChain {
  Graph g;
  ValueId x, a, b, c, d, e, y, w1;
  explicit ConvChain(int64_t side = 6) {  // maps side x side
    const TensorType act{DType::kFloat32, {2, 8, side, side}};
    x = g.add_value("x", act);
    const auto weight = [&](const std::string& name, std::vector<int64_t> shape, unsigned seed) {
      const ValueId v = g.add_value(name, {DType::kFloat32, shape});
      g.values[static_cast<size_t>(v)].init = std::make_shared<Tensor>(filled({DType::kFloat32, shape}, seed));
      return v;
    };
    const auto scalar = [&](const std::string& name, float value) {
      const ValueId v = g.add_value(name, {DType::kFloat32, {}});
      Tensor t;
      t.type = {DType::kFloat32, {}};
      t.data.resize(4);
      t.as<float>()[0] = value;
      g.values[static_cast<size_t>(v)].init = std::make_shared<Tensor>(t);
      g.values[static_cast<size_t>(v)].constant = true;
      return v;
    };
    w1 = weight("w1", {8, 8, 3, 3}, 1);
    const ValueId w2 = weight("w2", {8, 1, 3, 3}, 2), w3 = weight("w3", {8, 8, 1, 1}, 3);
    const ValueId bias = weight("bias", {1, 8, 1, 1}, 4), lo = scalar("lo", 0.f), hi = scalar("hi", 6.f);
    a = g.add_value("a", act);
    b = g.add_value("b", act);
    c = g.add_value("c", act);
    d = g.add_value("d", act);
    e = g.add_value("e", act);
    y = g.add_value("y", act);
    const std::vector<int64_t> pad1 = {1, 1, 1, 1};
    g.add_node(Node{"conv1", "Conv", "", {x, w1}, {a}, {{"pads", pad1}}});
    g.add_node(Node{"clip", "Clip", "", {a, lo, hi}, {b}, {}});
    g.add_node(Node{"dw", "Conv", "", {b, w2}, {c}, {{"pads", pad1}, {"group", int64_t{8}}}});
    g.add_node(Node{"residual", "Add", "", {c, a}, {d}, {}});
    g.add_node(Node{"conv3", "Conv", "", {d, w3}, {e}, {}});
    g.add_node(Node{"bias_add", "Add", "", {e, bias}, {y}, {}});
    g.inputs = {x};
    g.outputs = {y};
    g.name = "chain";
    g.rebuild_uses();
  }
};

std::vector<float> run_once(const Graph& g, Backend& backend, std::vector<Tensor>& inputs) {
  StageProgram program(g, backend, ProgramUse::kInference);
  std::vector<Buffer> feeds = buffers(g, inputs);
  program.run(feeds);
  const Buffer out = program.output(0);
  return {out.as<float>(), out.as<float>() + out.numel()};
}

// The trainer updates a training program's weights in place between runs (train/trainer.cc), and
// the next run reads them; an inference program lays its conv weights out once, when it is built
// (KernelSpec::constants_fixed), and keeps what it laid out.
TEST(StageProgram, TrainingProgramsReadTheWeightsOfEveryRun) {
  ConvChain ch;
  CpuBackend cpu(1);
  std::vector<Tensor> inputs = random_inputs(ch.g, 6);
  const auto output = [&](StageProgram& p) {
    p.run(buffers(ch.g, inputs));
    const Buffer out = p.output(0);
    return std::vector<float>(out.as<float>(), out.as<float>() + out.numel());
  };
  StageProgram training(ch.g, cpu), inference(ch.g, cpu, ProgramUse::kInference);
  const std::vector<float> before = output(training), held = output(inference);
  Tensor& w = const_cast<Tensor&>(*ch.g.values[static_cast<size_t>(ch.w1)].init);
  for (int64_t i = 0; i < w.type.numel(); ++i) w.as<float>()[i] *= 2;
  const std::vector<float> after = output(training);
  EXPECT_NE(after, before);
  StageProgram fresh(ch.g, cpu);
  EXPECT_EQ(after, output(fresh));
  EXPECT_EQ(output(inference), held);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float largest = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, std::abs(want[i]));
    worst = std::max(worst, std::abs(got[i] - want[i]));
  }
  EXPECT_LE(worst, 1e-5f * std::max(1.f, largest)) << what;
}

// Between convs the tensors stay channels-last: the Clip's, the residual Add's (both of its
// operands), never the graph's input or output, nor what a broadcasting Add reads.
TEST(ChannelsLast, TheTensorsBetweenConvsOnly) {
  ConvChain ch;
  const std::vector<bool> last = channels_last_values(ch.g);
  for (ValueId v : {ch.a, ch.b, ch.c, ch.d}) EXPECT_TRUE(last[static_cast<size_t>(v)]) << ch.g.value(v).name;
  for (ValueId v : {ch.x, ch.e, ch.y}) EXPECT_FALSE(last[static_cast<size_t>(v)]) << ch.g.value(v).name;
  // The Clip's output made a graph output: it and the values chosen with it go back to plain.
  ch.g.outputs.push_back(ch.b);
  const std::vector<bool> with_b = channels_last_values(ch.g);
  for (ValueId v : {ch.a, ch.b}) EXPECT_FALSE(with_b[static_cast<size_t>(v)]) << ch.g.value(v).name;
  // The residual Add's operand a went plain, so its output goes plain with it; c and d follow.
  for (ValueId v : {ch.c, ch.d}) EXPECT_FALSE(with_b[static_cast<size_t>(v)]) << ch.g.value(v).name;
}

// The program with channels-last tensors gives what the plain one gives (onnxruntime checks the
// plain one: oracle.forward_onnxruntime), on the chain and on MobileNetV2, whose 1x1 convs
// between channels-last tensors the channels-last program runs as products (exec/cpu/nn.cc,
// build_pixel_product) where the plain one runs convs.
TEST(ChannelsLast, ProgramsEqualThePlainOnes) {
  ConvChain ch;
  CpuBackend cpu(2);
  PlainCpuBackend plain(2);
  std::vector<Tensor> inputs = random_inputs(ch.g, 3);
  expect_close(run_once(ch.g, cpu, inputs), run_once(ch.g, plain, inputs), "chain");
  // On 16x16 maps the depthwise conv of 8 channels between channels-last tensors: oneDNN's, not
  // the plain-layout loop (DepthwisePlaneConv) the plain program runs.
  ConvChain wide(16);
  std::vector<Tensor> wide_inputs = random_inputs(wide.g, 5);
  expect_close(run_once(wide.g, cpu, wide_inputs), run_once(wide.g, plain, wide_inputs), "chain on 16x16");
  ImportOptions o;
  o.batch = 4;
  const Graph mobilenet = import_model("samples/mobilenet/mobilenet.onnx", o);
  const std::vector<bool> last = channels_last_values(mobilenet);
  EXPECT_GT(std::count(last.begin(), last.end(), true), 60);
  std::vector<Tensor> images = random_inputs(mobilenet, 4);
  expect_close(run_once(mobilenet, cpu, images), run_once(mobilenet, plain, images), "mobilenet");
  // ResNet's BatchNormalizations, in training mode (the batch's statistics), stay in the chain:
  // every tensor between the stem and the pooling is channels-last.
  const Graph resnet = import_model("samples/resnet/resnet.onnx", o);
  const std::vector<bool> resnet_last = channels_last_values(resnet);
  for (const Node& n : resnet.nodes)
    if (n.op_type == "BatchNormalization") {
      EXPECT_TRUE(resnet_last[static_cast<size_t>(n.inputs[0])]) << n.name;
      EXPECT_TRUE(resnet_last[static_cast<size_t>(n.outputs[0])]) << n.name;
    }
  std::vector<Tensor> resnet_images = random_inputs(resnet, 6);
  expect_close(run_once(resnet, cpu, resnet_images), run_once(resnet, plain, resnet_images), "resnet");
}

// A constant of `type` added to g: filled(type, seed), or `value` when it holds one element.
ValueId add_constant(Graph& g, const std::string& name, const TensorType& type, unsigned seed, float value) {
  const ValueId v = g.add_value(name, type);
  Tensor t = filled(type, seed);
  if (type.numel() == 1) t.as<float>()[0] = value;
  g.values[static_cast<size_t>(v)].init = std::make_shared<Tensor>(t);
  g.values[static_cast<size_t>(v)].constant = true;
  return v;
}

// A BatchNormalization's statistics, positive variances.
ValueId add_variance(Graph& g, const std::string& name, int64_t channels) {
  const ValueId v = add_constant(g, name, {DType::kFloat32, {channels}}, 0, 0);
  Tensor& t = const_cast<Tensor&>(*g.values[static_cast<size_t>(v)].init);
  for (int64_t c = 0; c < channels; ++c) t.as<float>()[c] = 0.25f + 0.1f * static_cast<float>(c);
  return v;
}

// x (3, 6, 1, 1) -> Conv with a 1x1 W of 5 x 6 (and B) -> Clip(0, 1) -> y: a conv over one pixel,
// which an inference program runs as a product (exec/cpu/nn.cc, build_pixel_product), with or
// without its bias, gives the sums of the channels, clipped.
TEST(StageProgram, A1x1ConvOverOnePixelGivesTheChannelSums) {
  for (const bool bias : {true, false}) {
    Graph g;
    const ValueId x = g.add_value("x", {DType::kFloat32, {3, 6, 1, 1}});
    const ValueId w = add_constant(g, "w", {DType::kFloat32, {5, 6, 1, 1}}, 11, 0);
    const ValueId b = bias ? add_constant(g, "b", {DType::kFloat32, {5}}, 12, 0) : kNoValue;
    const ValueId lo = add_constant(g, "lo", {DType::kFloat32, {}}, 0, 0.f);
    const ValueId hi = add_constant(g, "hi", {DType::kFloat32, {}}, 0, 1.f);
    const ValueId c = g.add_value("c", {DType::kFloat32, {3, 5, 1, 1}});
    const ValueId y = g.add_value("y", {DType::kFloat32, {3, 5, 1, 1}});
    Node conv{"conv", "Conv", "", {x, w}, {c}, {{"kernel_shape", std::vector<int64_t>{1, 1}}}};
    if (bias) conv.inputs.push_back(b);
    g.add_node(conv);
    g.add_node(Node{"clip", "Clip", "", {c, lo, hi}, {y}, {}});
    g.inputs = {x};
    g.outputs = {y};
    g.name = "pixel";
    g.rebuild_uses();
    CpuBackend backend(2);
    std::vector<Tensor> inputs = {filled({DType::kFloat32, {3, 6, 1, 1}}, 13)};
    const std::vector<float> got = run_once(g, backend, inputs);
    const float* xs = inputs[0].as<float>();
    const float* ws = g.value(w).init->as<float>();
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t m = 0; m < 5; ++m) {
        double sum = bias ? g.value(b).init->as<float>()[m] : 0.0;
        for (int64_t k = 0; k < 6; ++k) sum += static_cast<double>(xs[n * 6 + k]) * ws[m * 6 + k];
        EXPECT_NEAR(got[static_cast<size_t>(n * 5 + m)], std::clamp(sum, 0.0, 1.0), 1e-5) << n << " " << m << " " << bias;
      }
  }
}

// x -> Conv(+bias) -> a -> BatchNormalization -> b -> Relu -> c -> Conv -> d ->
// BatchNormalization -> y. fold_batch_norms folds both into their Convs: no BatchNormalization
// is left, the outputs are the unfolded graph's within rounding, and b and c sit between convs
// (channels-last), as they do unfolded (a BatchNormalization joins the chain). Not folded: a
// BatchNormalization in training mode (the batch's statistics), and one whose Conv output is
// also read elsewhere (here: a graph output).
TEST(FoldBatchNorms, ConvsTakeTheirBatchNormalizationAndGiveItsOutputs) {
  const auto build = [](bool training, bool a_is_output) {
    Graph g;
    const TensorType act{DType::kFloat32, {2, 8, 6, 6}};
    const TensorType per{DType::kFloat32, {8}};
    const ValueId x = g.add_value("x", act);
    const ValueId w1 = add_constant(g, "w1", {DType::kFloat32, {8, 8, 3, 3}}, 1, 0);
    const ValueId bias = add_constant(g, "bias", per, 2, 0);
    const ValueId w2 = add_constant(g, "w2", {DType::kFloat32, {8, 8, 1, 1}}, 3, 0);
    std::vector<ValueId> bn[2];
    for (int k = 0; k < 2; ++k) {
      const std::string n = "bn" + std::to_string(k);
      bn[k] = {add_constant(g, n + ".scale", per, 10 + k, 0), add_constant(g, n + ".B", per, 20 + k, 0),
               add_constant(g, n + ".mean", per, 30 + k, 0), add_variance(g, n + ".var", 8)};
    }
    const ValueId a = g.add_value("a", act), b = g.add_value("b", act), c = g.add_value("c", act);
    const ValueId d = g.add_value("d", act), y = g.add_value("y", act);
    // Nodes without names, as exporters may write them: the folded constants take value names.
    g.add_node(Node{"", "Conv", "", {x, w1, bias}, {a}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}});
    Node norm1{"", "BatchNormalization", "", {a, bn[0][0], bn[0][1], bn[0][2], bn[0][3]}, {b}, {}};
    if (training) {
      norm1.attrs["training_mode"] = int64_t{1};
      norm1.outputs.push_back(g.add_value("running_mean", {DType::kFloat32, {8}}));
      norm1.outputs.push_back(g.add_value("running_var", {DType::kFloat32, {8}}));
    }
    g.add_node(norm1);
    g.add_node(Node{"relu", "Relu", "", {b}, {c}, {}});
    g.add_node(Node{"", "Conv", "", {c, w2}, {d}, {}});
    g.add_node(Node{"", "BatchNormalization", "", {d, bn[1][0], bn[1][1], bn[1][2], bn[1][3]}, {y},
                    {{"epsilon", 1e-3f}}});
    g.inputs = {x};
    g.outputs = {y};
    if (a_is_output) g.outputs.push_back(a);
    g.name = "bn";
    g.rebuild_uses();
    return g;
  };
  CpuBackend cpu(2);
  const auto count_bn = [](const Graph& g) {
    return std::count_if(g.nodes.begin(), g.nodes.end(), [](const Node& n) { return n.op_type == "BatchNormalization"; });
  };
  const Graph plain = build(false, false);
  Graph folded = build(false, false);
  EXPECT_EQ(fold_batch_norms(folded), 2);
  EXPECT_EQ(count_bn(folded), 0);
  ASSERT_EQ(folded.nodes.size(), 3u);
  std::vector<Tensor> inputs = random_inputs(plain, 9);
  expect_close(run_once(folded, cpu, inputs), run_once(plain, cpu, inputs), "folded");
  // d goes plain with y, the graph's output, which the second BatchNormalization writes.
  for (const char* v : {"a", "b", "c"})
    EXPECT_TRUE(channels_last_values(plain)[static_cast<size_t>(plain.find(v))]) << v;
  for (const char* v : {"d", "y"}) EXPECT_FALSE(channels_last_values(plain)[static_cast<size_t>(plain.find(v))]) << v;
  EXPECT_TRUE(channels_last_values(folded)[static_cast<size_t>(folded.find("c"))]);
  EXPECT_TRUE(channels_last_values(folded)[static_cast<size_t>(folded.find("b"))]);

  Graph training = build(true, false);
  EXPECT_EQ(fold_batch_norms(training), 1);  // bn2 only
  EXPECT_EQ(training.nodes[1].op_type, "BatchNormalization");
  Graph read_twice = build(false, true);
  EXPECT_EQ(fold_batch_norms(read_twice), 1);  // bn2 only
  EXPECT_EQ(read_twice.nodes[1].op_type, "BatchNormalization");
  std::vector<Tensor> again = random_inputs(read_twice, 9);
  const Graph read_twice_plain = build(false, true);
  expect_close(run_once(read_twice, cpu, again), run_once(read_twice_plain, cpu, again), "read twice");
}

// x -> Conv(+bias) -> a -> Clip(lo, hi) -> b -> Conv -> c -> Relu -> y, with a, b and c between
// convs (channels-last). In an inference program each Conv applies its Clip or Relu as it writes
// (the Clip and the Relu run nothing), and the outputs are the bits the unfused kernels give:
// clip_v2 and relu as a oneDNN post-op are the same element-wise math. Not fused: a Clip whose
// bound is fed at run time, a Conv output read twice, and anything in a training program, whose
// backward reads the Conv's own output.
TEST(StageProgram, InferenceConvsApplyTheirClipOrRelu) {
  const auto build = [](bool fed_bound, bool second_reader) {
    Graph g;
    const TensorType act{DType::kFloat32, {2, 8, 5, 5}};
    const ValueId x = g.add_value("x", act);
    const ValueId w1 = add_constant(g, "w1", {DType::kFloat32, {8, 8, 3, 3}}, 1, 0);
    const ValueId bias = add_constant(g, "bias", {DType::kFloat32, {8}}, 2, 0);
    const ValueId w2 = add_constant(g, "w2", {DType::kFloat32, {8, 8, 1, 1}}, 3, 0);
    const ValueId lo = add_constant(g, "lo", {DType::kFloat32, {}}, 0, -0.5f);
    const ValueId hi = fed_bound ? g.add_value("hi", {DType::kFloat32, {}}) : add_constant(g, "hi", {DType::kFloat32, {}}, 0, 0.75f);
    const ValueId a = g.add_value("a", act), b = g.add_value("b", act), c = g.add_value("c", act);
    const ValueId y = g.add_value("y", act);
    g.add_node(Node{"conv1", "Conv", "", {x, w1, bias}, {a}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}});
    g.add_node(Node{"clip", "Clip", "", {a, lo, hi}, {b}, {}});
    g.add_node(Node{"conv2", "Conv", "", {b, w2}, {c}, {}});
    g.add_node(Node{"relu", "Relu", "", {c}, {y}, {}});
    g.inputs = {x};
    if (fed_bound) g.inputs.push_back(hi);
    g.outputs = {y};
    if (second_reader) {
      const ValueId z = g.add_value("z", act);
      g.add_node(Node{"relu_a", "Relu", "", {a}, {z}, {}});
      g.outputs.push_back(z);
    }
    g.name = "fused";
    g.rebuild_uses();
    return g;
  };
  const auto outputs = [](const Graph& g, Backend& backend, ProgramUse use, std::vector<Tensor>& inputs,
                          std::vector<bool>* runs_nothing) {
    StageProgram program(g, backend, use);
    program.run(buffers(g, inputs));
    runs_nothing->clear();
    for (size_t i = 0; i < g.nodes.size(); ++i) runs_nothing->push_back(program.runs_nothing(i));
    std::vector<float> all;
    for (size_t k = 0; k < g.outputs.size(); ++k) {
      const Buffer out = program.output(k);
      all.insert(all.end(), out.as<float>(), out.as<float>() + out.numel());
    }
    return all;
  };
  CpuBackend cpu(2);
  CpuBackend unfused(2, CpuBackend::Fusion::kNone);
  for (const bool fed_bound : {false, true})
    for (const bool second_reader : {false, true}) {
      SCOPED_TRACE("fed bound " + std::to_string(fed_bound) + ", second reader " + std::to_string(second_reader));
      const Graph g = build(fed_bound, second_reader);
      std::vector<Tensor> inputs = random_inputs(g, 7);
      if (fed_bound) inputs[1].as<float>()[0] = 0.75f;
      std::vector<bool> fused_steps, plain_steps, training_steps;
      const std::vector<float> got = outputs(g, cpu, ProgramUse::kInference, inputs, &fused_steps);
      const std::vector<float> want = outputs(g, unfused, ProgramUse::kInference, inputs, &plain_steps);
      EXPECT_EQ(got, want);
      EXPECT_EQ(fused_steps[1], !fed_bound && !second_reader) << "clip";
      EXPECT_TRUE(fused_steps[3]) << "relu";
      EXPECT_FALSE(fused_steps[0] || fused_steps[2]);
      EXPECT_EQ(std::count(plain_steps.begin(), plain_steps.end(), true), 0);
      outputs(g, cpu, ProgramUse::kTraining, inputs, &training_steps);
      EXPECT_EQ(std::count(training_steps.begin(), training_steps.end(), true), 0);
    }
}

// A CpuBackend that fuses but keeps every tensor plain.
class PlainFusingCpuBackend : public CpuBackend {
 public:
  explicit PlainFusingCpuBackend(int threads) : CpuBackend(threads) {}
  bool channels_last_convs() const override { return false; }
};

// A program's outputs, bit for bit, and which of its nodes run nothing.
std::vector<std::byte> output_bytes(const Graph& g, Backend& backend, ProgramUse use, std::vector<Tensor>& inputs,
                                    std::vector<bool>* runs_nothing) {
  StageProgram program(g, backend, use);
  program.run(buffers(g, inputs));
  runs_nothing->clear();
  for (size_t i = 0; i < g.nodes.size(); ++i) runs_nothing->push_back(program.runs_nothing(i));
  std::vector<std::byte> all;
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    const Buffer out = program.output(k);
    all.insert(all.end(), out.as<std::byte>(), out.as<std::byte>() + out.numel() * sizeof(float));
  }
  return all;
}

// A BatchNormalization applies the residual Add and the Relu after it as it writes Y (in any
// program, plain or channels-last): they run nothing, and the outputs keep the unfused bits, the
// sign of the Relu's zeros included (x -> BatchNormalization -> Add(r) -> Relu -> y, the ResNet
// sample's blocks).
TEST(StageProgram, BatchNormalizationsApplyTheirAddAndRelu) {
  Graph g;
  const TensorType act{DType::kFloat32, {3, 8, 5, 5}}, per{DType::kFloat32, {8}};
  const ValueId x = g.add_value("x", act), r = g.add_value("r", act);
  const ValueId scale = add_constant(g, "scale", per, 1, 0), bias = add_constant(g, "bias", per, 2, 0);
  const ValueId mean = add_constant(g, "mean", per, 3, 0), var = add_variance(g, "var", 8);
  const ValueId b = g.add_value("b", act), c = g.add_value("c", act), y = g.add_value("y", act);
  g.add_node(Node{"bn", "BatchNormalization", "", {x, scale, bias, mean, var}, {b}, {}});
  g.add_node(Node{"add", "Add", "", {r, b}, {c}, {}});
  g.add_node(Node{"relu", "Relu", "", {c}, {y}, {}});
  g.inputs = {x, r};
  g.outputs = {y};
  g.name = "block";
  g.rebuild_uses();
  PlainFusingCpuBackend fusing(2);
  PlainCpuBackend alone(2);
  std::vector<Tensor> inputs = random_inputs(g, 4);
  for (const ProgramUse use : {ProgramUse::kInference, ProgramUse::kTraining}) {
    std::vector<bool> fused_steps, plain_steps;
    EXPECT_EQ(output_bytes(g, fusing, use, inputs, &fused_steps), output_bytes(g, alone, use, inputs, &plain_steps));
    EXPECT_EQ(fused_steps, (std::vector<bool>{false, true, true}));
  }
  // The ResNet sample, channels-last between its convs: every Add and Relu runs nothing.
  ImportOptions o;
  o.batch = 4;
  const Graph resnet = import_model("samples/resnet/resnet.onnx", o);
  CpuBackend cpu(2);
  CpuBackend unfused(2, CpuBackend::Fusion::kNone);
  std::vector<Tensor> images = random_inputs(resnet, 6);
  std::vector<bool> fused_steps, plain_steps;
  EXPECT_EQ(output_bytes(resnet, cpu, ProgramUse::kInference, images, &fused_steps),
            output_bytes(resnet, unfused, ProgramUse::kInference, images, &plain_steps));
  for (size_t i = 0; i < resnet.nodes.size(); ++i)
    if (resnet.nodes[i].op_type == "Relu" || resnet.nodes[i].op_type == "Add")
      EXPECT_TRUE(fused_steps[i]) << resnet.nodes[i].name;
}

// The same for a Gemm (torch's Linear) and its Relu, and a MatMul and its Clip.
TEST(StageProgram, InferenceProductsApplyTheirReluOrClip) {
  Graph g;
  const ValueId x = g.add_value("x", {DType::kFloat32, {6, 16}});
  const ValueId w = add_constant(g, "w", {DType::kFloat32, {32, 16}}, 1, 0);
  const ValueId bias = add_constant(g, "bias", {DType::kFloat32, {32}}, 2, 0);
  const ValueId v = add_constant(g, "v", {DType::kFloat32, {32, 8}}, 3, 0);
  const ValueId lo = add_constant(g, "lo", {DType::kFloat32, {}}, 0, -0.25f), hi = add_constant(g, "hi", {DType::kFloat32, {}}, 0, 0.5f);
  const ValueId h = g.add_value("h", {DType::kFloat32, {6, 32}}), r = g.add_value("r", {DType::kFloat32, {6, 32}});
  const ValueId p = g.add_value("p", {DType::kFloat32, {6, 8}}), y = g.add_value("y", {DType::kFloat32, {6, 8}});
  g.add_node(Node{"linear", "Gemm", "", {x, w, bias}, {h}, {{"transB", int64_t{1}}}});
  g.add_node(Node{"relu", "Relu", "", {h}, {r}, {}});
  g.add_node(Node{"project", "MatMul", "", {r, v}, {p}, {}});
  g.add_node(Node{"clip", "Clip", "", {p, lo, hi}, {y}, {}});
  g.inputs = {x};
  g.outputs = {y};
  g.name = "products";
  g.rebuild_uses();
  CpuBackend cpu(2);
  CpuBackend unfused(2, CpuBackend::Fusion::kNone);
  std::vector<Tensor> inputs = random_inputs(g, 8);
  StageProgram fused(g, cpu, ProgramUse::kInference), alone(g, unfused, ProgramUse::kInference);
  fused.run(buffers(g, inputs));
  alone.run(buffers(g, inputs));
  EXPECT_TRUE(fused.runs_nothing(1) && fused.runs_nothing(3));
  EXPECT_FALSE(alone.runs_nothing(1) || alone.runs_nothing(3));
  const Buffer got = fused.output(0), want = alone.output(0);
  EXPECT_EQ(std::vector<float>(got.as<float>(), got.as<float>() + 48), std::vector<float>(want.as<float>(), want.as<float>() + 48));
}

}  // namespace
}  // namespace pt
