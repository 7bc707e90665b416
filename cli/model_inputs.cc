#include "cli/model_inputs.h"

#include <set>

#include "cli/args.h"
#include "core/error.h"
#include "core/ir.h"
#include "onnx_import/load.h"

namespace pt {

std::vector<onnx::ValueInfoProto> declared_inputs(const std::string& path) {
  const onnx::ModelProto m = read_model(path, ExternalData::kLeaveFloats);  // no weight read
  std::set<std::string> inits;
  for (const auto& t : m.graph().initializer()) inits.insert(t.name());
  std::vector<onnx::ValueInfoProto> out;
  for (const auto& in : m.graph().input())
    if (!inits.count(in.name())) out.push_back(in);
  return out;
}

std::string declared_str(const onnx::ValueInfoProto& in) {
  std::string s = in.name() + " " + dtype_name(static_cast<DType>(in.type().tensor_type().elem_type())) + "[";
  const auto& dims = in.type().tensor_type().shape().dim();
  for (int k = 0; k < dims.size(); ++k) {
    if (k) s += ",";
    if (dims[k].has_dim_value()) s += std::to_string(dims[k].dim_value());
    else s += dims[k].dim_param().empty() ? std::string("?") : dims[k].dim_param();
  }
  return s + "]";
}

bool batch_is_symbolic(const onnx::ValueInfoProto& in, const std::map<std::string, int64_t>& dims) {
  const auto& shape = in.type().tensor_type().shape();
  if (shape.dim_size() == 0 || shape.dim(0).has_dim_value()) return false;
  return !dims.count(shape.dim(0).dim_param());
}

void check_dims_named(const std::map<std::string, int64_t>& dims, const std::vector<onnx::ValueInfoProto>& declared) {
  std::set<std::string> named;
  for (const auto& in : declared)
    for (const auto& d : in.type().tensor_type().shape().dim())
      if (!d.has_dim_value() && !d.dim_param().empty()) named.insert(d.dim_param());
  for (const auto& [name, value] : dims) {
    if (named.count(name)) continue;
    std::string list;
    for (const std::string& n : named) list += (list.empty() ? "" : ", ") + n;
    throw UserError("--dim " + name + "=" + std::to_string(value),
                    "the model's inputs have no symbolic dimension '" + name + "'",
                    named.empty() ? std::string("they have none, so leave --dim out")
                                  : "name one of " + list);
  }
}

std::map<std::string, int64_t> model_dims(const std::string& path, const std::vector<std::string>& dims) {
  std::map<std::string, int64_t> out = parse_dims(dims);
  if (!out.empty()) check_dims_named(out, declared_inputs(path));
  return out;
}

}  // namespace pt
