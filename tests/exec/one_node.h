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

// A one-node graph and the data fed to it (graph-input order).
struct OneNode {
  Graph graph;
  std::vector<Tensor> feeds;
};

// The one-node graph, graph and node named `name`: `op` of `domain` ("" for ONNX's) at ONNX
// opset `opset` (pipetrain and com.microsoft opset 1), its args (the fed ones graph inputs, in
// order, their data in feeds) and outputs (dtype kUndefined: omitted).
inline OneNode build_node(const std::string& name, const std::string& op,
                          const std::string& domain, const std::vector<Arg>& args,
                          const std::vector<TensorType>& outs,
                          std::map<std::string, AttrValue> attrs, int64_t opset) {
  OneNode one;
  Graph& g = one.graph;
  g.name = name;
  g.opsets[""] = opset;
  g.opsets[kPipetrainDomain] = 1;
  g.opsets["com.microsoft"] = 1;
  Node node;
  node.name = name;
  node.op_type = op;
  node.domain = domain;
  node.attrs = std::move(attrs);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string in = "in" + std::to_string(i);
    if (args[i].omitted) {
      node.inputs.push_back(kNoValue);
    } else if (args[i].constant) {
      node.inputs.push_back(g.add_initializer(in, args[i].data, true));
    } else {
      node.inputs.push_back(g.add_value(in, args[i].data.type));
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

// Node `op` (domain "pipetrain" unless `onnx`) named op_0, at opset 18.
inline OneNode build(const std::string& op, const std::vector<Arg>& args,
                     const std::vector<TensorType>& outs, std::map<std::string, AttrValue> attrs,
                     bool onnx = false) {
  return build_node(op + "_0", op, onnx ? "" : kPipetrainDomain, args, outs, std::move(attrs), 18);
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
  for (size_t k = 0; k < one.graph.outputs.size(); ++k)
    results.push_back(download(backend, program.output(k)));
  return results;
}

}  // namespace pt::testing
