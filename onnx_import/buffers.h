// onnx_import/buffers.h: which float initializers of an imported model are buffers of the
// exporting module (never trained), with the reason `pipetrain inspect` prints. In: the folded
// graph (import.cc) and the parameters the file declares. Out: name -> reason.
//
// A file from the torch.export-based exporter marks every module parameter (metadata on its value
// info): an unmarked float initializer is a buffer unless a weight or bias input reads it (the
// exporter stores some weights pre-transposed under names such as val_N). A file without marks
// (the legacy exporter, other frameworks) trains every float initializer a gradient reaches,
// except what the file shows to be a buffer:
//   - an additive attention mask: rank 2 or more, square in its last two dims, and only added
//     (Add/Sub, through Slice/Reshape/Unsqueeze/Squeeze/Expand/Transpose/Cast/Identity) to what
//     it masks;
//   - a rotary table, named as PyTorch's rotary modules name their buffers (inv_freq,
//     cos_cached, sin_cached).
// `parameters.frozen` names any other.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <set>
#include <string>

namespace pt {

std::map<std::string, std::string> find_buffers(const onnx::GraphProto& g,
                                                const std::set<std::string>& declared);

}  // namespace pt
