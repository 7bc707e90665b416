// tests/exec/safetensors_reader.h: an independent reader of the safetensors format for the
// tests of exec/safetensors.h and cli/trained_weights.h. It checks what the format demands (the
// length prefix, a JSON header, data_offsets covering the data without holes or overlaps) and
// what pipetrain promises (data at a multiple of 8, each tensor aligned to its element size).
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/files.h"

namespace pt::test {

struct StEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  int64_t begin = 0;  // offset in the data
};

struct StFile {
  std::map<std::string, StEntry> tensors;
  std::map<std::string, std::string> metadata;
  std::vector<std::string> order;  // names by data offset
  uint64_t header_bytes = 0;

  template <class T>
  std::vector<T> values(const std::string& name) const {
    const std::string& b = tensors.at(name).bytes;
    std::vector<T> out(b.size() / sizeof(T));
    std::memcpy(out.data(), b.data(), b.size());
    return out;
  }
};

inline size_t st_element_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4}, {"F16", 2},
      {"BF16", 2}, {"I16", 2}, {"U16", 2}, {"I8", 1}, {"U8", 1}, {"BOOL", 1}};
  return sizes.at(dtype);
}

// Reads and checks `path`; a failed check is a test failure (ADD_FAILURE) and an empty result.
inline StFile read_safetensors_for_test(const std::string& path) {
  const std::string blob = read_file(path, "the test wrote it");
  StFile f;
  if (blob.size() < 8) {
    ADD_FAILURE() << path << ": " << blob.size() << " bytes";
    return f;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(blob[static_cast<size_t>(i)]);  // little-endian
  f.header_bytes = n;
  EXPECT_EQ((8 + n) % 8, 0u) << "data starts at " << 8 + n;
  EXPECT_LE(8 + n, blob.size());
  const std::string header = blob.substr(8, n);
  const size_t end = header.find_last_not_of(' ');
  EXPECT_EQ(header[0], '{');
  EXPECT_EQ(header[end], '}') << "only spaces may pad the header";
  const nlohmann::json j = nlohmann::json::parse(header);
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& [name, e] : j.items()) {
    if (name == "__metadata__") {
      f.metadata = e.get<std::map<std::string, std::string>>();
      continue;
    }
    StEntry s;
    s.dtype = e.at("dtype").get<std::string>();
    s.shape = e.at("shape").get<std::vector<int64_t>>();
    const auto off = e.at("data_offsets").get<std::vector<int64_t>>();
    EXPECT_EQ(off.size(), 2u);
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    const size_t es = st_element_size(s.dtype);
    EXPECT_EQ(off[1] - off[0], numel * static_cast<int64_t>(es)) << name;
    EXPECT_EQ((8 + n + static_cast<uint64_t>(off[0])) % es, 0u) << name << " is not aligned";
    s.begin = off[0];
    s.bytes = blob.substr(8 + n + static_cast<size_t>(off[0]), static_cast<size_t>(off[1] - off[0]));
    spans.push_back({off[0], off[1]});
    f.tensors[name] = s;
  }
  std::sort(spans.begin(), spans.end());
  int64_t at = 0;
  for (const auto& [b, e] : spans) {
    EXPECT_EQ(b, at) << "a hole or an overlap in the data";
    at = e;
  }
  EXPECT_EQ(static_cast<uint64_t>(at), blob.size() - 8 - n) << "bytes after the last tensor";
  for (const auto& [name, s] : f.tensors) f.order.push_back(name);
  std::sort(f.order.begin(), f.order.end(),
            [&](const std::string& a, const std::string& b) { return f.tensors[a].begin < f.tensors[b].begin; });
  return f;
}

}  // namespace pt::test
