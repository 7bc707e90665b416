#include "exec/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/files.h"

namespace pt {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors holds little-endian data; a big-endian host must swap bytes");

// Indices of `tensors` in file order: element size descending, stable.
std::vector<size_t> layout_order(const std::vector<StreamedTensor>& tensors) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].type.dtype) > dtype_size(tensors[b].type.dtype);
  });
  return order;
}

std::string streamed_header(const std::vector<StreamedTensor>& tensors, const std::map<std::string, std::string>& metadata,
                            const std::string& where) {
  nlohmann::ordered_json j;
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::set<std::string> seen;
  int64_t at = 0;
  for (size_t i : layout_order(tensors)) {
    const StreamedTensor& n = tensors[i];
    const TensorType& type = n.type;
    const char* dtype = safetensors_dtype(type.dtype);
    if (!dtype)
      throw UserError(where + ": tensor '" + n.name + "'", std::string("has dtype ") + dtype_name(type.dtype) +
                      ", which safetensors cannot hold", "leave it out of the file");
    if (n.name == "__metadata__" || !seen.insert(n.name).second)
      throw UserError(where + ": tensor '" + n.name + "'",
                      n.name == "__metadata__" ? "has the name safetensors reserves for its metadata"
                                               : "is named twice", "give every tensor its own name");
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

// Each tensor its own bytes; a parameter no device read is still in its external-data file.
std::vector<StreamedTensor> streamed(const std::vector<NamedTensor>& tensors) {
  std::vector<StreamedTensor> out;
  for (const NamedTensor& n : tensors)
    out.push_back({n.name, n.tensor->type, [t = n.tensor]() -> const Tensor& {
                     t->load();
                     return *t;
                   }});
  return out;
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
  return streamed_header(streamed(tensors), metadata, where);
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::string& todo) {
  stream_safetensors(path, streamed(tensors), metadata, todo);
}

void stream_safetensors(const std::string& path, const std::vector<StreamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata, const std::string& todo) {
  const std::string header = streamed_header(tensors, metadata, path);
  const std::vector<size_t> order = layout_order(tensors);
  write_file_atomic(
      path, order.size() + 1,
      [&](size_t i) -> std::string_view {
        if (i == 0) return header;
        const StreamedTensor& n = tensors[order[i - 1]];
        const Tensor& t = n.bytes();
        PT_CHECK(t.type == n.type && static_cast<int64_t>(t.data.size()) == n.type.bytes(),
                 "'" + n.name + "' holds " + std::to_string(t.data.size()) + " bytes of " + t.type.str() + " for " +
                     n.type.str());
        return {reinterpret_cast<const char*>(t.data.data()), t.data.size()};
      },
      todo);
}

std::vector<std::pair<std::string, Tensor>> open_safetensors(const std::string& path) {
  const std::string todo = "name a .safetensors file (safetensors.torch.save_file writes one)";
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw UserError(path, "cannot be read", todo);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  const auto bad = [&](const std::string& where, const std::string& what) {
    return UserError(path + where, what, "write it again with safetensors.torch.save_file(model.state_dict(), path)");
  };
  if (size < 8) throw bad("", "is " + std::to_string(size) + " bytes, shorter than a safetensors header");
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);  // little-endian host (static_assert above)
  if (n > size - 8) throw bad("", "says its header is " + std::to_string(n) + " bytes, past the file's end");
  std::string header(static_cast<size_t>(n), '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(n))) throw UserError(path, "cannot be read", todo);
  const uint64_t data = 8 + n, data_bytes = size - data;
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw bad("", "has a header that is not a JSON object");
  // The writer's names read back: every DType safetensors_dtype names (DType numbers ONNX's types).
  std::map<std::string, DType> dtypes;
  for (int v = 0; v <= static_cast<int>(DType::kBFloat16); ++v)
    if (const char* name = safetensors_dtype(static_cast<DType>(v))) dtypes[name] = static_cast<DType>(v);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, e] : j.items()) {
    if (name == "__metadata__") continue;
    const std::string where = ": tensor '" + name + "'";
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") ||
        !e["shape"].is_array() || !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2)
      throw bad(where, "is not an entry of dtype, shape and data_offsets");
    auto dt = dtypes.find(e["dtype"].get<std::string>());
    if (dt == dtypes.end()) throw bad(where, "has dtype " + e["dtype"].get<std::string>() + ", which pipetrain does not take");
    Tensor t;
    t.type.dtype = dt->second;
    uint64_t numel = 1;  // kept below the file's size, so that no product overflows
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) throw bad(where, "has a shape that is not a list of sizes");
      const uint64_t extent = d.get<uint64_t>();
      if (extent != 0 && numel > size / extent) throw bad(where, "has a shape larger than the file");
      numel *= extent;
      t.type.shape.push_back(static_cast<int64_t>(extent));
    }
    const auto& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) throw bad(where, "has offsets that are not sizes");
    const uint64_t b = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (b > end || end > data_bytes) throw bad(where, "has data_offsets past the file's end");
    if (end - b != static_cast<uint64_t>(t.type.bytes()))
      throw bad(where, "holds " + std::to_string(end - b) + " bytes for " + t.type.str());
    t.stored = std::make_shared<StoredBytes>(StoredBytes{path + where, path, static_cast<int64_t>(data + b),
                                                         static_cast<int64_t>(end - b)});
    out.emplace_back(name, std::move(t));
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> read_safetensors(const std::string& path) {
  std::vector<std::pair<std::string, Tensor>> tensors = open_safetensors(path);
  for (auto& [name, t] : tensors) {
    t.data.resize(static_cast<size_t>(t.stored->length));
    read_stored_bytes(*t.stored, t.data.data());
    t.stored = nullptr;
  }
  return tensors;
}

}  // namespace pt
