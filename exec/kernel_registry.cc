#include "exec/kernel_registry.h"

namespace pt {

std::string op_key(const Node& n) {
  return n.domain.empty() || n.domain == "ai.onnx" ? n.op_type : n.domain + "::" + n.op_type;
}

std::string no_kernel_reason(const std::string& backend, const KernelSpec& spec, bool registered) {
  if (!registered) return "the " + backend + " backend has no kernel for " + op_key(spec.node);
  std::string types;
  for (const TensorType& t : spec.inputs) types += (types.empty() ? "" : ", ") + t.str();
  return "the " + backend + " kernel for " + op_key(spec.node) + " does not take inputs (" +
         types + ") with these attributes";
}

}  // namespace pt
