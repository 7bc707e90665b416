// tests/exec/one_node.h: one node run as a graph of its own through StageProgram on the CPU
// backend (so through the kernel registry), as the kernel tests drive it: arguments fed at run
// time, constant (initializers) or omitted; outputs of given types, or omitted. Header-only.
#pragma once

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/ir.h"
#include "core/pipetrain_ops.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/stage_program.h"
#include "tests/exec/test_tensors.h"

namespace pt::testing {

// One node's argument: data fed at run time, constant data (an initializer), or omitted.
struct Arg {
  Tensor data;
  bool constant = false;
  bool omitted = false;
};
inline Arg fed(Tensor t) { return {std::move(t), false, false}; }
inline Arg constant(Tensor t) { return {std::move(t), true, false}; }
inline Arg omitted() { return {Tensor{}, false, true}; }

// A float32 output of this shape; kOmitted (dtype kUndefined) for an omitted one.
inline TensorType out_f32(const std::vector<int64_t>& shape) { return {DType::kFloat32, shape}; }
inline const TensorType kOmitted{};

struct OneNode {
  Graph graph;
  std::vector<Tensor> feeds;
};

// The graph: node `op` (domain "pipetrain" unless `onnx`), its args and outputs.
inline OneNode build(const std::string& op, const std::vector<Arg>& args,
                     const std::vector<TensorType>& outs, std::map<std::string, AttrValue> attrs,
                     bool onnx = false) {
  OneNode one;
  Graph& g = one.graph;
  g.name = op;
  g.opsets[""] = 18;
  g.opsets[kPipetrainDomain] = 1;
  Node node;
  node.name = op + "_0";
  node.op_type = op;
  node.domain = onnx ? "" : kPipetrainDomain;
  node.attrs = std::move(attrs);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string name = "in" + std::to_string(i);
    if (args[i].omitted) {
      node.inputs.push_back(kNoValue);
    } else if (args[i].constant) {
      node.inputs.push_back(g.add_initializer(name, args[i].data, true));
    } else {
      node.inputs.push_back(g.add_value(name, args[i].data.type));
      g.inputs.push_back(node.inputs.back());
      one.feeds.push_back(args[i].data);
    }
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    if (outs[k].dtype == DType::kUndefined) {
      node.outputs.push_back(kNoValue);
      continue;
    }
    node.outputs.push_back(g.add_value("out" + std::to_string(k), outs[k]));
    g.outputs.push_back(node.outputs.back());
  }
  g.add_node(std::move(node));
  g.rebuild_uses();
  return one;
}

// Runs the node twice (as a training loop would) on `threads` threads; the present outputs of
// the second run, in order.
inline std::vector<Tensor> run(const std::string& op, const std::vector<Arg>& args,
                               const std::vector<TensorType>& outs,
                               std::map<std::string, AttrValue> attrs = {}, bool onnx = false,
                               int threads = 2) {
  OneNode one = build(op, args, outs, std::move(attrs), onnx);
  CpuBackend backend(threads);
  StageProgram program(one.graph, backend);
  std::vector<Buffer> feeds;
  for (size_t k = 0; k < one.feeds.size(); ++k)
    feeds.push_back({one.feeds[k].data.data(), &one.graph.value(one.graph.inputs[k]).type});
  program.run(feeds);
  program.run(feeds);
  backend.synchronize();
  std::vector<Tensor> results;
  for (size_t k = 0; k < one.graph.outputs.size(); ++k) {
    const Buffer b = program.output(k);
    Tensor t = make_tensor(b.type->dtype, b.type->shape);
    std::memcpy(t.data.data(), b.data, t.data.size());
    results.push_back(std::move(t));
  }
  return results;
}

}  // namespace pt::testing
