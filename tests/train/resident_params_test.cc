// A device holds only its stages' parameters (shared/DESIGN.md, "A rank holds only its own
// stages"): import leaves the parameters of a model with external data in the file, and each
// device's programs read exactly the byte ranges of the parameters its chunks read, once.
// Counted by the bytes this process reads from stored tensors (core/ir.h stored_bytes_loaded).
// A float16 file's parameters are read as 2 bytes an element and widened to float32 as they load
// (onnx_import/widen_halves.h): no device widens what another trains.
#include <gtest/gtest.h>

#include <set>

#include "exec/cpu/cpu_backend.h"
#include "onnx_import/import.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "tests/autodiff/sample_chunks.h"
#include "train/comm.h"
#include "train/executor.h"

namespace pt {
namespace {

const std::string kModel = "samples/synthetic/tiny_ext.onnx";  // every float initializer external
const std::string kHalfModel = "samples/half/tiny_fp16.onnx";   // its larger weights external, float16
const std::string kInlineModel = "samples/synthetic/tiny.onnx";  // the same weights inside the .onnx

Graph import_tiny_ext(const std::string& path = kModel) {
  ImportOptions o;
  o.batch = 2;
  return import_model(path, o);
}

// Bytes of the distinct parameters the chunks placed on `device` read.
int64_t parameter_bytes_of(const Graph& g, const std::vector<BackwardGraphs>& chunks, const Schedule& s, int device) {
  std::set<std::string> names;
  for (size_t c = 0; c < chunks.size(); ++c)
    if (s.device_of(static_cast<int>(c)) == device) names.insert(chunks[c].params.begin(), chunks[c].params.end());
  int64_t bytes = 0;
  for (const std::string& n : names) bytes += g.value(g.find(n)).type.bytes();
  return bytes;
}

// The executor of a process running the devices `local` (the others another process's).
int64_t bytes_read_building(const std::vector<BackwardGraphs>& chunks, const Schedule& s, const std::set<int>& local) {
  std::vector<std::unique_ptr<CpuBackend>> owned;
  std::vector<Backend*> backends;
  for (int d = 0; d < s.stages; ++d) {
    owned.push_back(local.count(d) ? std::make_unique<CpuBackend>(1) : nullptr);
    backends.push_back(owned.back().get());
  }
  std::vector<int> placement;
  for (int c = 0; c < s.total_chunks(); ++c) placement.push_back(s.device_of(c));
  InProcessComm comm;
  const int64_t before = stored_bytes_loaded();
  PipelineExecutor ex(chunks, placement, backends, comm, s);
  return stored_bytes_loaded() - before;
}

// Bytes in the file of the chunks' parameters import left there (every one but the scalars it read).
int64_t stored_bytes_of(const Graph& g, const std::vector<BackwardGraphs>& chunks, const Schedule& s, int device) {
  std::set<std::string> names;
  for (size_t c = 0; c < chunks.size(); ++c)
    if (s.device_of(static_cast<int>(c)) == device) names.insert(chunks[c].params.begin(), chunks[c].params.end());
  int64_t bytes = 0;
  for (const std::string& n : names)
    if (const Tensor& t = *g.value(g.find(n)).init; !t.resident()) bytes += t.stored->length;
  return bytes;
}

// Import reads no weight but the scalars a rewrite compares (GELU's constants, gelu_fusion.h).
TEST(ResidentParameters, ImportReadsOnlyTheScalarsItFoldsWith) {
  const int64_t before = stored_bytes_loaded();
  const Graph g = import_tiny_ext();
  int64_t scalars = 0;
  int stored = 0;
  for (const Value& v : g.values)
    if (v.is_parameter()) {
      stored += v.init->stored != nullptr;
      if (v.type.numel() == 1) scalars += v.type.bytes();
      else EXPECT_FALSE(v.init->resident()) << v.name;
    }
  EXPECT_GT(stored, 0);
  EXPECT_LE(stored_bytes_loaded() - before, scalars);
}

// Each device's programs read its chunks' parameters and nothing else, as the process that runs
// it alone (one rank of several) and as one process running both devices: a parameter another
// device reads stays in the file (the data file, or the .onnx where the weights are inline), and
// no byte is read twice.
TEST(ResidentParameters, EachDeviceReadsItsStagesOwn) {
  const Schedule s = add_send_recv(generate("1f1b", 2, 2));
  for (const std::string& model : {kModel, kHalfModel, kInlineModel})
    for (int device = 0; device < 2; ++device) {
      SCOPED_TRACE(model);
      const Graph g = import_tiny_ext(model);
      const std::vector<BackwardGraphs> chunks = testing::sample_chunks(g, 2);
      const int other = 1 - device;
      const int64_t own = stored_bytes_of(g, chunks, s, device), others = stored_bytes_of(g, chunks, s, other);
      EXPECT_GT(own, 0);
      EXPECT_GT(others, 0);
      EXPECT_LT(parameter_bytes_of(g, chunks, s, device), g.parameter_bytes());
      EXPECT_EQ(bytes_read_building(chunks, s, {device}), own) << "device " << device;
      EXPECT_EQ(stored_bytes_of(g, chunks, s, device), 0) << "device " << device;
      EXPECT_EQ(stored_bytes_of(g, chunks, s, other), others) << "device " << other;
    }
  const Graph g = import_tiny_ext();
  const std::vector<BackwardGraphs> chunks = testing::sample_chunks(g, 2);
  const int64_t both = stored_bytes_of(g, chunks, s, 0) + stored_bytes_of(g, chunks, s, 1);
  EXPECT_EQ(bytes_read_building(chunks, s, {0, 1}), both);
}

}  // namespace
}  // namespace pt
