#include "onnx_import/cast_like.h"

namespace pt {

int cast_like_to_cast(onnx::GraphProto* g, const std::map<std::string, TensorType>& types) {
  int rewritten = 0;
  for (auto& n : *g->mutable_node()) {
    if (n.op_type() != "CastLike" || !(n.domain().empty() || n.domain() == "ai.onnx")) continue;
    if (n.input_size() != 2) continue;  // the checker has refused it already
    auto like = types.find(n.input(1));
    if (like == types.end()) continue;
    n.set_op_type("Cast");
    n.mutable_input()->RemoveLast();
    auto* to = n.add_attribute();
    to->set_name("to");
    to->set_type(onnx::AttributeProto::INT);
    to->set_i(static_cast<int64_t>(like->second.dtype));
    ++rewritten;
  }
  return rewritten;
}

}  // namespace pt
