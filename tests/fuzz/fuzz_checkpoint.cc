// Fuzz target: a checkpoint file given to `--resume` (or found through checkpoint.dir/latest):
// the manifest with its own tensors; the parts it names are looked for beside it, where the two
// parts of the two-rank seed (seed-manifest.ckpt) lie.
#include "train/checkpoint.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  for (const char* rank : {"0", "1"})
    fs::copy_file(std::string(PT_SOURCE_DIR "/tests/fuzz/corpus/checkpoint/seed-rank") + rank + ".part",
                  pt::fuzz::scratch() / (std::string("step_00000002.rank") + rank + ".part"),
                  fs::copy_options::overwrite_existing);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pt::fuzz::put("step_00000002.ckpt", data, size);
  // The error names the checkpoint or one of its parts: the folder is the place.
  pt::fuzz::accepted(pt::fuzz::scratch().string(), [&] { pt::read_checkpoint(path); });
  return 0;
}
