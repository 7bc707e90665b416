// core/files.h: write_file_atomic's promise to readers and to other writers of the same path.
#include "core/files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

// An empty folder of this process's (ctest runs tests in parallel processes); every one is
// removed when the process ends.
fs::path fresh_folder(const std::string& name) {
  struct Root {
    fs::path path = fs::temp_directory_path() / ("pt_files_test_" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static const Root root;
  const fs::path d = root.path / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Two tests run at once wrote one input file and one of them failed ("cannot be written"): the
// writers shared one temporary name. Each writer now puts a whole file there and none fails.
TEST(WriteFileAtomic, WritersOfOnePathAtOnceEachPutAWholeFile) {
  const fs::path d = fresh_folder("writers");
  const std::string path = (d / "x.npy").string();
  constexpr int kWriters = 4, kWrites = 50;
  std::vector<std::string> texts;
  for (int w = 0; w < kWriters; ++w) texts.push_back(std::string(4096 * (w + 1), static_cast<char>('a' + w)));
  std::vector<std::string> errors(kWriters);
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w)
    writers.emplace_back([&, w] {
      try {
        for (int i = 0; i < kWrites; ++i) write_file_atomic(path, texts[static_cast<size_t>(w)], "try again");
      } catch (const UserError& e) {
        errors[static_cast<size_t>(w)] = e.what();
      }
    });
  for (std::thread& t : writers) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  const std::string got = read_file(path, "");
  EXPECT_NE(std::find(texts.begin(), texts.end(), got), texts.end()) << got.size() << " bytes, not one writer's";
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1) << "temporary files left";
}

// A failed rename says why (it said "Success": the reason was read after the clean-up reset it).
TEST(WriteFileAtomic, AFailedRenameSaysWhy) {
  const fs::path d = fresh_folder("rename");
  fs::create_directories(d / "taken");
  try {
    write_file_atomic((d / "taken").string(), "text", "choose another path");
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              (d / "taken").string() + ": cannot be written: Is a directory; choose another path");
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1) << "temporary file left";
}

}  // namespace
}  // namespace pt
