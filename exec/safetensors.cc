#include "exec/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/files.h"

namespace pt {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors holds little-endian data; a big-endian host must swap bytes");

// Indices of `tensors` in file order: element size descending, stable.
std::vector<size_t> layout_order(const std::vector<NamedTensor>& tensors) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].tensor->type.dtype) > dtype_size(tensors[b].tensor->type.dtype);
  });
  return order;
}

}  // namespace

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::kFloat64: return "F64";
    case DType::kFloat32: return "F32";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kInt64: return "I64";
    case DType::kInt32: return "I32";
    case DType::kInt16: return "I16";
    case DType::kInt8: return "I8";
    case DType::kUInt64: return "U64";
    case DType::kUInt32: return "U32";
    case DType::kUInt16: return "U16";
    case DType::kUInt8: return "U8";
    case DType::kBool: return "BOOL";
    default: return nullptr;
  }
}

std::string safetensors_header(const std::vector<NamedTensor>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               const std::string& where) {
  nlohmann::ordered_json j;
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::set<std::string> seen;
  int64_t at = 0;
  for (size_t i : layout_order(tensors)) {
    const NamedTensor& n = tensors[i];
    const TensorType& type = n.tensor->type;
    const char* dtype = safetensors_dtype(type.dtype);
    if (!dtype)
      throw UserError(where + ": tensor '" + n.name + "'", std::string("has dtype ") + dtype_name(type.dtype) +
                      ", which safetensors cannot hold", "leave it out of the file");
    if (n.name == "__metadata__" || !seen.insert(n.name).second)
      throw UserError(where + ": tensor '" + n.name + "'",
                      n.name == "__metadata__" ? "has the name safetensors reserves for its metadata"
                                               : "is named twice", "give every tensor its own name");
    PT_CHECK(static_cast<int64_t>(n.tensor->data.size()) == type.bytes(),
             "'" + n.name + "' holds " + std::to_string(n.tensor->data.size()) + " bytes for " + type.str());
    j[n.name] = {{"dtype", dtype}, {"shape", type.shape}, {"data_offsets", {at, at + type.bytes()}}};
    at += type.bytes();
  }
  std::string text = j.empty() ? "{}" : j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);  // little-endian host (static_assert above)
  return out + text;
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::string& todo) {
  const std::string header = safetensors_header(tensors, metadata, path);
  std::vector<std::string_view> parts{header};
  for (size_t i : layout_order(tensors)) {
    const Tensor& t = *tensors[i].tensor;
    parts.emplace_back(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  write_file_atomic(path, parts, todo);
}

}  // namespace pt
