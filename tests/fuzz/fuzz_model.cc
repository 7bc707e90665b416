// Fuzz target: the ONNX model, along the path `inspect`, `partition` and `train` take: read and
// parse, external data (a data file beside the model, tiny_ext.onnx.data), the onnx checker,
// opset adaptation, import (type inference, constant folding, gather rewrites, buffers), the cost
// estimate and a two-stage partition.
#include "onnx_import/import.h"
#include "onnx_import/load.h"
#include "partition/cost_model.h"
#include "partition/partitioner.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  fs::copy_file(PT_SOURCE_DIR "/samples/synthetic/tiny_ext.onnx.data", pt::fuzz::scratch() / "tiny_ext.onnx.data",
                fs::copy_options::overwrite_existing);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pt::fuzz::put("model.onnx", data, size);
  pt::fuzz::accepted(path, [&] {
    if (!pt::unsupported_ops(pt::read_model(path)).empty()) return;  // `inspect` lists them
    pt::ImportOptions options;
    options.batch = 2;
    pt::Graph g = pt::import_model(path, options);
    std::vector<pt::NodeCost> costs = pt::estimate_costs(g);
    // `--stages 2` on one node, or on one node that computes, is the flag's error, not the file's.
    if (g.nodes.size() < 2 || pt::most_chunks(costs) < 2) return;
    pt::PartitionOptions p;
    p.stages = 2;
    pt::plan_partition(g, costs, p);
  });
  return 0;
}
