// Attention as the samples and today's exports write it becomes one FusedAttention node at import
// when ImportOptions::fuse_attention is set (onnx_import/attention_fusion.h): how many each file
// fuses, what `inspect` says of them, and the fused program's outputs against the unfused one's
// on the CPU backend.
#include "onnx_import/attention_fusion.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "exec/cpu/cpu_backend.h"
#include "exec/stage_program.h"
#include "onnx_import/import.h"
#include "tests/exec/test_tensors.h"

namespace pt {
namespace {

Graph import(const std::string& path, bool fuse) {
  ImportOptions o;
  o.batch = 2;
  o.fuse_attention = fuse;
  o.fuse_attention_from = 1;  // every attention, however few its keys
  return import_model(path, o);
}

int count(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes) n += node.op_type == op;
  return n;
}

// The graph's inputs: normal floats, token ids in [0, 16); fixed seed.
std::vector<Tensor> random_inputs(const Graph& g) {
  std::mt19937 rng(5);
  std::vector<Tensor> out;
  for (ValueId v : g.inputs) out.push_back(testing::random_tensor(g.value(v).type, rng, 16));
  return out;
}

std::vector<float> run_forward(const Graph& g, std::vector<Tensor>& inputs) {
  CpuBackend backend(2);
  StageProgram program(g, backend);
  std::vector<Buffer> feeds;
  for (size_t k = 0; k < inputs.size(); ++k) feeds.push_back({inputs[k].data.data(), &g.value(g.inputs[k]).type});
  program.run(feeds);
  const Buffer out = program.output(0);
  return std::vector<float>(out.as<float>(), out.as<float>() + out.numel());
}

struct Expected {
  const char* path;
  int fused;
  bool causal;
  int kv_heads = 0;  // K and V heads the fused node reads where fewer than Q's (grouped-query)
};

// Every attention of these files fuses; the causal ones are those whose mask import knows.
// The grouped-query exports (2 heads on 1 K/V head) fuse with K and V as they are, their repeat
// per head (Unsqueeze, Expand, Reshape; K's through torch's SDPA decomposition) dropped.
const Expected kFiles[] = {
    {"samples/gpt/gpt.onnx", 8, true},        // a causal mask sliced from a buffer: causal, and
    {"samples/charlm/charlm.onnx", 4, true},  // the nodes computing the mask dropped with it
    {"samples/bert/bert.onnx", 4, false},      // no mask
    {"samples/vit/vit.onnx", 4, false},
    {"samples/exports/gpt2.onnx", 2, true},  // torch's SDPA decomposition: sqrt-scales, IsNaN
    {"samples/exports/llama.onnx", 2, true, 1},
    {"samples/exports/llama_noopt.onnx", 2, true, 1},
    {"samples/exports/mistral.onnx", 2, true, 1},
    {"samples/exports/qwen3.onnx", 2, true, 1},
    {"samples/exports/phi3.onnx", 2, true, 1},
    {"samples/exports/llama_opset23.onnx", 2, true, 1},  // ONNX Attention, decomposed: zeroed rows
    {"samples/exports/bert.onnx", 2, false},
    {"samples/exports/vit.onnx", 2, false},
};

TEST(AttentionFusion, SamplesAndExportsFuseEveryAttention) {
  for (const Expected& e : kFiles) {
    if (!std::filesystem::exists(e.path)) continue;  // exports are made by make_exports.py
    SCOPED_TRACE(e.path);
    const Graph plain = import(e.path, false);
    const Graph g = import(e.path, true);
    EXPECT_EQ(count(plain, "FusedAttention"), 0);
    EXPECT_EQ(count(g, "FusedAttention"), e.fused);
    EXPECT_EQ(count(g, "Softmax"), count(plain, "Softmax") - e.fused);
    for (const Node& n : g.nodes) {
      if (n.op_type != "FusedAttention") continue;
      EXPECT_EQ(n.attr_int("causal", 0) != 0, e.causal) << n.name;
      // A causal mask that removes nothing else is the causal flag alone (cuDNN takes no mask).
      if (e.causal) EXPECT_TRUE(n.inputs.size() < 4 || n.inputs[3] == kNoValue) << n.name << " reads a mask";
      const int64_t heads = g.value(n.inputs[0]).type.shape[1];
      for (int k : {1, 2}) EXPECT_EQ(g.value(n.inputs[k]).type.shape[1], e.kv_heads ? e.kv_heads : heads) << n.name;
    }
    if (e.kv_heads) EXPECT_EQ(count(g, "Expand"), 0);
    const auto lines = describe_attention(g);
    ASSERT_EQ(static_cast<int>(lines.size()), e.fused);
    for (const std::string& l : lines) EXPECT_EQ(l.rfind("fused: ", 0), 0u) << l;
  }
}

bool reads_mask(const Node& n) { return n.inputs.size() > 3 && n.inputs[3] != kNoValue; }

// masked = false (CUDA in bf16) fuses exactly the attentions whose fused node reads no mask and
// leaves the others as the exporter wrote them.
TEST(AttentionFusion, WithoutMasksFusesOnlyTheMasklessOnes) {
  int left_somewhere = 0;
  for (const Expected& e : kFiles) {
    if (!std::filesystem::exists(e.path)) continue;
    SCOPED_TRACE(e.path);
    const Graph all = import(e.path, true);
    Graph some = import(e.path, false);
    int maskless = 0, masked = 0;
    for (const Node& n : all.nodes)
      if (n.op_type == "FusedAttention") ++(reads_mask(n) ? masked : maskless);
    EXPECT_EQ(fuse_attention(some, 1, false), maskless);
    for (const Node& n : some.nodes)
      if (n.op_type == "FusedAttention") EXPECT_FALSE(reads_mask(n)) << n.name;
    EXPECT_EQ(count(some, "Softmax"), count(import(e.path, false), "Softmax") - maskless);
    left_somewhere += masked;
  }
  EXPECT_GT(left_somewhere, 0) << "no file has a masked attention: the test shows nothing";
}

// By default an attention over fewer than kFusedAttentionMinKeys keys stays as the exporter wrote
// it (the unfused products run faster there), and inspect says so: charlm's context is 64.
TEST(AttentionFusion, FewerKeysThanTheBoundStayUnfused) {
  Graph g = import_model("samples/charlm/charlm.onnx");
  EXPECT_EQ(fuse_attention(g), 0);
  const auto lines = describe_attention(g);
  ASSERT_EQ(lines.size(), 4u);
  for (const std::string& l : lines) EXPECT_NE(l.find("64 keys, fewer than 256"), std::string::npos) << l;
  EXPECT_EQ(fuse_attention(g, 64), 4);
}

// The fused program's output equals the unfused one's within float rounding (the kernel sums in
// another order; 1e-5 of the output's largest magnitude).
TEST(AttentionFusion, FusedForwardMatchesTheUnfusedOne) {
  for (const Expected& e : kFiles) {
    if (!std::filesystem::exists(e.path)) continue;
    SCOPED_TRACE(e.path);
    const Graph plain = import(e.path, false);
    const Graph g = import(e.path, true);
    std::vector<Tensor> inputs = random_inputs(plain);
    const std::vector<float> want = run_forward(plain, inputs);
    const std::vector<float> have = run_forward(g, inputs);
    ASSERT_EQ(have.size(), want.size());
    double top = 1e-30, worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      top = std::max(top, std::fabs(double(want[i])));
      worst = std::max(worst, std::fabs(double(have[i]) - want[i]));
    }
    EXPECT_LE(worst / top, 1e-5);
  }
}

// q [1, 2, 4, 8] @ kt -> Softmax -> Dropout (with a ratio: training; its input alone: dropout
// off) -> @ v.
Graph attention_with_dropout(bool training) {
  Graph g;
  g.opsets[""] = 17;
  const TensorType qt{DType::kFloat32, {1, 2, 4, 8}}, st{DType::kFloat32, {1, 2, 4, 4}};
  const ValueId q = g.add_value("q", qt), kt = g.add_value("kt", {DType::kFloat32, {1, 2, 8, 4}}),
                v = g.add_value("v", qt);
  const ValueId s = g.add_value("s", st), p = g.add_value("p", st), d = g.add_value("d", st),
                y = g.add_value("y", qt);
  Tensor ratio{TensorType{DType::kFloat32, {}}, std::vector<std::byte>(4)};
  ratio.as<float>()[0] = 0.1f;
  std::vector<ValueId> drop_in = {p};
  if (training) drop_in.push_back(g.add_initializer("ratio", std::move(ratio), true));
  g.add_node(Node{"qk", "MatMul", "", {q, kt}, {s}, {}});
  g.add_node(Node{"softmax", "Softmax", "", {s}, {p}, {{"axis", int64_t{-1}}}});
  g.add_node(Node{"drop", "Dropout", "", drop_in, {d}, {}});
  g.add_node(Node{"pv", "MatMul", "", {d, v}, {y}, {}});
  g.inputs = {q, kt, v};
  g.outputs = {y};
  g.rebuild_uses();
  return g;
}

// Attention dropout reads the probabilities: nothing fuses, and inspect says why. Dropout off
// (the identity) fuses, as an export without dropout does.
TEST(AttentionFusion, DropoutOnTheProbabilitiesStaysUnfused) {
  Graph g = attention_with_dropout(true);
  EXPECT_EQ(fuse_attention(g, 1), 0);
  EXPECT_EQ(g.nodes.size(), 4u);
  const auto lines = describe_attention(g);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("attention dropout"), std::string::npos) << lines[0];
  Graph off = attention_with_dropout(false);
  EXPECT_EQ(fuse_attention(off, 1), 1);
  ASSERT_EQ(off.nodes.size(), 2u);  // K's Transpose, the FusedAttention
  EXPECT_EQ(off.nodes[1].op_type, "FusedAttention");
  EXPECT_EQ(off.nodes[1].outputs[0], off.outputs[0]);
}

}  // namespace
}  // namespace pt
