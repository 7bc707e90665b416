// Fuzz target: a .safetensors file, as `output.start_state` names one for `pipetrain train`.
#include "exec/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pt::fuzz::put("input.safetensors", data, size);
  pt::fuzz::accepted(path, [&] { pt::read_safetensors(path); });
  return 0;
}
