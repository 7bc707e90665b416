// onnx_import/proto_convert.h: TensorProto and AttributeProto <-> the IR's Tensor and AttrValue.
// Used by import (ModelProto -> Graph), folding and export (Graph -> ModelProto).
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

#include "core/ir.h"

namespace pt {

// The tensor's type, after checking that its dtype is numeric, its shape a possible one (sizes from
// 0, at most 2^48 elements) and that it holds the data its shape needs; nothing is copied.
// Throws UserError naming `where`.
TensorType check_tensor_data(const onnx::TensorProto& t, const std::string& where);
// Whether the tensor's dtype is one pipetrain holds (numeric or bool); others are refused by the
// load with the op or opset that brought them.
inline bool numeric_dtype(const onnx::TensorProto& t) { return dtype_size(static_cast<DType>(t.data_type())) != 0; }
// Reads data from raw_data, the typed fields, or the external-data range load_model placed
// (onnx_import/load.h: an absolute location, checked against the file). Throws UserError naming
// `where` on a size mismatch or an unknown dtype.
Tensor tensor_from_proto(const onnx::TensorProto& t, const std::string& where);
// As tensor_from_proto, but a tensor whose bytes are in an external-data file keeps them there
// until its first read (Tensor::stored; `where` names it in a failed or NaN load).
Tensor stored_tensor(const onnx::TensorProto& t, const std::string& where);
// The range of a placed external tensor.
StoredBytes stored_range(const onnx::TensorProto& t, const std::string& where);
// The external_data key by which a tensor import widened to float32 while its bytes stay in the
// file (onnx_import/widen_halves.h) gives their dtype there (10 float16, 16 bfloat16):
// stored_range reads it into StoredBytes::file_dtype.
constexpr const char* kFileDTypeKey = "pipetrain.file_dtype";
// The external_data key by which import marks a tensor whose bytes the .onnx holds inline and
// import left where they lie (onnx_import/model_bytes.h): stored like external data, written
// back inline as the source has it.
constexpr const char* kInModelFileKey = "pipetrain.in_model_file";
// Whether the source keeps t's bytes in an external-data file (EXTERNAL, and not kInModelFileKey).
bool in_data_file(const onnx::TensorProto& t);
void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* out);

// Graph-valued attributes (If, Loop, Scan bodies) are refused with a UserError.
AttrValue attr_from_proto(const onnx::AttributeProto& a, const std::string& where);
void attr_to_proto(const std::string& name, const AttrValue& v, onnx::AttributeProto* out);

// Reads the dtype and shape of a value info; false when the dtype, the rank or any dimension is
// not known (then *out holds what is known, unknown dims as -1).
bool concrete_type(const onnx::ValueInfoProto& vi, TensorType* out);
void type_to_value_info(const TensorType& t, const std::string& name, onnx::ValueInfoProto* out);

}  // namespace pt
