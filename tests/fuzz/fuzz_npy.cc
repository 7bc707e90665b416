// Fuzz target: a .npy file, as `pipetrain run -i name=FILE` and `data.kind: npy` read it.
#include "exec/npy.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pt::fuzz::put("input.npy", data, size);
  pt::fuzz::accepted(path, [&] { pt::read_npy(path); });
  return 0;
}
