#include "exec/npy.h"

#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/files.h"

namespace pt {
namespace {

const std::map<std::string, DType>& descr_types() {
  static const std::map<std::string, DType> m = {
      {"<f4", DType::kFloat32}, {"<f8", DType::kFloat64}, {"<i8", DType::kInt64},
      {"<i4", DType::kInt32},   {"<i2", DType::kInt16},   {"|i1", DType::kInt8},
      {"|u1", DType::kUInt8},   {"|b1", DType::kBool},    {"<u8", DType::kUInt64},
      {"<u4", DType::kUInt32},  {"<u2", DType::kUInt16},  {"<f2", DType::kFloat16},
  };
  return m;
}

std::string descr_of(DType t) {
  for (const auto& [d, dt] : descr_types())
    if (dt == t) return d;
  PT_CHECK(false, std::string("no .npy descr for ") + dtype_name(t));
  return "";
}

// The header's shape tuple, e.g. "2, 3" or "4," or "": each entry a whole number >= 0.
std::vector<int64_t> parse_shape(const std::string& tuple, const std::string& path) {
  std::vector<int64_t> shape;
  std::istringstream entries(tuple);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    const size_t first = entry.find_first_not_of(" \t");
    if (first == std::string::npos) continue;  // after the trailing comma of "(4,)"
    // Python 2's long suffix "4L" is dropped; an entry of nothing else ("L") has no digits.
    const size_t last = entry.find_last_not_of(" \tL");
    const size_t stop = last == std::string::npos ? first : last + 1;
    int64_t d = -1;
    const auto [end, ec] = std::from_chars(entry.data() + first, entry.data() + stop, d);
    if (ec != std::errc() || end != entry.data() + stop || d < 0)
      throw UserError(path, "has shape entry '" + entry.substr(first) + "', not a size from 0 to 2^63",
                      "save it again with numpy.save");
    shape.push_back(d);
  }
  return shape;
}

}  // namespace

namespace {

// The header, checked against the bytes the file holds; `in` is left at the data.
TensorType read_header(const std::string& path, std::ifstream& in) {
  if (!in) throw UserError(path, "cannot be opened", "check the path to the .npy file");
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw UserError(path, "is not a .npy file", "save it with numpy.save");
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint16_t h = 0;
    in.read(reinterpret_cast<char*>(&h), 2);
    header_len = h;
  } else if (magic[6] == 2 || magic[6] == 3) {
    in.read(reinterpret_cast<char*>(&header_len), 4);
  } else {
    throw UserError(path, "is .npy format version " + std::to_string(static_cast<unsigned char>(magic[6])) + ", not 1, 2 or 3",
                    "save it with numpy.save");
  }
  const std::streamoff at = in.tellg();
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(at);
  if (!in || at < 0 || static_cast<std::streamoff>(header_len) > size - at)
    throw UserError(path, "has a truncated header", "save it again");
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) throw UserError(path, "has a truncated header", "save it again");
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'")))
    throw UserError(path, "has no dtype in its header", "save it with numpy.save");
  const std::string descr = m[1];
  auto dt = descr_types().find(descr);
  if (dt == descr_types().end())
    throw UserError(path, "has dtype '" + descr + "', which pipetrain does not read",
                    "convert it to float32, int64, int32 or bool");
  if (std::regex_search(header, std::regex("'fortran_order':\\s*True")))
    throw UserError(path, "is in Fortran order", "save numpy.ascontiguousarray(x)");
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    throw UserError(path, "has no shape in its header", "save it with numpy.save");
  TensorType type;
  type.dtype = dt->second;
  type.shape = parse_shape(m[1], path);
  const std::streamoff start = in.tellg();
  in.seekg(0, std::ios::end);
  const int64_t held = static_cast<int64_t>(in.tellg() - start);
  in.seekg(start);
  int64_t needed = static_cast<int64_t>(dtype_size(type.dtype));
  for (int64_t d : type.shape)
    if (__builtin_mul_overflow(needed, d, &needed)) needed = INT64_MAX;
  if (needed > held)
    throw UserError(path, "holds " + std::to_string(held) + " bytes of data, fewer than its shape " +
                              shape_str(type.shape) + " needs",
                    "the file is truncated or its header is wrong; save it again");
  return type;
}

}  // namespace

TensorType read_npy_type(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return read_header(path, in);
}

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  Tensor t;
  t.type = read_header(path, in);
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  in.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
  return t;
}

void write_npy(const Tensor& t, const std::string& path) {
  std::string shape = "(";
  for (int64_t d : t.type.shape) shape += std::to_string(d) + ",";
  if (t.type.shape.size() > 1) shape.pop_back();
  shape += ")";
  std::string header = "{'descr': '" + descr_of(t.type.dtype) +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad so that the data starts on a 64-byte boundary, header ending in '\n'.
  const size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  const uint16_t len = static_cast<uint16_t>(header.size());
  const std::string head = std::string("\x93NUMPY\x01\x00", 8) +
                           std::string(reinterpret_cast<const char*>(&len), 2) + header;
  const std::string_view data(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  const std::string_view parts[] = {head, data};
  write_file_atomic(path, parts, "check that its folder exists and is writable, and has free space");
}

}  // namespace pt
