#include "onnx_import/buffers.h"

#include <vector>

#include "core/ir.h"

namespace pt {
namespace {

using Consumers = std::map<std::string, std::vector<std::pair<const onnx::NodeProto*, int>>>;

// A weight or bias input: of MatMul/Gemm, Conv, a normalisation's scale or bias, a Gather table.
bool read_at_parameter_site(const std::string& name, const Consumers& consumers) {
  auto it = consumers.find(name);
  if (it == consumers.end()) return false;
  for (const auto& [n, i] : it->second) {
    const std::string& op = n->op_type();
    if (op == "MatMul" || op == "Gemm" || (op == "Conv" && i >= 1) || (op == "Gather" && i == 0) ||
        ((op == "LayerNormalization" || op == "BatchNormalization") && (i == 1 || i == 2)))
      return true;
  }
  return false;
}

bool is_view_or_cast(const std::string& op) {
  return op == "Slice" || op == "Reshape" || op == "Unsqueeze" || op == "Squeeze" || op == "Expand" ||
         op == "Transpose" || op == "Cast" || op == "Identity";
}

// Every use of `name` is an Add or Sub, or a view or cast whose uses are (depth-limited).
bool only_added(const std::string& name, const Consumers& consumers, int depth = 0) {
  auto it = consumers.find(name);
  if (it == consumers.end() || depth > 8) return false;
  for (const auto& [n, i] : it->second) {
    const std::string& op = n->op_type();
    if (op == "Add" || op == "Sub") continue;
    if (!is_view_or_cast(op) || i != 0) return false;
    for (const std::string& out : n->output())
      if (!out.empty() && !only_added(out, consumers, depth + 1)) return false;
  }
  return true;
}

bool is_additive_mask(const onnx::TensorProto& t, const Consumers& consumers) {
  const int r = t.dims_size();
  return r >= 2 && t.dims(r - 1) == t.dims(r - 2) && t.dims(r - 1) > 1 && only_added(t.name(), consumers);
}

bool is_rotary_table(const std::string& name) {
  const std::string last = name.substr(name.find_last_of("./") + 1);
  return last == "inv_freq" || last == "cos_cached" || last == "sin_cached";
}

}  // namespace

std::map<std::string, std::string> find_buffers(const onnx::GraphProto& g,
                                                const std::set<std::string>& declared) {
  Consumers consumers;
  for (const auto& n : g.node())
    for (int i = 0; i < n.input_size(); ++i)
      if (!n.input(i).empty()) consumers[n.input(i)].push_back({&n, i});
  std::map<std::string, std::string> out;
  for (const auto& t : g.initializer()) {
    if (!is_floating(static_cast<DType>(t.data_type()))) continue;
    const std::string& name = t.name();
    if (!declared.empty()) {
      if (!declared.count(name) && !read_at_parameter_site(name, consumers))
        out[name] = "the file's graph signature does not name it a parameter, and no weight or bias "
                    "input reads it";
    } else if (is_additive_mask(t, consumers)) {
      out[name] = "an additive attention mask: square in its last two dims and only added to scores";
    } else if (is_rotary_table(name)) {
      out[name] = "a rotary table (PyTorch's rotary modules keep it as a buffer)";
    }
  }
  return out;
}

}  // namespace pt
