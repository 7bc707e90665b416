// exec/safetensors.h: the file's layout read back by an independent reader
// (safetensors_reader.h): length prefix, JSON header padded to 8, offsets without holes, each
// tensor aligned to its element size, bytes and metadata round-tripped; and the refusals.
#include "exec/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/files.h"
#include "tests/exec/safetensors_reader.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

template <class T>
Tensor tensor(std::vector<int64_t> shape, std::vector<T> values) {
  Tensor t;
  t.type = {dtype_of<T>(), std::move(shape)};
  t.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());  // memcpy takes no null pointer
  return t;
}

std::string temp(const std::string& name) {
  return (fs::temp_directory_path() / ("pt_st_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(Safetensors, LayoutAndRoundTrip) {
  // Odd sizes in a bad order: a 3-byte bool first, then float32, int64, float64, uint8.
  Tensor mask = tensor<uint8_t>({3}, {1, 0, 1});
  mask.type.dtype = DType::kBool;
  const Tensor w = tensor<float>({2, 3}, {1.5f, -2, 3, 4, 5, 6.25f});
  const Tensor count = tensor<int64_t>({}, {7});
  const Tensor d = tensor<double>({2}, {0.1, -1e300});
  const Tensor bytes = tensor<uint8_t>({5}, {1, 2, 3, 4, 255});
  const Tensor empty = tensor<float>({0, 4}, {});
  const Tensor i32 = tensor<int32_t>({1}, {-5});
  const std::string path = temp("layout.safetensors");
  write_safetensors(path,
                    {{"mask", &mask}, {"layer.weight", &w}, {"bn.num_batches_tracked", &count},
                     {"d", &d}, {"bytes", &bytes}, {"empty", &empty}, {"i32", &i32}},
                    {{"format", "pt"}, {"note", "quote \" and\nnewline"}}, "todo");
  const test::StFile f = test::read_safetensors_for_test(path);
  ASSERT_EQ(f.tensors.size(), 7u);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("note"), "quote \" and\nnewline");
  // By element size, largest first; the given order within a size.
  EXPECT_EQ(f.order, (std::vector<std::string>{"bn.num_batches_tracked", "d", "layer.weight", "empty", "i32",
                                               "mask", "bytes"}));
  EXPECT_EQ(f.tensors.at("layer.weight").dtype, "F32");
  EXPECT_EQ(f.tensors.at("layer.weight").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.values<float>("layer.weight"), (std::vector<float>{1.5f, -2, 3, 4, 5, 6.25f}));
  EXPECT_EQ(f.tensors.at("bn.num_batches_tracked").dtype, "I64");
  EXPECT_TRUE(f.tensors.at("bn.num_batches_tracked").shape.empty());
  EXPECT_EQ(f.values<int64_t>("bn.num_batches_tracked"), (std::vector<int64_t>{7}));
  EXPECT_EQ(f.tensors.at("d").dtype, "F64");
  EXPECT_EQ(f.values<double>("d"), (std::vector<double>{0.1, -1e300}));
  EXPECT_EQ(f.tensors.at("mask").dtype, "BOOL");
  EXPECT_EQ(f.values<uint8_t>("mask"), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(f.tensors.at("bytes").dtype, "U8");
  EXPECT_EQ(f.tensors.at("empty").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(f.tensors.at("empty").bytes.empty());
  EXPECT_EQ(f.tensors.at("i32").dtype, "I32");
  EXPECT_EQ(f.values<int32_t>("i32"), (std::vector<int32_t>{-5}));
  // The header alone, as written: the same bytes the file starts with.
  const std::string header = safetensors_header({{"mask", &mask}, {"layer.weight", &w}, {"bn.num_batches_tracked", &count},
                                                 {"d", &d}, {"bytes", &bytes}, {"empty", &empty}, {"i32", &i32}},
                                                {{"format", "pt"}, {"note", "quote \" and\nnewline"}}, "here");
  EXPECT_EQ(header.size(), 8 + f.header_bytes);
  EXPECT_EQ(read_file(path, "").substr(0, header.size()), header);
  fs::remove(path);
}

TEST(Safetensors, NoTensors) {
  const std::string path = temp("empty.safetensors");
  write_safetensors(path, {}, {}, "todo");
  const std::string blob = read_file(path, "");
  EXPECT_EQ(blob, std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  EXPECT_TRUE(test::read_safetensors_for_test(path).tensors.empty());
  fs::remove(path);
}

std::string error_of(const std::vector<NamedTensor>& tensors) {
  try {
    safetensors_header(tensors, {}, "out.safetensors");
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Safetensors, Refusals) {
  const Tensor w = tensor<float>({1}, {1});
  Tensor s;
  s.type = {DType::kString, {}};
  EXPECT_EQ(error_of({{"a", &w}, {"a", &w}}),
            "out.safetensors: tensor 'a': is named twice; give every tensor its own name");
  EXPECT_EQ(error_of({{"__metadata__", &w}}),
            "out.safetensors: tensor '__metadata__': has the name safetensors reserves for its metadata; give "
            "every tensor its own name");
  EXPECT_EQ(error_of({{"s", &s}}),
            "out.safetensors: tensor 's': has dtype string, which safetensors cannot hold; leave it out of the file");
  // A folder that does not exist: a one-line error, nothing left behind.
  const std::string path = temp("no/such/folder/w.safetensors");
  try {
    write_safetensors(path, {{"w", &w}}, {}, "choose another output.safetensors");
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": cannot be written; choose another output.safetensors");
  }
  EXPECT_FALSE(fs::exists(fs::path(path).parent_path()));
}

// The reader: what the writer wrote comes back in header order, and each thing the format does not
// allow is one line naming the file (and the tensor) and how to write it again.
TEST(Safetensors, ReadsBackAndRefusesWhatTheFormatDoesNotAllow) {
  const Tensor w = tensor<float>({2, 3}, {1.5f, -2, 3, 4, 5, 6.25f});
  const Tensor count = tensor<int64_t>({}, {7});
  const std::string path = temp("read.safetensors");
  write_safetensors(path, {{"layer.weight", &w}, {"steps", &count}}, {{"format", "pt"}}, "todo");
  const auto back = read_safetensors(path);
  ASSERT_EQ(back.size(), 2u);
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : back) by_name[name] = &t;
  ASSERT_TRUE(by_name.count("layer.weight") && by_name.count("steps"));
  EXPECT_EQ(by_name["layer.weight"]->type, w.type);
  EXPECT_EQ(by_name["layer.weight"]->data, w.data);
  EXPECT_EQ(by_name["steps"]->data, count.data);
  // Opened in place (output.start_state): the same tensors from the header alone, each read when
  // it is loaded.
  const auto in_place = open_safetensors(path);
  ASSERT_EQ(in_place.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(in_place[i].first, back[i].first);
    EXPECT_EQ(in_place[i].second.type, back[i].second.type);
    EXPECT_FALSE(in_place[i].second.resident()) << in_place[i].first;
    in_place[i].second.load();
    EXPECT_EQ(in_place[i].second.data, back[i].second.data) << in_place[i].first;
  }
  const std::string blob = read_file(path, "");
  const std::string todo = "; write it again with safetensors.torch.save_file(model.state_dict(), path)";
  const auto refusal = [&](const std::string& bytes) {
    write_file_atomic(path, bytes, "");
    try {
      read_safetensors(path);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(refusal("abc"), path + ": is 3 bytes, shorter than a safetensors header" + todo);
  EXPECT_EQ(refusal(std::string("\xff\0\0\0\0\0\0\0{}", 10)),
            path + ": says its header is 255 bytes, past the file's end" + todo);
  const auto with_header = [](const std::string& json, size_t data_bytes) {
    std::string out(8, '\0');
    const uint64_t n = json.size();
    std::memcpy(out.data(), &n, 8);
    return out + json + std::string(data_bytes, '\0');
  };
  EXPECT_EQ(refusal(with_header("[1, 2]", 0)), path + ": has a header that is not a JSON object" + todo);
  EXPECT_EQ(refusal(with_header(R"({"a": {"dtype": "F32", "shape": [2]}})", 8)),
            path + ": tensor 'a': is not an entry of dtype, shape and data_offsets" + todo);
  EXPECT_EQ(refusal(with_header(R"({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}})", 8)),
            path + ": tensor 'a': has dtype C64, which pipetrain does not take" + todo);
  EXPECT_EQ(refusal(with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", 8)),
            path + ": tensor 'a': has data_offsets past the file's end" + todo);
  EXPECT_EQ(refusal(with_header(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8)),
            path + ": tensor 'a': holds 8 bytes for float32[3]" + todo);
  EXPECT_EQ(refusal(with_header(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", 8)),
            path + ": tensor 'a': has a shape larger than the file" + todo);
  fs::remove(path);
}

}  // namespace
}  // namespace pt
