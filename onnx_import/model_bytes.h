// onnx_import/model_bytes.h: an ONNX file's bytes -> ModelProto, the inline weights left in the
// file. In: the file's bytes (a read-only map of it). Out: the model, and for each floating-point
// initializer of the main graph whose bytes the file holds inline (raw_data of at least
// kLeftInFileBytes), where those bytes lie in the file, in place of a copy of them.
//
// A model whose weights are inside the .onnx is then held as one whose weights are in external
// data: a device reads its own tensors' ranges (load.h marks them kInModelFileKey) and nothing
// holds the whole model. The file is walked at the protobuf wire level (ModelProto field 7, the
// graph; GraphProto field 5, its initializers; TensorProto fields 2, 9, 13 and 14) with
// protobuf's CodedInputStream; everything else is parsed by protobuf as it is.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pt {

// Smaller inline initializers (scales, epsilons, masks folds read) stay in the parsed model.
constexpr int64_t kLeftInFileBytes = 4096;

struct InlineBytes {
  int initializer = 0;  // index in the graph's initializer list
  int64_t offset = 0;   // of the first byte, in the file
  int64_t length = 0;
};

// A length-delimited field's key and length: the bytes before its payload (the walk here, and
// export's streamed writer, onnx_import/export.cc, both write messages field by field).
std::string field_head(uint32_t number, uint64_t length);

// Parses `file` into *m; false when protobuf cannot (garbage, truncation). With leave_weights,
// *left receives the initializers whose raw_data was left out (else it is left empty).
bool parse_model_bytes(std::string_view file, bool leave_weights, onnx::ModelProto* m, std::vector<InlineBytes>* left);

}  // namespace pt
