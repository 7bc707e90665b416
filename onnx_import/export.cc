#include "onnx_import/export.h"

#include <onnx/checker.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/files.h"
#include "core/half_floats.h"
#include "onnx_import/load.h"
#include "onnx_import/proto_convert.h"
#include "onnx_import/widen_halves.h"

namespace pt {
namespace {

// Gelu (opset 20) written with opset-17 ops, so that an exported graph stays at the canonical
// opset (the form every runtime reads and the onnx library here checks):
//   none: Y = X * 0.5 * (1 + Erf(X / sqrt 2))
//   tanh: Y = X * 0.5 * (1 + Tanh(sqrt(2/pi) * (X + 0.044715 X^3)))
void write_gelu_as_opset17(const Node& n, const Graph& g, onnx::GraphProto* gp) {
  const std::string x = g.value(n.inputs[0]).name, y = g.value(n.outputs[0]).name;
  const std::string p = n.name + "/gelu17/";
  auto scalar = [&](const std::string& name, float v) {
    Tensor t;
    t.type = TensorType{DType::kFloat32, {}};
    t.data.resize(sizeof(float));
    std::memcpy(t.data.data(), &v, sizeof v);
    tensor_to_proto(t, p + name, gp->add_initializer());
    return p + name;
  };
  auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
    auto* np = gp->add_node();
    np->set_name(p + out);
    np->set_op_type(op);
    for (const std::string& i : in) np->add_input(i);
    np->add_output(out == y ? y : p + out);
    return out == y ? y : p + out;
  };
  std::string inner;
  if (n.attr_string("approximate", "none") == "tanh") {
    const std::string cube = node("Mul", {x, node("Mul", {x, x}, "x2")}, "x3");
    const std::string sum = node("Add", {x, node("Mul", {cube, scalar("c", 0.044715f)}, "cx3")}, "sum");
    inner = node("Tanh", {node("Mul", {sum, scalar("k", 0.7978845608028654f)}, "arg")}, "t");
  } else {
    inner = node("Erf", {node("Mul", {x, scalar("r", 0.7071067811865476f)}, "arg")}, "t");
  }
  const std::string half_x = node("Mul", {x, scalar("half", 0.5f)}, "half_x");
  node("Mul", {half_x, node("Add", {inner, scalar("one", 1.0f)}, "one_plus")}, y);
}

}  // namespace

onnx::ModelProto to_model_proto(const Graph& g) {
  onnx::ModelProto m;
  m.set_ir_version(g.ir_version);
  m.set_producer_name("pipetrain");
  for (const auto& [domain, version] : g.opsets) {
    auto* o = m.add_opset_import();
    o->set_domain(domain);
    o->set_version(version);
  }
  // A node domain the graph's opsets lack ("pipetrain" in a graph built by hand) is imported at
  // version 1, so that the model names every domain it uses.
  std::set<std::string> missing;
  for (const Node& n : g.nodes)
    if (!n.domain.empty() && n.domain != "ai.onnx" && !g.opsets.count(n.domain))
      missing.insert(n.domain);
  for (const std::string& domain : missing) {
    auto* o = m.add_opset_import();
    o->set_domain(domain);
    o->set_version(1);
  }
  auto* gp = m.mutable_graph();
  gp->set_name(g.name.empty() ? "pipetrain" : g.name);
  std::set<ValueId> io;
  for (ValueId v : g.inputs) {
    type_to_value_info(g.value(v).type, g.value(v).name, gp->add_input());
    io.insert(v);
  }
  for (ValueId v : g.outputs) {
    type_to_value_info(g.value(v).type, g.value(v).name, gp->add_output());
    io.insert(v);
  }
  for (ValueId v : g.initializers) {
    tensor_to_proto(*g.value(v).init, g.value(v).name, gp->add_initializer());
    io.insert(v);
  }
  for (const Node& n : g.nodes) {
    if (n.domain.empty() && n.op_type == "Gelu" && g.opset() < 20) {
      write_gelu_as_opset17(n, g, gp);
      if (!io.count(n.outputs[0]))
        type_to_value_info(g.value(n.outputs[0]).type, g.value(n.outputs[0]).name, gp->add_value_info());
      continue;
    }
    auto* np = gp->add_node();
    np->set_name(n.name);
    np->set_op_type(n.op_type);
    if (!n.domain.empty()) np->set_domain(n.domain);
    for (ValueId v : n.inputs) np->add_input(v == kNoValue ? "" : g.value(v).name);
    for (ValueId v : n.outputs) {
      np->add_output(v == kNoValue ? "" : g.value(v).name);
      if (v != kNoValue && !io.count(v))
        type_to_value_info(g.value(v).type, g.value(v).name, gp->add_value_info());
    }
    for (const auto& [key, value] : n.attrs) attr_to_proto(key, value, np->add_attribute());
  }
  return m;
}

void save_model(const onnx::ModelProto& m, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError(path, "is a folder", "name the model file, e.g. " + path + "/model.onnx");
  if (m.ByteSizeLong() > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw UserError(path, "cannot be written: the model is over 2 GiB, the most one protobuf holds",
                    "models this large need external data, which pipetrain does not write yet");
  // Streamed to the file: no second copy of the weights in memory.
  write_file_atomic(path, [&](int fd) { return m.SerializeToFileDescriptor(fd); },
                    "check that its folder exists and is writable, and has free space");
}

void save_model_with_weights(const std::string& source,
                             const std::map<std::string, const Tensor*>& weights,
                             const std::string& path, const ParameterChoices& choices, bool float32) {
  // The file's float initializers stay in their external-data file until written: a trained one
  // is never read, any other is read as it is written.
  onnx::ModelProto m = read_model(source, ExternalData::kLeaveFloats);
  restore_module_parameters(m.mutable_graph(), choices);  // the copies import trained
  if (float32) widen_half_floats(&m);
  size_t replaced = 0;
  for (onnx::TensorProto& init : *m.mutable_graph()->mutable_initializer()) {
    auto it = weights.find(init.name());
    if (it == weights.end()) {
      inline_placed(&init);
      continue;
    }
    const TensorType old = check_tensor_data(init, source + ": initializer '" + init.name() + "'");
    const bool narrow = is_half(old.dtype) && it->second->type == TensorType{DType::kFloat32, old.shape};
    if (!(old == it->second->type) && !narrow)
      throw UserError(source + ": initializer '" + init.name() + "'",
                      "is " + old.str() + " but the trained value is " + it->second->type.str(),
                      "train and export the same model file");
    init.Clear();
    tensor_to_proto(narrow ? narrowed(*it->second, old.dtype) : *it->second, it->first, &init);
    ++replaced;
  }
  if (replaced != weights.size())
    for (const auto& [name, t] : weights) {
      bool found = false;
      for (const onnx::TensorProto& init : m.graph().initializer()) found = found || init.name() == name;
      if (!found)
        throw UserError(source, "has no initializer '" + name + "' to carry the trained value",
                        "export the trained model from the file that was trained");
    }
  save_model(m, path);
}

void export_graphs(const std::vector<std::pair<std::string, Graph>>& files, const std::string& dir,
                   const std::string& flag) {
  namespace fs = std::filesystem;
  std::vector<onnx::ModelProto> models;
  for (const auto& [name, graph] : files) {
    models.push_back(to_model_proto(graph));
    try {
      onnx::checker::check_model(models.back());
    } catch (const std::exception& e) {
      PT_CHECK(false, name + " fails the onnx checker: " + e.what());
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir, "cannot create the export folder: " + ec.message(), "choose another " + flag);
  for (size_t k = 0; k < models.size(); ++k)
    save_model(models[k], (fs::path(dir) / files[k].first).string());
}

}  // namespace pt
