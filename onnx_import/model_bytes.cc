#include "onnx_import/model_bytes.h"

#include <google/protobuf/io/coded_stream.h>

#include <climits>
#include <string>

#include "core/ir.h"

namespace pt {
namespace {

namespace io = google::protobuf::io;

// The message fields the walk looks into (onnx.proto3).
constexpr uint32_t kModelGraph = 7, kGraphInitializer = 5;
constexpr uint32_t kTensorDataType = 2, kTensorRawData = 9, kTensorExternalData = 13, kTensorDataLocation = 14;

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

// One field of a message: its bytes [begin, end) (tag included), a length-delimited one's
// payload from `body`, a varint's value.
struct Field {
  uint32_t number = 0;
  uint32_t type = 0;
  size_t begin = 0, body = 0, end = 0;
  uint64_t value = 0;
};

// The fields of one serialized message, in order; false where the bytes are not a message the
// walk can follow (protobuf's own parse then judges the file).
bool fields_of(std::string_view bytes, std::vector<Field>* out) {
  out->clear();
  io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size()));
  in.SetTotalBytesLimit(INT_MAX);
  while (static_cast<size_t>(in.CurrentPosition()) < bytes.size()) {
    Field f;
    f.begin = static_cast<size_t>(in.CurrentPosition());
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return false;
    f.number = tag >> 3;
    f.type = tag & 7;
    bool ok = true;
    switch (f.type) {
      case kVarint: ok = in.ReadVarint64(&f.value); break;
      case kFixed64: ok = in.Skip(8); break;
      case kFixed32: ok = in.Skip(4); break;
      case kBytes: {
        uint32_t length = 0;
        ok = in.ReadVarint32(&length);
        f.body = static_cast<size_t>(in.CurrentPosition());
        ok = ok && in.Skip(static_cast<int>(length));
        break;
      }
      default: return false;  // groups: no ONNX message has one
    }
    if (!ok) return false;
    f.end = static_cast<size_t>(in.CurrentPosition());
    out->push_back(f);
  }
  return true;
}

std::string_view slice(std::string_view bytes, size_t begin, size_t end) { return bytes.substr(begin, end - begin); }

struct Walk {
  std::string_view file;
  int initializers = 0;  // seen so far, over every graph field (protobuf merges repeated ones)
  std::vector<InlineBytes>* left;
};

// One initializer, at `base` in the file: as it is, or without its raw_data fields when it is a
// floating-point weight held inline (the last raw_data field is the one protobuf keeps).
bool add_initializer(Walk& w, std::string_view tensor, size_t base, std::string* out) {
  std::vector<Field> fields;
  if (!fields_of(tensor, &fields)) return false;
  uint64_t dtype = 0;
  bool external = false;
  const Field* raw = nullptr;
  for (const Field& f : fields) {
    if (f.number == kTensorDataType && f.type == kVarint) dtype = f.value;
    if (f.number == kTensorExternalData) external = true;
    if (f.number == kTensorDataLocation && f.type == kVarint && f.value != 0) external = true;
    if (f.number == kTensorRawData && f.type == kBytes) raw = &f;
  }
  const int index = w.initializers++;
  if (external || !raw || !is_floating(static_cast<DType>(dtype)) ||
      static_cast<int64_t>(raw->end - raw->body) < kLeftInFileBytes) {
    *out += field_head(kGraphInitializer, tensor.size());
    *out += tensor;
    return true;
  }
  std::string kept;
  for (const Field& f : fields)
    if (f.number != kTensorRawData) kept += slice(tensor, f.begin, f.end);
  w.left->push_back({index, static_cast<int64_t>(base + raw->body), static_cast<int64_t>(raw->end - raw->body)});
  *out += field_head(kGraphInitializer, kept.size());
  *out += kept;
  return true;
}

bool add_graph(Walk& w, std::string_view graph, size_t base, std::string* out) {
  std::vector<Field> fields;
  if (!fields_of(graph, &fields)) return false;
  std::string kept;
  for (const Field& f : fields) {
    if (f.number == kGraphInitializer && f.type == kBytes) {
      if (!add_initializer(w, slice(graph, f.body, f.end), base + f.body, &kept)) return false;
    } else {
      kept += slice(graph, f.begin, f.end);
    }
  }
  *out += field_head(kModelGraph, kept.size());
  *out += kept;
  return true;
}

// The model's bytes with its inline weights left out, or false where the walk cannot follow it.
bool without_weights(Walk& w, std::string* out) {
  std::vector<Field> fields;
  if (!fields_of(w.file, &fields)) return false;
  for (const Field& f : fields) {
    if (f.number == kModelGraph && f.type == kBytes) {
      if (!add_graph(w, slice(w.file, f.body, f.end), f.body, out)) return false;
    } else {
      *out += slice(w.file, f.begin, f.end);
    }
  }
  return true;
}

}  // namespace

std::string field_head(uint32_t number, uint64_t length) {
  std::string out;
  for (uint64_t v : {(static_cast<uint64_t>(number) << 3) | kBytes, length}) {
    for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    out.push_back(static_cast<char>(v));
  }
  return out;
}

bool parse_model_bytes(std::string_view file, bool leave_weights, onnx::ModelProto* m, std::vector<InlineBytes>* left) {
  left->clear();
  if (file.size() > static_cast<size_t>(INT_MAX)) return false;  // past protobuf's 2 GiB
  if (leave_weights) {
    Walk w{file, 0, left};
    std::string kept;
    if (without_weights(w, &kept) && !left->empty()) return m->ParseFromString(kept);
    left->clear();
  }
  return m->ParseFromArray(file.data(), static_cast<int>(file.size()));
}

}  // namespace pt
