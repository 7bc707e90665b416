// plan/chunk_costs.h: a chunk's W is counted on the W graph autodiff derives, so it is what the
// weight gradients compute (2 * rows * in * out per weight matrix, plus adding each into its
// accumulator) whatever form the weight takes: stored [out, in] and read through a Transpose,
// read by Gemm with transB, or read as it is.
#include "plan/chunk_costs.h"

#include <gtest/gtest.h>

#include <cstring>

#include "autodiff/backward.h"
#include "tests/autodiff/sample_chunks.h"
#include "tests/plan/weight_products.h"

namespace pt {
namespace {

Tensor zeros(const std::vector<int64_t>& shape, DType dtype = DType::kFloat32) {
  Tensor t;
  t.type = TensorType{dtype, shape};
  t.data.assign(static_cast<size_t>(t.type.bytes()), std::byte{0});
  return t;
}

Tensor int64s(const std::vector<int64_t>& values) {
  Tensor t = zeros({static_cast<int64_t>(values.size())}, DType::kInt64);
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

TensorType f32(const std::vector<int64_t>& shape) { return TensorType{DType::kFloat32, shape}; }

// x [2, 3, 8] -> MatMul(x, Transpose(w1 [16, 8])) -> Relu -> MatMul(., w2 [16, 12])
//   -> Reshape [6, 12] -> Gemm(., w3 [10, 12], transB) -> y [6, 10]: three weights in three
// forms, rows = 6 for each.
Graph three_linear_layers() {
  Graph g;
  g.opsets[""] = 17;
  const ValueId x = g.add_value("x", f32({2, 3, 8}));
  g.inputs.push_back(x);
  const ValueId w1 = g.add_initializer("w1", zeros({16, 8}));
  const ValueId w2 = g.add_initializer("w2", zeros({16, 12}));
  const ValueId w3 = g.add_initializer("w3", zeros({10, 12}));
  const ValueId shape = g.add_initializer("shape", int64s({6, 12}), true);
  const ValueId t1 = g.add_value("t1", f32({8, 16}));
  const ValueId h1 = g.add_value("h1", f32({2, 3, 16}));
  const ValueId r1 = g.add_value("r1", f32({2, 3, 16}));
  const ValueId h2 = g.add_value("h2", f32({2, 3, 12}));
  const ValueId h2r = g.add_value("h2r", f32({6, 12}));
  const ValueId y = g.add_value("y", f32({6, 10}));
  g.add_node(Node{"t1", "Transpose", "", {w1}, {t1}, {{"perm", std::vector<int64_t>{1, 0}}}});
  g.add_node(Node{"mm1", "MatMul", "", {x, t1}, {h1}, {}});
  g.add_node(Node{"relu", "Relu", "", {h1}, {r1}, {}});
  g.add_node(Node{"mm2", "MatMul", "", {r1, w2}, {h2}, {}});
  g.add_node(Node{"flat", "Reshape", "", {h2, shape}, {h2r}, {}});
  g.add_node(Node{"gemm3", "Gemm", "", {h2r, w3}, {y}, {{"transB", int64_t{1}}}});
  g.outputs.push_back(y);
  g.rebuild_uses();
  return g;
}

// A chunk in the middle of a pipeline: x carries a gradient, y's comes in from the next chunk.
TEST(ChunkCosts, WeightGradientsAreWsWorkInEveryForm) {
  const Graph g = three_linear_layers();
  BackwardOptions o;
  o.grad_inputs = {"x"};
  const ChunkWork work = chunk_work(build_backward(g, o));
  const int64_t products = 2 * 6 * (8 * 16 + 16 * 12 + 12 * 10);
  ASSERT_EQ(testing::weight_gradient_products(g), products);
  const int64_t accumulate = 8 * 16 + 16 * 12 + 12 * 10;  // grad.w = grad_acc.w + dW
  EXPECT_EQ(work.w.flops_fwd, products + accumulate);
  // B: dX of each product (2 * rows * in * out again) and Relu's gradient, nothing of W's.
  EXPECT_EQ(work.b.flops_fwd, products + 6 * 16);
  EXPECT_EQ(work.f.flops_fwd, products + 6 * 16);
}

// Costs carry the same work as time (FLOP-equivalents / 1e9) and the plan's link as comm; an
// action whose input comes from the other device (the second chunk's F; the first chunk's B,
// where it runs a kernel) pays kFlopsPerReceivedAction above its graph's work, and none when both
// chunks are on one device.
TEST(ChunkCosts, CostsAreTheGraphsWorkUnits) {
  const Graph g = testing::load_sample("gpt", 2);
  PartitionOptions po;
  po.stages = 2;
  const PartitionPlan plan = plan_partition(g, estimate_costs(g), po);
  ChunkBackwardOptions o;
  o.loss = LossSpec{};
  const std::vector<BackwardGraphs> chunks = build_chunk_backward(g, plan, o);
  const Costs costs = chunk_costs(chunks, plan);
  ASSERT_EQ(costs.chunks.size(), 2u);
  ASSERT_NE(plan.chunks[0].device, plan.chunks[1].device);
  const Costs one_device = chunk_costs(chunks, std::vector<int>{0, 0});
  const double received = static_cast<double>(kFlopsPerReceivedAction) * 1e-9;
  for (size_t c = 0; c < 2; ++c) {
    const ChunkWork w = chunk_work(chunks[c]);
    const double b = action_units(w.b);
    EXPECT_DOUBLE_EQ(costs.chunks[c].f, action_units(w.f) + (c == 1 ? received : 0));
    EXPECT_DOUBLE_EQ(costs.chunks[c].b, b + (c == 0 && b > 0 ? received : 0));
    EXPECT_DOUBLE_EQ(costs.chunks[c].w, action_units(w.w));
    EXPECT_DOUBLE_EQ(one_device.chunks[c].f, action_units(w.f));
    EXPECT_DOUBLE_EQ(one_device.chunks[c].b, b);
    EXPECT_DOUBLE_EQ(costs.chunks[c].activation, static_cast<double>(chunks[c].kept_bytes));
    EXPECT_DOUBLE_EQ(costs.chunks[c].comm, static_cast<double>(plan.chunks[c].link_out) * 1e-9);
  }
  // The chunk after the cut: its weight products are W's, not B's (the per-node estimate,
  // which sees a Transpose's output where the weight is, gave W a few thousandths of F).
  const ChunkWork last = chunk_work(chunks[1]);
  EXPECT_GT(last.w.flops_fwd, last.f.flops_fwd / 2);
}

// Recompute adds its forward FLOPs to B's graph, and nothing to F's or W's.
TEST(ChunkCosts, RecomputeIsCountedInB) {
  const Graph g = testing::load_sample("gpt", 2);
  const std::vector<BackwardGraphs> none = testing::sample_chunks(g, 2, "none");
  const std::vector<BackwardGraphs> full = testing::sample_chunks(g, 2, "full");
  for (size_t c = 0; c < 2; ++c) {
    const ChunkWork a = chunk_work(none[c]), b = chunk_work(full[c]);
    EXPECT_EQ(b.f.flops_fwd, a.f.flops_fwd) << c;
    EXPECT_EQ(b.w.flops_fwd, a.w.flops_fwd) << c;
    EXPECT_GT(full[c].recompute_flops, 0) << c;
    EXPECT_EQ(b.b.flops_fwd - a.b.flops_fwd, full[c].recompute_flops) << c;
  }
}

}  // namespace
}  // namespace pt
