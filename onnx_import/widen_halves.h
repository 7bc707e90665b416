// onnx_import/widen_halves.h: a model whose weights and computation are float16 or bfloat16 (a
// module exported after `.half()` or `.to(torch.bfloat16)`, as Hugging Face checkpoints ship)
// -> the same model in float32, which pipetrain trains: float32 master weights, as
// mixed-precision training in PyTorch and DeepSpeed keeps them.
//
// A pass over a ModelProto whose external data load_model placed (onnx_import/load.h). Import
// runs it after load_model, so the onnx checker has seen the file as it is; save_model_with_weights
// runs it for `output.dtype: fp32` (onnx_import/export.h). It changes, and nothing else:
//   - float16/bfloat16 initializers become float32: inline data is widened now, external data is
//     marked (kFileDTypeKey, onnx_import/proto_convert.h) and widened tensor by tensor as a
//     device reads it (core/ir.h StoredBytes), so no rank widens what it does not hold;
//   - tensor attributes (Constant's and ConstantOfShape's values) are widened;
//   - a dtype attribute naming float16/bfloat16 names float32: Cast's `to` (a Cast to the half
//     type, which served the precision alone, then casts float32 to float32; one from an integer
//     or bool still changes the kind), and `dtype` of EyeLike, RandomNormal(Like),
//     RandomUniform(Like) and Bernoulli;
//   - graph inputs, outputs and value infos of those dtypes become float32 (a float16 input then
//     takes float32 data);
//   - the dtypes of the module record samples/export_model.py writes (pipetrain.state_dict).
// Widening is exact, so the model computes what its float32 widening computes.
//
// Only a model with float16/bfloat16 weights (initializers) is widened: one computing in a half
// type without weights (an ONNX node test of Cast to float16, a graph fed half data) is left as
// it is, its values of the half type computed or refused by the kernels as they stand, never
// fed half data where it now takes float32.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <string>

#include "core/ir.h"

namespace pt {

// Each initializer's dtype in the file, for those it widened (Graph::file_dtypes).
std::map<std::string, DType> widen_half_floats(onnx::ModelProto* m);

}  // namespace pt
