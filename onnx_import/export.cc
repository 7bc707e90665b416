#include "onnx_import/export.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "onnx_import/load.h"
#include "onnx_import/proto_convert.h"

namespace pt {

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
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path tmp = target.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError(path, "cannot be written", "check that its folder exists and is writable");
    if (!m.SerializeToOstream(&out) || !out.flush()) {
      out.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      throw UserError(path, "writing failed (disk full?)", "free space and run again");
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) throw UserError(path, "cannot be replaced: " + ec.message(), "check the folder's permissions");
}

void save_model_with_weights(const std::string& source,
                             const std::map<std::string, const Tensor*>& weights,
                             const std::string& path) {
  onnx::ModelProto m = read_model(source);
  size_t replaced = 0;
  for (onnx::TensorProto& init : *m.mutable_graph()->mutable_initializer()) {
    auto it = weights.find(init.name());
    if (it == weights.end()) continue;
    const Tensor old = tensor_from_proto(init, source + ": initializer '" + init.name() + "'");
    if (!(old.type == it->second->type))
      throw UserError(source + ": initializer '" + init.name() + "'",
                      "is " + old.type.str() + " but the trained value is " + it->second->type.str(),
                      "train and export the same model file");
    init.Clear();
    tensor_to_proto(*it->second, it->first, &init);
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

}  // namespace pt
