// exec/safetensors.h: named tensors -> a .safetensors file, the format Hugging Face's
// `safetensors` defined and torch, numpy, jax and candle read without pickle. In: tensors with
// their names (a trained module's state_dict: cli/trained_weights.h) and string metadata. Out:
// the file, written whole or not at all (core/files.h).
//
// Layout: 8 bytes, the header's length N as a little-endian uint64; N bytes of JSON,
//   {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ..}
// padded with spaces so that the data starts at a multiple of 8; then the tensors' bytes,
// row-major and little-endian, back to back without holes, at [8 + N + b, 8 + N + e). Tensors
// are laid out by element size, largest first (in the given order within a size), so every
// tensor starts at a multiple of its element size and a reader may map it in place.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/ir.h"

namespace pt {

struct NamedTensor {
  std::string name;
  const Tensor* tensor = nullptr;
};

// A tensor written as its turn comes: its name and type for the header, then its bytes from
// bytes() (a tensor valid until the next call: brought from another process, transposed back),
// so that the writer holds one tensor's bytes at a time.
struct StreamedTensor {
  std::string name;
  TensorType type;
  std::function<const Tensor&()> bytes;
};

// "F32", "I64", "BOOL", ...; nullptr for a dtype safetensors has no name for (strings).
const char* safetensors_dtype(DType t);

// The header: the 8 length bytes, then the JSON padded with spaces. UserError naming `where` for
// a tensor of a dtype safetensors cannot hold, a repeated name or the reserved "__metadata__".
std::string safetensors_header(const std::vector<NamedTensor>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               const std::string& where);

// Header and data to `path`, through write_file_atomic; `todo` ends its error if that fails.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::string& todo);
// The same file, each tensor's bytes asked for when the writer comes to them.
void stream_safetensors(const std::string& path, const std::vector<StreamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata, const std::string& todo);

// The tensors of a .safetensors file (any writer's: torch's save_file, pipetrain's), in the
// header's order. UserError naming the file and the tensor for anything the format does not
// allow: a short file, a header that is not a JSON object of entries, an unknown dtype, offsets
// that leave the data or do not match the shape.
std::vector<std::pair<std::string, Tensor>> read_safetensors(const std::string& path);
// The same, checked the same way from the header alone, each tensor's bytes left in the file
// (Tensor::stored) until it is loaded: a reader that holds one tensor at a time.
std::vector<std::pair<std::string, Tensor>> open_safetensors(const std::string& path);

}  // namespace pt
