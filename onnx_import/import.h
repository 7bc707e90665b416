// onnx_import/import.h: model file -> ir::Graph with every tensor's shape and dtype concrete.
//
// load (external data, opset range, op table, the module's merged and folded parameters restored
// (module_params.h), opset-18+ forms adapted to opset 17, checker) -> float16/bfloat16 weights
// and values widened to float32 (widen_halves.h) ->
// bind symbolic dims -> { pipetrain's own type inference (infer.h) -> fold constant subgraphs ->
// rewrite gathers with constant indices (gather_rewrite.h) } until nothing changes -> buffers
// (buffers.h) -> convert to the IR.
#pragma once

#include <map>
#include <string>

#include "core/ir.h"
#include "onnx_import/attention_fusion.h"
#include "onnx_import/module_params.h"

namespace pt {

struct ImportOptions {
  int64_t batch = 1;                      // binds the first dim of each input when symbolic
  std::map<std::string, int64_t> dims;    // binds named symbolic dims (--dim name=value)
  ParameterChoices parameters;            // config parameters.tied / untied (module_params.h)
  // `pipetrain run`'s input arrays. An input that the model reads only as a shape argument (a
  // Reshape's shape, a Slice's starts, axes, pads, repeats, Range's bounds: what a kernel must
  // know when it is made) is taken as a constant of this import and is no graph input any more;
  // every other input stays an input.
  std::map<std::string, Tensor> given_inputs;
  // Attention made one pipetrain FusedAttention node (attention_fusion.h). CPU programs only:
  // the CUDA backend has no kernel for it.
  bool fuse_attention = false;
  int64_t fuse_attention_from = kFusedAttentionMinKeys;  // keys from which it fuses
};

Graph import_model(const std::string& path, const ImportOptions& opts = {});

}  // namespace pt
