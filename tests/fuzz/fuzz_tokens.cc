// Fuzz target: a token file (`data.kind: tokens`), for a model taking int64[2, 8] token ids below
// 300 (so uint16 ids, two bytes each): read, every id checked against the limit, then a batch of
// two micro-batches and the held-out split drawn.
#include "train/data.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pt::fuzz::put("tokens.bin", data, size);
  pt::DataOptions o;
  o.kind = "tokens";
  o.file = path;
  o.eval_fraction = 0.25;
  o.where = [](const std::string& key) { return "train.yaml:3: " + key; };
  pt::TensorType ids;
  ids.dtype = pt::DType::kInt64;
  ids.shape = {2, 8};
  pt::fuzz::accepted("data.file", [&] {
    pt::DataLoader loader(o, {pt::FeedSpec{"ids", ids, 300}}, pt::FeedSpec{"target", ids, 300});
    loader.next(2);
    for (int64_t b = 0; b < loader.eval_batches(); ++b) loader.eval_batch(b);
  });
  return 0;
}
