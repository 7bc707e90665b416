#include "onnx_import/declared_inputs.h"

#include <set>

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

}  // namespace pt
