// tests/cli/run_cli.h: runs the pipetrain binary (PT_BINARY) as a user would, capturing what it
// prints and returns, for the tests that pin the command line's behaviour.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// This process's own folder (ctest runs the tests of a binary in parallel processes), removed
// with everything in it when the process ends.
inline const fs::path& process_folder() {
  struct Folder {
    fs::path path = fs::temp_directory_path() / ("pt_cli_test_" + std::to_string(getpid()));
    Folder() { fs::create_directories(path); }
    ~Folder() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static const Folder folder;
  return folder.path;
}

// A shell command line, its stdout and stderr captured.
inline Result run_command(const std::string& command) {
  const fs::path err_file = process_folder() / "stderr.txt";
  const std::string cmd = command + " 2>" + err_file.string();
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  r.err.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

inline Result run(const std::string& args) { return run_command(std::string(PT_BINARY) + " " + args); }

// Bad input: exit 2 and exactly one line on stderr, starting with "error: ".
inline void expect_one_line_error(const Result& r, const std::string& text) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err, "error: " + text + "\n");
}

// A fresh folder of this process's, removed when it ends.
inline fs::path scratch(const std::string& name) {
  const fs::path d = process_folder() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// How many temporary files (NAME.PID.N.tmp, core/files.h) lie in `folder`: a failed write
// leaves none, and neither does a run that ends.
inline int temp_files_in(const fs::path& folder) {
  if (!fs::is_directory(folder)) return 0;
  return static_cast<int>(std::count_if(fs::directory_iterator(folder), fs::directory_iterator(),
                                        [](const fs::directory_entry& e) { return e.path().extension() == ".tmp"; }));
}

inline fs::path write(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

inline std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The same, when the message ends in figures the test does not pin: it starts with `prefix`.
inline void expect_one_line_error_starting(const Result& r, const std::string& prefix) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("error: " + prefix, 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
