// onnx_import/opset_adapt.h: brings a model of any opset pipetrain takes (13..28) to the one form
// the rest of pipetrain reads, opset 17 of the default domain. In: a loaded ModelProto. Out: the
// same graph with every opset-18+ node rewritten to its opset-17 equivalent (inputs that became
// attributes moved back, attributes that only concern dtypes pipetrain refuses dropped) and the
// default opset import set to 17. A node whose newer form has no opset-17 equivalent, or a tensor
// of a dtype newer than opset 17, is a UserError naming the node, op, opset and what to do.
// An input that must be constant (Reduce*-18's axes, Pad-18's pads and axes) may be an
// initializer, a Constant node, or small index arithmetic over them (Reshape, Concat, Cast,
// Unsqueeze, Slice, ... of Constants, as exports without their optimizer write it).
//
// Per-op differences from opset 17 to 28 among the ops of the table (onnx's operator changelog):
//   ReduceMean/Max/Min/Prod 18   axes: attribute -> optional input; noop_with_empty_axes
//   Split 18                     num_outputs attribute (equal parts, the last smaller)
//   Pad 18, 19                   optional axes input; mode 'wrap'
//   AveragePool 19               dilations
//   Cast/CastLike 19, 24         saturate, round_mode: float8/float4 targets only
//   Range 27                     stash_type: float16/bfloat16 only
//   Gelu 20                      new op: kept, in kNewerOpsDomain until convert()
//   RMSNormalization, Attention 23  new fused ops: rewritten as opset-17 subgraphs (fused_ops.h)
// Every other version step of the table's ops only adds dtypes.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace pt {

// Ops newer than the canonical opset that pipetrain keeps as they are. They travel in this
// domain through the onnx library's checker (which knows only opset 17), and convert() puts them
// back in the default domain.
inline constexpr const char* kNewerOpsDomain = "pipetrain.newer";

// Rewrites m in place (see above). path names the model in errors.
void adapt_to_canonical_opset(onnx::ModelProto* m, const std::string& path);

// The metadata_props of a value info (IR 10+), which the onnx library here predates: read from
// the protobuf's unknown fields. torch.export-based exports mark each module parameter with
// "pkg.torch.export.graph_signature.InputSpec.kind" = "PARAMETER".
std::map<std::string, std::string> metadata_props(const onnx::ValueInfoProto& vi);
std::map<std::string, std::string> metadata_props(const onnx::NodeProto& n);
std::map<std::string, std::string> metadata_props(const onnx::GraphProto& g);

// While alive, shows the onnx library each kNewerOpsDomain node as the opset-17 Identity (every
// such op's output has its input's type), so that its checker, which knows no such op (and
// whose shape inference crashed on unregistered domains), can run; the destructor puts the nodes
// back.
class NewerOpsHidden {
 public:
  explicit NewerOpsHidden(onnx::GraphProto* g);
  ~NewerOpsHidden();
  NewerOpsHidden(const NewerOpsHidden&) = delete;
  NewerOpsHidden& operator=(const NewerOpsHidden&) = delete;

 private:
  onnx::GraphProto* g_;
  std::vector<std::pair<int, onnx::NodeProto>> hidden_;  // node index, the node as it was
};

}  // namespace pt
