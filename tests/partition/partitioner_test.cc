#include "partition/partitioner.h"

#include <gtest/gtest.h>
#include <onnx/checker.h>

#include <cmath>
#include <regex>
#include <set>

#include "core/error.h"
#include "onnx_import/export.h"
#include "onnx_import/import.h"
#include "partition/cost_model.h"
#include "partition/cut.h"
#include "partition/initializer_roles.h"

namespace pt {
namespace {

struct Loaded {
  Graph g;
  std::vector<NodeCost> costs;
};

Loaded load(const std::string& name, int64_t batch = 4) {
  ImportOptions o;
  o.batch = batch;
  Loaded l{import_model("samples/" + name + "/" + name + ".onnx", o), {}};
  l.costs = estimate_costs(l.g);
  return l;
}

PartitionPlan plan(const Loaded& l, int stages, Strategy s = Strategy::kBalanced,
                   int chunks = 1, int64_t limit = 0) {
  PartitionOptions o;
  o.stages = stages;
  o.strategy = s;
  o.chunks_per_stage = chunks;
  o.memory.limit = limit;
  return plan_partition(l.g, l.costs, o);
}

TEST(CostModel, MatMulFlopsFollowTheFormula) {
  Loaded l = load("gpt", 2);
  int checked = 0;
  for (size_t i = 0; i < l.g.nodes.size(); ++i) {
    const Node& n = l.g.nodes[i];
    if (n.op_type != "MatMul") continue;
    const auto& a = l.g.value(n.inputs[0]).type.shape;
    const auto& y = l.g.value(n.outputs[0]).type.shape;
    const int64_t k = a.back();
    EXPECT_EQ(l.costs[i].flops_fwd, 2 * l.g.value(n.outputs[0]).type.numel() * k) << n.name;
    const bool weight = l.g.value(n.inputs[1]).is_parameter();
    if (weight) EXPECT_EQ(l.costs[i].flops_bwd_weight, l.costs[i].flops_fwd) << n.name;
    (void)y;
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

// A product whose operands and output together fit one core's L2 moves them at cache bandwidth
// (kFlopsPerCachedByte), one past it streams them from memory (kFlopsPerByte): the same product
// priced per byte below a bigger one's. A weight gradient summed into an accumulator of its shape
// moves nothing for it (the product's sum reads the lines its stores write), a row bias is read.
TEST(CostModel, BytesThatFitACoresL2ArePricedAtCacheBandwidth) {
  const auto product = [](int64_t rows, int64_t in, int64_t out, bool accumulate) {
    Graph g;
    const ValueId x = g.add_value("x", TensorType{DType::kFloat32, {rows, in}});
    const ValueId w = g.add_initializer("w", Tensor{TensorType{DType::kFloat32, {in, out}},
                                                    std::vector<std::byte>(static_cast<size_t>(in * out) * 4)});
    const ValueId acc = g.add_value("acc", TensorType{DType::kFloat32, {rows, out}});
    const ValueId p = g.add_value("p", TensorType{DType::kFloat32, {rows, out}});
    const ValueId y = g.add_value("y", TensorType{DType::kFloat32, {rows, out}});
    g.add_node(Node{"mm", "MatMul", "", {x, w}, {p}, {}});
    g.add_node(Node{"sum", "Add", "", {acc, p}, {y}, {}});
    g.inputs = {x, acc};
    g.outputs = {y};
    g.rebuild_uses();
    std::vector<NodeCost> c = estimate_costs(g);
    if (!accumulate) c.pop_back();
    return total_cost(c);
  };
  const NodeCost small = product(16, 64, 64, false), big = product(1024, 512, 512, false);
  const int64_t small_bytes = (16 * 64 + 64 * 64 + 16 * 64) * 4, big_bytes = (1024 * 512 * 2 + 512 * 512) * 4;
  EXPECT_EQ(small.bytes_read + small.bytes_written, small_bytes);
  EXPECT_EQ(small.cached_bytes, small_bytes);
  EXPECT_EQ(small.byte_flops(), kFlopsPerCachedByte * small_bytes);
  EXPECT_EQ(big.cached_bytes, 0);
  EXPECT_EQ(big.byte_flops(), kFlopsPerByte * big_bytes);
  EXPECT_LT(kFlopsPerCachedByte, kFlopsPerByte);
  EXPECT_LT(static_cast<double>(small.byte_flops()) / static_cast<double>(small_bytes),
            static_cast<double>(big.byte_flops()) / static_cast<double>(big_bytes));
  // The accumulator: no bytes of its own, no kernel.
  const NodeCost summed = product(16, 64, 64, true);
  EXPECT_EQ(summed.bytes_read + summed.bytes_written, small_bytes);
  EXPECT_EQ(summed.launch, small.launch);
}

// Each kernel's fixed part by what runs it: a product, a convolution, a row-normalising kernel or
// one of oneDNN's priced as a library call, a plain loop of pipetrain's own at the least.
TEST(CostModel, KernelsFixedCostsByWhatRunsThem) {
  const auto node = [](const char* op, const char* domain) { return Node{"n", op, domain, {}, {}, {}}; };
  EXPECT_EQ(launch_flops(node("MatMul", "")), kFlopsPerProduct);
  EXPECT_EQ(launch_flops(node("Conv", "")), kFlopsPerConvolution);
  EXPECT_EQ(launch_flops(node("ConvGradInput", "pipetrain")), kFlopsPerConvolutionGradInput);
  EXPECT_EQ(launch_flops(node("ConvGradWeight", "pipetrain")), kFlopsPerConvolutionGradWeight);
  for (const char* op : {"LayerNormalization", "Softmax", "MaxPool"})
    EXPECT_EQ(launch_flops(node(op, "")), kFlopsPerLibraryCall) << op;
  for (const char* op :
       {"SoftmaxGrad", "LayerNormGrad", "SoftmaxCrossEntropy", "SoftmaxCrossEntropyGrad", "BatchNormGrad"})
    EXPECT_EQ(launch_flops(node(op, "pipetrain")), kFlopsPerLibraryCall) << op;
  for (const char* op : {"Add", "Transpose", "ReduceSum", "Gelu"})
    EXPECT_EQ(launch_flops(node(op, "")), kFlopsPerKernel) << op;
  EXPECT_LT(kFlopsPerKernel, kFlopsPerProduct);
}

// A 1x1 Conv and its input gradient on one pixel per image run as one matrix product on the CPU
// (exec/cpu/nn.cc, nn_grad.cc), and are priced so; on 2x2 maps they stay convolutions.
TEST(CostModel, PointwiseConvolutionsOnOnePixelArePricedAsProducts) {
  const auto launch = [](const char* op, const char* domain, int64_t pixels_side) {
    Graph g;
    const std::vector<int64_t> x_shape{8, 80, pixels_side, pixels_side}, y_shape{8, 1280, pixels_side, pixels_side};
    const bool conv = std::string(op) == "Conv";
    const ValueId in = g.add_value("in", TensorType{DType::kFloat32, conv ? x_shape : y_shape});
    const ValueId w = g.add_value("w", TensorType{DType::kFloat32, {1280, 80, 1, 1}});
    const ValueId out = g.add_value("out", TensorType{DType::kFloat32, conv ? y_shape : x_shape});
    g.add_node(Node{"n", op, domain, {in, w}, {out}, {{"pads", std::vector<int64_t>{0, 0, 0, 0}}}});
    g.inputs = {in, w};
    g.outputs = {out};
    g.rebuild_uses();
    return estimate_costs(g)[0].launch;
  };
  EXPECT_EQ(launch("Conv", "", 1), kFlopsPerProduct);
  EXPECT_EQ(launch("ConvGradInput", "pipetrain", 1), kFlopsPerProduct);
  EXPECT_EQ(launch("Conv", "", 2), kFlopsPerConvolution);
  EXPECT_EQ(launch("ConvGradInput", "pipetrain", 2), kFlopsPerConvolutionGradInput);
}

// A depthwise conv on maps of at most 4 pixels, 16 channels or more, runs as a loop of
// pipetrain's own (exec/cpu/depthwise.cc), forward and input gradient, and starts as one; on 4x4
// maps, or on 8 channels, oneDNN runs it as a convolution. The weight gradient keeps its
// convolution's price.
TEST(CostModel, DepthwiseConvolutionsOnSmallMapsArePricedAsOwnLoops) {
  const auto launch = [](const char* op, int64_t channels, int64_t side) {
    Graph g;
    const std::vector<int64_t> map{8, channels, side, side}, w_shape{channels, 1, 3, 3};
    const std::string o = op;
    // Conv (X, W) -> Y; ConvGradInput (dY, W) -> dX; ConvGradWeight (dY, X) -> dW.
    const ValueId a = g.add_value("a", TensorType{DType::kFloat32, map});
    const ValueId b = g.add_value("b", TensorType{DType::kFloat32, o == "ConvGradWeight" ? map : w_shape});
    const ValueId out = g.add_value("out", TensorType{DType::kFloat32, o == "ConvGradWeight" ? w_shape : map});
    g.add_node(Node{"n", op, o == "Conv" ? "" : "pipetrain", {a, b}, {out},
                    {{"group", channels}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}}});
    g.inputs = {a, b};
    g.outputs = {out};
    g.rebuild_uses();
    return estimate_costs(g)[0].launch;
  };
  for (const char* op : {"Conv", "ConvGradInput"}) {
    SCOPED_TRACE(op);
    EXPECT_EQ(launch(op, 96, 2), kFlopsPerKernel);
    EXPECT_EQ(launch(op, 240, 1), kFlopsPerKernel);
    EXPECT_NE(launch(op, 48, 4), kFlopsPerKernel);
    EXPECT_NE(launch(op, 8, 2), kFlopsPerKernel);
  }
  EXPECT_EQ(launch("ConvGradWeight", 96, 2), kFlopsPerConvolutionGradWeight);
}

TEST(CostModel, TokenIdsNeedNoGradient) {
  Loaded l = load("gpt", 2);
  const std::vector<bool> needs = needs_gradient(l.g);
  for (ValueId in : l.g.inputs) EXPECT_FALSE(needs[static_cast<size_t>(in)]);
  for (ValueId out : l.g.outputs) EXPECT_TRUE(needs[static_cast<size_t>(out)]);
}

TEST(Partition, BalancedBeatsParamsOnTheTransformer) {
  Loaded l = load("gpt");
  PartitionPlan balanced = plan(l, 4);
  PartitionPlan by_params = plan(l, 4, Strategy::kParams);
  EXPECT_LE(balanced.imbalance, 1.10);
  EXPECT_GT(by_params.imbalance, balanced.imbalance);
}

TEST(Partition, ChunksReadOnlyWhatCrossesIntoThem) {
  for (const char* name : {"gpt", "bert", "vit", "resnet", "mobilenet", "mlp"}) {
    Loaded l = load(name);
    for (int stages : {2, 3, 4}) {
      PartitionPlan p = plan(l, stages);
      ASSERT_EQ(static_cast<int>(p.chunks.size()), stages);
      EXPECT_EQ(p.chunks.front().begin, 0);
      EXPECT_EQ(p.chunks.back().end, static_cast<int>(l.g.nodes.size()));
      for (const ChunkPlan& c : p.chunks) {
        EXPECT_LT(c.begin, c.end);
        std::set<ValueId> available(c.inputs.begin(), c.inputs.end());
        for (int i = c.begin; i < c.end; ++i) {
          for (ValueId v : l.g.nodes[static_cast<size_t>(i)].inputs)
            if (v != kNoValue && !l.g.value(v).is_initializer())
              EXPECT_TRUE(available.count(v)) << name << " chunk " << c.index << " reads "
                                              << l.g.value(v).name;
          for (ValueId v : l.g.nodes[static_cast<size_t>(i)].outputs) available.insert(v);
        }
        for (ValueId v : c.outputs) EXPECT_TRUE(available.count(v)) << name;
        if (c.index + 1 < stages) {
          const ChunkPlan& next = p.chunks[static_cast<size_t>(c.index) + 1];
          EXPECT_EQ(std::set<ValueId>(next.inputs.begin(), next.inputs.end()),
                    std::set<ValueId>(c.outputs.begin(), c.outputs.end()))
              << name << ": what leaves chunk " << c.index << " is what the next one takes";
        }
      }
      EXPECT_EQ(p.chunks.back().outputs, l.g.outputs);
      for (const ChunkPlan& c : p.chunks) {
        onnx::ModelProto m = to_model_proto(cut_chunk(l.g, c));
        EXPECT_NO_THROW(onnx::checker::check_model(m)) << name << " chunk " << c.index;
      }
    }
  }
}

TEST(Partition, VShapePlacesChunksInAV) {
  Loaded l = load("gpt");
  PartitionPlan p = plan(l, 2, Strategy::kBalanced, 2);
  ASSERT_EQ(p.chunks.size(), 4u);
  std::vector<int> devices;
  for (const ChunkPlan& c : p.chunks) devices.push_back(c.device);
  EXPECT_EQ(devices, (std::vector<int>{0, 1, 1, 0}));
}

TEST(Partition, MemoryLimitHonouredOrRefused) {
  Loaded l = load("gpt");
  PartitionPlan free_plan = plan(l, 4);
  int64_t worst = 0;
  for (const ChunkPlan& c : free_plan.chunks) worst = std::max(worst, c.memory);
  PartitionPlan tight = plan(l, 4, Strategy::kBalanced, 1, worst);
  for (const ChunkPlan& c : tight.chunks) EXPECT_LE(c.memory, worst);
  try {
    plan(l, 4, Strategy::kBalanced, 1, 1000);
    FAIL() << "a 1000-byte limit cannot fit";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("partition: no split into 4 stages fits the memory limit of", 0), 0u) << msg;
    EXPECT_NE(msg.find("the smallest that fits is"), std::string::npos) << msg;
  }
}

// Every chunk holds a node with FLOPs (the MLP's 7 nodes all have some): one more stage than
// that is one line naming the most that fit (tests/cli/stage_limit_test.cc: every sample).
TEST(Partition, MoreStagesThanNodesIsRefused) {
  Loaded l = load("mlp");
  const int n = static_cast<int>(l.g.nodes.size());
  try {
    plan(l, n + 1);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "partition: cannot cut the graph into " + std::to_string(n + 1) +
                  " stages that each hold a node with FLOPs: it has " + std::to_string(n) + " such nodes (of " +
                  std::to_string(n) + "); use at most " + std::to_string(n) + " stages");
  }
}

TEST(Partition, ManualCutsWhereTold) {
  Loaded l = load("mlp");
  PartitionOptions o;
  o.stages = 2;
  o.strategy = Strategy::kManual;
  o.cut_after = {l.g.nodes[1].name};
  PartitionPlan p = plan_partition(l.g, l.costs, o);
  EXPECT_EQ(p.chunks[0].end, 2);
  o.cut_after = {"no_such_node"};
  EXPECT_THROW(plan_partition(l.g, l.costs, o), UserError);
}

// Without prices, the transformer's balanced cuts at 4 stages fall inside blocks and move 3 or 4
// tensors each; over a slow link a stage waits for every one of them, and the cuts move to block
// boundaries, where one tensor crosses. The priced plan's slowest device is faster, links
// included, than the free plan's cuts would be over the same link.
TEST(Partition, SlowLinkCutsTheTransformerBetweenBlocks) {
  Loaded l = load("gpt");
  PartitionOptions o;
  o.stages = 4;
  const PartitionPlan free_plan = plan_partition(l.g, l.costs, o);
  size_t most = 0;
  for (size_t c = 0; c + 1 < free_plan.chunks.size(); ++c)
    most = std::max(most, free_plan.chunks[c].outputs.size());
  EXPECT_GE(most, 3u);

  o.link = link_preset("tcp");
  const PartitionPlan priced = plan_partition(l.g, l.costs, o);
  const std::regex block_end(R"(/blocks\.\d+/Add_1_output_0)");
  for (size_t c = 0; c + 1 < priced.chunks.size(); ++c) {
    const ChunkPlan& ch = priced.chunks[c];
    ASSERT_EQ(ch.outputs.size(), 1u) << "stage " << c;
    EXPECT_TRUE(std::regex_match(l.g.value(ch.outputs[0]).name, block_end)) << l.g.value(ch.outputs[0]).name;
    EXPECT_EQ(ch.link_out, o.link.cost(l.g.value(ch.outputs[0]).type.bytes(), 1));
    EXPECT_EQ(priced.chunks[c + 1].link_in, ch.link_out);
  }
  EXPECT_EQ(priced.chunks.front().link_in, 0);
  EXPECT_EQ(priced.chunks.back().link_out, 0);

  o.strategy = Strategy::kManual;  // the free plan's cuts, priced over the same link
  for (size_t c = 0; c + 1 < free_plan.chunks.size(); ++c)
    o.cut_after.push_back(l.g.nodes[static_cast<size_t>(free_plan.chunks[c].end - 1)].name);
  const PartitionPlan free_cuts = plan_partition(l.g, l.costs, o);
  int64_t slowest_priced = 0, slowest_free = 0;
  for (int d = 0; d < 4; ++d) {
    slowest_priced = std::max(slowest_priced, priced.device_time(d));
    slowest_free = std::max(slowest_free, free_cuts.device_time(d));
  }
  EXPECT_LT(slowest_priced, slowest_free);
}

TEST(Link, PresetsAndUnitsAsUsersWriteThem) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("10GB/s", "--bandwidth"), 10e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1.1e9", "--bandwidth"), 1.1e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("800MiB/s", "--bandwidth"), 800.0 * 1048576);
  EXPECT_DOUBLE_EQ(parse_latency("5us", "--latency"), 5e-6);
  EXPECT_DOUBLE_EQ(parse_latency("0.05ms", "--latency"), 5e-5);
  EXPECT_DOUBLE_EQ(parse_latency("2e-6", "--latency"), 2e-6);
  EXPECT_DOUBLE_EQ(parse_latency("1s", "--latency"), 1.0);
  const LinkModel tcp = link_preset("tcp");
  EXPECT_DOUBLE_EQ(tcp.seconds(1'100'000'000, 2), 1.0 + 2 * 50e-6);
  EXPECT_EQ(tcp.cost(1'100'000'000, 2), std::llround((1.0 + 2 * 50e-6) * 100e9));
  EXPECT_EQ(tcp.seconds(0, 0), 0.0);  // nothing crosses: no message either
  EXPECT_FALSE(link_preset("none").priced());
  EXPECT_EQ(link_preset("none").cost(1 << 30, 3), 0);
  for (const char* name : {"cpu", "nvlink", "pcie", "tcp"}) EXPECT_TRUE(link_preset(name).priced()) << name;

  auto message = [](auto f) {
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] { parse_bandwidth("fast", "--bandwidth"); }),
            "--bandwidth: 'fast' is not a bandwidth; write bytes per second, e.g. 10GB/s, "
            "800MiB/s or 1.1e9");
  EXPECT_EQ(message([] { parse_latency("-1us", "--latency"); }),
            "--latency: '-1us' is not a latency; write seconds with a unit, e.g. 5us, 0.05ms or 2e-6");
  EXPECT_EQ(message([] { link_preset("infiniband", "config.yaml:7: pipeline.link"); }),
            "config.yaml:7: pipeline.link: unknown link 'infiniband'; use none, cpu, nvlink, pcie or tcp");
}

// Which initializers train (what `inspect` lists): the MLP's all; GPT's causal mask, read only
// where no gradient flows, is a buffer; ResNet's BatchNorm running statistics are buffers.
TEST(InitializerRoles, BuffersAreWhatNoGradientReaches) {
  const auto buffers = [](const Graph& g) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const InitializerRole& r : initializer_roles(g))
      if (!r.trained) out.emplace_back(r.name, r.why);
    return out;
  };
  const Loaded mlp = load("mlp");
  EXPECT_EQ(initializer_roles(mlp.g).size(), 8u);
  EXPECT_TRUE(buffers(mlp.g).empty());
  const auto gpt = buffers(load("gpt").g);
  ASSERT_EQ(gpt.size(), 1u);
  EXPECT_EQ(gpt[0].first, "mask");
  EXPECT_EQ(gpt[0].second, "read only where no gradient flows, e.g. a mask");
  const Loaded resnet = load("resnet");
  const auto bn = buffers(resnet.g);
  EXPECT_EQ(initializer_roles(resnet.g).size() - bn.size(), 47u);
  ASSERT_EQ(bn.size(), 30u);
  EXPECT_EQ(bn[0].first, "bn1.running_mean");
  for (const auto& [name, why] : bn) EXPECT_EQ(why, "BatchNorm running statistic") << name;
}

}  // namespace
}  // namespace pt

namespace pt {
namespace {

// FusedAttention: a causal one visits the S (S + 1) / 2 pairs on and below the diagonal, so it
// costs about half the full one, forward and backward; its backward keeps Q, K, V, Y and the
// rows' log-sum-exp (O(S) per head), never the S x S scores the unfused Softmax keeps.
TEST(CostModel, FusedAttentionSkipsTheCausalHalfAndKeepsNoScores) {
  const int64_t b = 2, h = 4, s = 64, d = 16;
  const auto costs = [&](bool causal) {
    Graph g;
    const TensorType t{DType::kFloat32, {b, h, s, d}};
    const ValueId x = g.add_value("x", t);
    const ValueId w = g.add_initializer("w", Tensor{TensorType{DType::kFloat32, {d, d}},
                                                    std::vector<std::byte>(d * d * sizeof(float))});
    const ValueId q = g.add_value("q", t), y = g.add_value("y", t), out = g.add_value("out", t);
    g.add_node(Node{"proj", "MatMul", "", {x, w}, {q}, {}});
    g.add_node(Node{"attn", "FusedAttention", "pipetrain", {q, q, q}, {y},
                    {{"scale", 0.25f}, {"causal", int64_t{causal}}}});
    g.add_node(Node{"out", "MatMul", "", {y, w}, {out}, {}});
    g.inputs = {x};
    g.outputs = {out};
    g.rebuild_uses();
    return estimate_costs(g)[1];
  };
  const NodeCost full = costs(false), causal = costs(true);
  const double pairs_ratio = double(s * (s + 1) / 2) / double(s * s);
  EXPECT_NEAR(double(causal.flops_fwd) / double(full.flops_fwd), pairs_ratio, 1e-9);
  EXPECT_NEAR(double(causal.flops_bwd_input) / double(full.flops_bwd_input), pairs_ratio, 1e-9);
  EXPECT_GT(full.flops_bwd_input, full.flops_fwd);
  EXPECT_EQ(full.flops_bwd_weight, 0);
  EXPECT_EQ(full.saved_bytes, b * h * s * d * 4);  // Y; Q is MatMul's, charged there
}

}  // namespace
}  // namespace pt
