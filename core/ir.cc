#include "core/ir.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace pt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: case DType::kInt32: case DType::kUInt32: return 4;
    case DType::kFloat64: case DType::kInt64: case DType::kUInt64: return 8;
    case DType::kFloat16: case DType::kBFloat16: case DType::kInt16: case DType::kUInt16: return 2;
    case DType::kInt8: case DType::kUInt8: case DType::kBool: return 1;
    case DType::kUndefined: case DType::kString: return 0;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt64: return "int64";
    case DType::kInt32: return "int32";
    case DType::kInt16: return "int16";
    case DType::kInt8: return "int8";
    case DType::kUInt64: return "uint64";
    case DType::kUInt32: return "uint32";
    case DType::kUInt16: return "uint16";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
    case DType::kString: return "string";
    case DType::kUndefined: return "undefined";
  }
  return "undefined";
}

bool is_floating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? "," : "") << shape[i];
  s << ']';
  return s.str();
}

std::optional<std::vector<int64_t>> broadcast_shapes(const std::vector<std::vector<int64_t>>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes)
    for (size_t d = 0; d < s.size(); ++d) {
      int64_t& o = out[rank - s.size() + d];
      if (s[d] == o || s[d] == 1) continue;
      if (o != 1) return std::nullopt;
      o = s[d];
    }
  return out;
}

std::optional<std::vector<int64_t>> int_values(const Tensor& t) {
  const int64_t n = t.type.numel();
  if (t.type.dtype == DType::kInt64) return std::vector<int64_t>(t.as<int64_t>(), t.as<int64_t>() + n);
  if (t.type.dtype == DType::kInt32) return std::vector<int64_t>(t.as<int32_t>(), t.as<int32_t>() + n);
  return std::nullopt;
}

std::string shapes_str(const std::vector<std::vector<int64_t>>& shapes) {
  std::string all;
  for (const auto& t : shapes) all += (all.empty() ? "" : " and ") + shape_str(t);
  return all;
}

std::string TensorType::str() const { return std::string(dtype_name(dtype)) + shape_str(shape); }

int64_t Node::attr_int(const std::string& key, int64_t fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  const int64_t* v = std::get_if<int64_t>(&it->second);
  PT_CHECK(v, "attribute '" + key + "' of " + label() + " is not an int");
  return *v;
}

float Node::attr_float(const std::string& key, float fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  const float* v = std::get_if<float>(&it->second);
  PT_CHECK(v, "attribute '" + key + "' of " + label() + " is not a float");
  return *v;
}

std::string Node::attr_string(const std::string& key, const std::string& fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  const std::string* v = std::get_if<std::string>(&it->second);
  PT_CHECK(v, "attribute '" + key + "' of " + label() + " is not a string");
  return *v;
}

std::vector<int64_t> Node::attr_ints(const std::string& key) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return {};
  const auto* v = std::get_if<std::vector<int64_t>>(&it->second);
  PT_CHECK(v, "attribute '" + key + "' of " + label() + " is not a list of ints");
  return *v;
}

std::string Node::label() const { return "node '" + name + "' (" + op_type + ")"; }

bool Node::is_view() const {
  return (domain.empty() || domain == "ai.onnx") &&
         (op_type == "Reshape" || op_type == "Flatten" || op_type == "Squeeze" ||
          op_type == "Unsqueeze" || op_type == "Identity");
}

bool Graph::moves_no_bytes(const Node& n) const {
  if (n.is_view()) return true;
  if (!(n.domain.empty() || n.domain == "ai.onnx") ||
      n.op_type != "GlobalAveragePool" || n.inputs.size() != 1 ||
      n.outputs.size() != 1 || n.inputs[0] == kNoValue || n.outputs[0] == kNoValue)
    return false;
  return value(n.inputs[0]).type == value(n.outputs[0]).type;
}

int64_t Graph::opset() const {
  auto it = opsets.find("");
  if (it == opsets.end()) it = opsets.find("ai.onnx");
  return it == opsets.end() ? 0 : it->second;
}

ValueId Graph::add_value(const std::string& value_name, const TensorType& type) {
  PT_CHECK(by_name_.count(value_name) == 0, "duplicate value name " + value_name);
  ValueId id = static_cast<ValueId>(values.size());
  values.push_back(Value{value_name, type, -1, {}, nullptr, false});
  by_name_[value_name] = id;
  return id;
}

ValueId Graph::add_initializer(const std::string& value_name, Tensor data, bool constant) {
  return add_initializer(value_name, std::make_shared<const Tensor>(std::move(data)), constant);
}

ValueId Graph::add_initializer(const std::string& value_name,
                               std::shared_ptr<const Tensor> data, bool constant) {
  ValueId id = add_value(value_name, data->type);
  values[static_cast<size_t>(id)].init = std::move(data);
  values[static_cast<size_t>(id)].constant = constant;
  initializers.push_back(id);
  return id;
}

int Graph::add_node(Node node) {
  nodes.push_back(std::move(node));
  return static_cast<int>(nodes.size()) - 1;
}

ValueId Graph::find(const std::string& value_name) const {
  auto it = by_name_.find(value_name);
  return it == by_name_.end() ? kNoValue : it->second;
}

void Graph::remove_nodes(const std::vector<bool>& gone) {
  std::vector<Node> kept;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (i >= gone.size() || !gone[i]) kept.push_back(std::move(nodes[i]));
  nodes = std::move(kept);
  rebuild_uses();
}

void Graph::rebuild_uses() {
  by_name_.clear();
  for (size_t i = 0; i < values.size(); ++i) {
    values[i].producer = -1;
    values[i].consumers.clear();
    by_name_[values[i].name] = static_cast<ValueId>(i);
  }
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (ValueId v : nodes[n].outputs)
      if (v != kNoValue) values[static_cast<size_t>(v)].producer = static_cast<int>(n);
    for (ValueId v : nodes[n].inputs) {
      if (v == kNoValue) continue;
      auto& c = values[static_cast<size_t>(v)].consumers;
      if (c.empty() || c.back() != static_cast<int>(n)) c.push_back(static_cast<int>(n));
    }
  }
}

int64_t Graph::parameter_bytes() const {
  int64_t total = 0;
  for (ValueId v : initializers)
    if (value(v).is_parameter()) total += value(v).type.bytes();
  return total;
}

int64_t Graph::parameter_count() const {
  int64_t total = 0;
  for (ValueId v : initializers)
    if (value(v).is_parameter()) total += value(v).type.numel();
  return total;
}

Graph extract_subgraph(const Graph& src, const std::string& name, const std::vector<Node>& nodes,
                       const std::vector<ValueId>& inputs, const std::vector<ValueId>& outputs) {
  Graph out;
  out.name = name;
  out.opsets = src.opsets;
  out.ir_version = src.ir_version;
  out.producer_name = src.producer_name;
  out.file_draws = src.file_draws;
  std::map<ValueId, ValueId> remap;  // id in src -> id in out
  auto map_value = [&](ValueId v) -> ValueId {
    if (v == kNoValue) return kNoValue;
    auto it = remap.find(v);
    if (it != remap.end()) return it->second;
    const Value& s = src.value(v);
    const ValueId id = s.is_initializer() ? out.add_initializer(s.name, s.init, s.constant)
                                          : out.add_value(s.name, s.type);
    remap[v] = id;
    return id;
  };
  for (ValueId v : inputs) out.inputs.push_back(map_value(v));
  for (const Node& n : nodes) {
    Node copy = n;
    for (ValueId& v : copy.inputs) v = map_value(v);
    for (ValueId& v : copy.outputs) v = map_value(v);
    if (!copy.domain.empty() && copy.domain != "ai.onnx" && !out.opsets.count(copy.domain))
      out.opsets[copy.domain] = 1;
    out.add_node(std::move(copy));
  }
  for (ValueId v : outputs) out.outputs.push_back(map_value(v));
  out.rebuild_uses();
  return out;
}

std::string graph_text(const Graph& g) {
  std::string s;
  const auto name = [&](ValueId v) { return v == kNoValue ? std::string("-") : g.value(v).name; };
  for (ValueId v : g.inputs) s += "input " + name(v) + " " + g.value(v).type.str() + "\n";
  for (const Node& n : g.nodes) {
    s += n.name + " = " + (n.domain.empty() ? "" : n.domain + "::") + n.op_type + "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) s += (i ? ", " : "") + name(n.inputs[i]);
    s += ") ->";
    for (ValueId o : n.outputs) {
      s.append(" ").append(name(o));
      if (o != kNoValue) s.append(" ").append(g.value(o).type.str());
    }
    s += "\n";
  }
  for (ValueId v : g.outputs) s += "output " + name(v) + " " + g.value(v).type.str() + "\n";
  return s;
}

}  // namespace pt
