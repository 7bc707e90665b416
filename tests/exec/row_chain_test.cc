// The element-wise nodes a row kernel takes in (exec/cpu/row_chain.h): an attention's scale and
// mask before its Softmax, and after SoftmaxGrad on the way back. A fused program must give the
// bits of the program that runs every node on its own kernel, in training programs too, whatever
// the operands' broadcast, and leave alone what it cannot take.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "exec/cpu/cpu_backend.h"
#include "exec/stage_program.h"

namespace pt {
namespace {

constexpr int64_t kB = 2, kH = 3, kT = 40, kD = 8;  // rows of 40: two AVX-512 vectors and a tail

Tensor random_tensor(const TensorType& type, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  Tensor t;
  t.type = type;
  t.data.resize(static_cast<size_t>(type.bytes()));
  for (int64_t i = 0; i < type.numel(); ++i) {
    if (type.dtype == DType::kFloat32) t.as<float>()[i] = normal(rng);
    if (type.dtype == DType::kBool) t.as<bool>()[i] = rng() % 3 == 0;
  }
  return t;
}

// A causal mask [1, 1, T, T]: true above the diagonal (the positions a query may not see).
Tensor causal_mask() {
  Tensor t;
  t.type = {DType::kBool, {1, 1, kT, kT}};
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  for (int64_t i = 0; i < kT; ++i)
    for (int64_t j = 0; j < kT; ++j) t.as<bool>()[i * kT + j] = j > i;
  return t;
}

Tensor scalar(float v) {
  Tensor t;
  t.type = {DType::kFloat32, {}};
  t.data.resize(4);
  t.as<float>()[0] = v;
  return t;
}

ValueId constant(Graph& g, const std::string& name, Tensor t) {
  const ValueId v = g.add_value(name, t.type);
  g.values[static_cast<size_t>(v)].init = std::make_shared<Tensor>(std::move(t));
  return v;
}

// Runs g on `use` programs of a fusing and a plain CPU backend at `threads`, on inputs drawn
// from `seed`: every output of the two bit for bit equal. Returns the fused program's
// runs_nothing per node.
std::vector<bool> expect_fused_equals_plain(const Graph& g, ProgramUse use, int threads, unsigned seed,
                                            const std::string& what) {
  CpuBackend fused(threads), plain(threads, CpuBackend::Fusion::kNone);
  StageProgram program(g, fused, use), reference(g, plain, use);
  std::vector<Tensor> inputs;
  std::vector<Buffer> feeds;
  for (size_t k = 0; k < g.inputs.size(); ++k)
    inputs.push_back(random_tensor(g.value(g.inputs[k]).type, seed + static_cast<unsigned>(k)));
  for (size_t k = 0; k < g.inputs.size(); ++k) feeds.push_back({inputs[k].data.data(), &inputs[k].type});
  program.run(feeds);
  reference.run(feeds);
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    const Buffer got = program.output(k), want = reference.output(k);
    EXPECT_EQ(std::memcmp(got.data, want.data, static_cast<size_t>(got.type->bytes())), 0)
        << what << ": output " << k << " at " << threads << " thread(s)";
  }
  std::vector<bool> nothing;
  for (size_t i = 0; i < g.nodes.size(); ++i) nothing.push_back(program.runs_nothing(i));
  for (size_t i = 0; i < g.nodes.size(); ++i) EXPECT_FALSE(reference.runs_nothing(i)) << what;
  return nothing;
}

// How an attention's mask comes: a constant, a graph input, or made in the program by a node
// (Equal of a fed float mask with 0, as torch exports a mask buffer the run reads): the fused
// Softmax reads it after the Where's place, where the memory plan must still keep it.
enum class Mask { kConstant, kFed, kMade };

// scores = Q @ K^T, then Mul by a scalar scale, Where(mask, fill, .), Softmax: the attention of
// a torch export. Q, K (graph inputs) -> MatMul -> Mul -> Where -> Softmax -> probabilities.
Graph attention_forward(Mask how, bool probabilities_out_twice) {
  Graph g;
  const TensorType scores{DType::kFloat32, {kB, kH, kT, kT}};
  const ValueId q = g.add_value("q", {DType::kFloat32, {kB, kH, kT, kD}});
  const ValueId kt = g.add_value("kt", {DType::kFloat32, {kB, kH, kD, kT}});
  const ValueId scale = constant(g, "scale", scalar(0.35f));
  const ValueId fill = constant(g, "fill", scalar(-1e9f));
  const TensorType mask_type{DType::kBool, {kB, kH, kT, kT}};
  const ValueId mask = how == Mask::kConstant ? constant(g, "mask", causal_mask()) : g.add_value("mask", mask_type);
  const ValueId s = g.add_value("s", scores), scaled = g.add_value("scaled", scores);
  const ValueId masked = g.add_value("masked", scores), p = g.add_value("p", scores);
  const ValueId fed_mask = g.add_value("fed_mask", {DType::kFloat32, {kB, kH, kT, kT}});
  if (how == Mask::kMade) {
    const ValueId zero = constant(g, "zero", scalar(0.f));
    g.add_node(Node{"make_mask", "Equal", "", {fed_mask, zero}, {mask}, {}});
  }
  g.add_node(Node{"scores", "MatMul", "", {q, kt}, {s}, {}});
  g.add_node(Node{"scale", "Mul", "", {s, scale}, {scaled}, {}});
  g.add_node(Node{"mask", "Where", "", {mask, fill, scaled}, {masked}, {}});
  g.add_node(Node{"softmax", "Softmax", "", {masked}, {p}, {{"axis", int64_t{-1}}}});
  g.inputs = {q, kt};
  if (how == Mask::kFed) g.inputs.push_back(mask);
  if (how == Mask::kMade) g.inputs.push_back(fed_mask);
  g.outputs = {p};
  if (probabilities_out_twice) g.outputs.push_back(scaled);  // the chain's tensor read outside it
  g.name = "attention";
  g.opsets[""] = 17;
  g.rebuild_uses();
  return g;
}

TEST(RowChain, SoftmaxTakesTheScaleAndMaskBitForBit) {
  for (const Mask how : {Mask::kConstant, Mask::kFed, Mask::kMade})
    for (const ProgramUse use : {ProgramUse::kTraining, ProgramUse::kInference})
      for (const int threads : {1, 2}) {
        const Graph g = attention_forward(how, false);
        const std::string what = std::string(how == Mask::kConstant ? "mask constant" : how == Mask::kFed ? "mask fed" : "mask made") +
                                 (use == ProgramUse::kTraining ? ", training" : ", inference");
        const std::vector<bool> nothing = expect_fused_equals_plain(g, use, threads, 7, what);
        const size_t at = how == Mask::kMade ? 1 : 0;  // the MatMul's index
        EXPECT_FALSE(nothing[at]) << what;
        EXPECT_TRUE(nothing[at + 1]) << what;
        EXPECT_TRUE(nothing[at + 2]) << what;
        EXPECT_FALSE(nothing[at + 3]) << what;
      }
}

TEST(RowChain, MaskedPositionsGetNoProbability) {
  const Graph g = attention_forward(Mask::kConstant, false);
  CpuBackend backend(1);
  StageProgram program(g, backend);
  Tensor q = random_tensor({DType::kFloat32, {kB, kH, kT, kD}}, 3);
  Tensor kt = random_tensor({DType::kFloat32, {kB, kH, kD, kT}}, 4);
  program.run(std::vector<Buffer>{{q.data.data(), &q.type}, {kt.data.data(), &kt.type}});
  const float* p = program.output(0).as<const float>();
  for (int64_t row = 0; row < kB * kH * kT; ++row) {
    const int64_t i = row % kT;
    double sum = 0;
    for (int64_t j = 0; j < kT; ++j) {
      const float v = p[row * kT + j];
      if (j > i) {
        ASSERT_EQ(v, 0.f) << "row " << row << ", key " << j;
      }
      sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << row;
  }
}

TEST(RowChain, ATensorReadOutsideTheChainStopsIt) {
  const Graph g = attention_forward(Mask::kConstant, true);
  const std::vector<bool> nothing = expect_fused_equals_plain(g, ProgramUse::kTraining, 1, 9, "scaled read twice");
  EXPECT_FALSE(nothing[1]);  // its output is a graph output
  EXPECT_TRUE(nothing[2]);   // the Where still goes into the Softmax, reading the Mul's output
}

// Every link kind and broadcast a row takes: Div by a per-head scale [1, H, 1, 1], Sub from a
// scalar (the chain's tensor second), Add of an additive mask [B, 1, 1, T] (BERT's), then
// Where(mask, ., fill) with the tensor as the true branch. Prologue of Softmax, and the same links
// as SoftmaxGrad's epilogue.
TEST(RowChain, EveryLinkKindAndBroadcast) {
  for (const bool backward : {false, true}) {
    Graph g;
    const TensorType t{DType::kFloat32, {kB, kH, kT, kT}};
    const ValueId x = g.add_value("x", t);
    const ValueId y = backward ? g.add_value("y", t) : kNoValue;
    const ValueId head_scale = g.add_value("head_scale", {DType::kFloat32, {1, kH, 1, 1}});
    const ValueId one = constant(g, "one", scalar(1.5f));
    const ValueId additive = g.add_value("additive", {DType::kFloat32, {kB, 1, 1, kT}});
    const ValueId mask = g.add_value("mask", {DType::kBool, {kB, 1, kT, 1}});
    const ValueId fill = constant(g, "fill", scalar(-3.f));
    const ValueId a = g.add_value("a", t), b = g.add_value("b", t), c = g.add_value("c", t);
    const ValueId d = g.add_value("d", t), out = g.add_value("out", t);
    std::vector<Node> links = {Node{"div", "Div", "", {a, head_scale}, {b}, {}},
                               Node{"sub", "Sub", "", {one, b}, {c}, {}},
                               Node{"add", "Add", "", {additive, c}, {d}, {}},
                               Node{"where", "Where", "", {mask, d, fill}, {out}, {}}};
    if (backward) {
      g.add_node(Node{"grad", "SoftmaxGrad", "pipetrain", {x, y}, {a}, {{"axis", int64_t{-1}}}});
      for (Node& n : links) g.add_node(n);
      g.inputs = {x, y, head_scale, additive, mask};
    } else {
      // Neg -> the first three links -> Softmax -> the Where: the Softmax takes the three (a chain
      // is at most three long), the Neg and the Where run on their own kernels.
      const ValueId p = g.add_value("p", t);
      g.add_node(Node{"neg", "Neg", "", {x}, {a}, {}});
      for (size_t k = 0; k < 3; ++k) g.add_node(links[k]);
      g.add_node(Node{"softmax", "Softmax", "", {d}, {p}, {{"axis", int64_t{-1}}}});
      g.add_node(Node{"where", "Where", "", {mask, p, fill}, {out}, {}});
      g.inputs = {x, head_scale, additive, mask};
    }
    g.outputs = {out};
    g.name = backward ? "grad_links" : "forward_links";
    g.opsets[""] = 17;
    g.rebuild_uses();
    for (const int threads : {1, 2}) {
      const std::vector<bool> nothing =
          expect_fused_equals_plain(g, ProgramUse::kTraining, threads, 11, g.name);
      if (backward) {
        EXPECT_FALSE(nothing[0]);
        for (size_t k = 1; k <= 3; ++k) EXPECT_TRUE(nothing[k]) << "link " << k;
        EXPECT_FALSE(nothing[4]);  // the fourth link: past the longest chain offered
      } else {
        EXPECT_FALSE(nothing[0]);  // Neg: not a link a row takes
        for (size_t k = 1; k <= 3; ++k) EXPECT_TRUE(nothing[k]) << "link " << k;
        EXPECT_FALSE(nothing[4]);
        EXPECT_FALSE(nothing[5]);
      }
    }
  }
}

// SoftmaxGrad's output summed into an accumulator by an Add epilogue, the output placed on the
// accumulator itself (as the pipeline places a weight gradient's `grad_acc + g`): the sum is the
// unfused one's, though the kernel writes where it reads.
TEST(RowChain, AnEpilogueSumsInPlaceOnItsOperand) {
  Graph g;
  const TensorType t{DType::kFloat32, {kB, kH, kT, kT}};
  const ValueId dy = g.add_value("dy", t), y = g.add_value("y", t), acc = g.add_value("acc", t);
  const ValueId grad = g.add_value("grad", t), sum = g.add_value("sum", t);
  g.add_node(Node{"grad", "SoftmaxGrad", "pipetrain", {dy, y}, {grad}, {{"axis", int64_t{-1}}}});
  g.add_node(Node{"accumulate", "Add", "", {acc, grad}, {sum}, {}});
  g.inputs = {dy, y, acc};
  g.outputs = {sum};
  g.name = "accumulate";
  g.opsets[""] = 17;
  g.rebuild_uses();
  for (const int threads : {1, 2}) {
    CpuBackend fused(threads), plain(threads, CpuBackend::Fusion::kNone);
    StageProgram program(g, fused), reference(g, plain);
    ASSERT_TRUE(program.runs_nothing(1));
    ASSERT_TRUE(program.placeable(0));
    std::vector<Tensor> in = {random_tensor(t, 1), random_tensor(t, 2), random_tensor(t, 3)};
    std::vector<Buffer> feeds;
    for (Tensor& x : in) feeds.push_back({x.data.data(), &x.type});
    reference.run(feeds);
    const size_t bytes = static_cast<size_t>(t.bytes());
    float* accumulator = static_cast<float*>(std::aligned_alloc(64, bytes));
    std::memcpy(accumulator, in[2].data.data(), bytes);
    feeds[2].data = accumulator;
    program.place_output(0, accumulator);
    program.run(feeds);
    EXPECT_EQ(std::memcmp(accumulator, reference.output(0).data, bytes), 0) << threads << " thread(s)";
    std::free(accumulator);
  }
}

}  // namespace
}  // namespace pt
