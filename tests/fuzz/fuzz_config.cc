// Fuzz target: the YAML config `pipetrain train` reads (cli/config.h: every key, its type and
// range, the files it names). Run from the repository root, so the seeds' model and data paths
// (samples/...) exist and the checks past them are reached.
#include "cli/config.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pt::fuzz::put("train.yaml", data, size);
  pt::fuzz::accepted(path, [&] { pt::load_config(path); });
  return 0;
}
