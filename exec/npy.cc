#include "exec/npy.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "core/error.h"

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

}  // namespace

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "cannot be opened", "check the path to the .npy file");
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw UserError(path, "is not a .npy file", "save it with numpy.save");
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint16_t h = 0;
    in.read(reinterpret_cast<char*>(&h), 2);
    header_len = h;
  } else {
    in.read(reinterpret_cast<char*>(&header_len), 4);
  }
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
  Tensor t;
  t.type.dtype = dt->second;
  const std::string dims = m[1];
  const std::regex number("\\d+");
  std::sregex_iterator it(dims.begin(), dims.end(), number), end;
  for (; it != end; ++it) t.type.shape.push_back(std::stoll(it->str()));
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  if (!in.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(t.data.size())))
    throw UserError(path, "holds fewer bytes than its shape " + shape_str(t.type.shape) + " needs",
                    "the file is truncated; save it again");
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
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError(path, "cannot be written", "check that its folder exists and is writable");
    const uint16_t len = static_cast<uint16_t>(header.size());
    out.write("\x93NUMPY\x01\x00", 8);
    out.write(reinterpret_cast<const char*>(&len), 2);
    out << header;
    out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
    if (!out.flush()) throw UserError(path, "writing failed (disk full?)", "free space and run again");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace pt
