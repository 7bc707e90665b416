// tests/fuzz/fuzz_input.h: what every fuzz target shares (tests/fuzz/README.md, scripts/fuzz.sh).
//
// The readers take paths, as the CLI hands them, so each input's bytes go to a file in a folder
// of the process's own. An input a reader rejects must come back as a UserError whose message is
// one line naming the place (the file, or the config key); anything else (another exception, a
// PT_CHECK abort, a sanitizer report, a message that names no place) stops the process, and
// libFuzzer keeps the input as a crash.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "core/error.h"

namespace pt::fuzz {

// A folder of this process's own, under /dev/shm where it exists (no disk writes per input).
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    namespace fs = std::filesystem;
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    fs::path d = base / ("pipetrain-fuzz." + std::to_string(getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes the input to scratch()/name and returns its path.
inline std::string put(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (scratch() / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// Runs `read`; a UserError must be one line that names `place`. Returns whether it was accepted.
template <class F>
bool accepted(const std::string& place, F&& read) {
  try {
    read();
    return true;
  } catch (const UserError& e) {
    const std::string m = e.what();
    if (m.empty() || m.find('\n') != std::string::npos || m.find(place) == std::string::npos) {
      std::fprintf(stderr, "fuzz: a rejection that is not one located line (expected '%s' in it):\n%s\n",
                   place.c_str(), m.c_str());
      std::abort();
    }
    return false;
  }
}

}  // namespace pt::fuzz
