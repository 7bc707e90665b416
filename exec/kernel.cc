#include "exec/kernel.h"

namespace pt {

const Tensor* KernelSpec::constant(size_t i) const {
  if (i >= node.inputs.size() || node.inputs[i] == kNoValue) return nullptr;
  const Value& v = graph.value(node.inputs[i]);
  return v.init ? v.init.get() : nullptr;
}

}  // namespace pt
