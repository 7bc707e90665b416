// cli/trained_weights.h and onnx_import/module_state.h: a file's record of its module read and
// checked, and the trained state_dict written from it (transposed weights back, ties under every
// key, frozen and buffer entries from the file, num_batches_tracked counted, missing keys
// reported), read back by the test's own safetensors reader.
#include "cli/trained_weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "exec/safetensors.h"
#include "onnx_import/module_state.h"
#include "tests/exec/safetensors_reader.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

Tensor floats(std::vector<int64_t> shape, std::vector<float> v) {
  Tensor t;
  t.type = {DType::kFloat32, std::move(shape)};
  t.data.resize(v.size() * sizeof(float));
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

void add_init(onnx::ModelProto* m, const std::string& name, const Tensor& t) {
  auto* p = m->mutable_graph()->add_initializer();
  p->set_name(name);
  p->set_data_type(static_cast<int>(t.type.dtype));
  for (int64_t d : t.type.shape) p->add_dims(d);
  p->set_raw_data(std::string(reinterpret_cast<const char*>(t.data.data()), t.data.size()));
}

void set_prop(onnx::ModelProto* m, const std::string& key, const std::string& value) {
  for (auto& p : *m->mutable_metadata_props())
    if (p.key() == key) return p.set_value(value);
  auto* p = m->add_metadata_props();
  p->set_key(key);
  p->set_value(value);
}

// What samples/export_model.py records for a module with a Linear stored transposed under a
// generated name, an embedding tied to the head, a BatchNorm, a float buffer, an integer buffer
// and a parameter the graph never reads.
onnx::ModelProto recorded_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* n = m.mutable_graph()->add_node();
  n->set_op_type("Identity");
  n->add_input("x");
  n->add_output("y");
  add_init(&m, "val_7", floats({3, 2}, {1, 2, 3, 4, 5, 6}));  // fc.weight^T
  add_init(&m, "emb", floats({2, 2}, {0, 0, 0, 0}));
  add_init(&m, "bn.weight", floats({2}, {0.5f, 0.25f}));
  add_init(&m, "bn.running_mean", floats({2}, {0, 0}));
  add_init(&m, "mask", floats({2}, {-1, 1}));
  set_prop(&m, "pipetrain.format", "1");
  set_prop(&m, "pipetrain.state_dict", R"([
    {"key": "emb.weight", "dtype": "float32", "shape": [2, 2]},
    {"key": "fc.weight", "dtype": "float32", "shape": [2, 3]},
    {"key": "bn.weight", "dtype": "float32", "shape": [2]},
    {"key": "bn.running_mean", "dtype": "float32", "shape": [2]},
    {"key": "bn.num_batches_tracked", "dtype": "int64", "shape": []},
    {"key": "mask", "dtype": "float32", "shape": [2]},
    {"key": "pos", "dtype": "int32", "shape": [3]},
    {"key": "unused.weight", "dtype": "float32", "shape": [2]},
    {"key": "head.weight", "dtype": "float32", "shape": [2, 2]}])");
  set_prop(&m, "pipetrain.initializers", R"({
    "val_7": [{"key": "fc.weight", "transposed": true}],
    "emb": [{"key": "emb.weight", "transposed": false}, {"key": "head.weight", "transposed": false}],
    "bn.weight": [{"key": "bn.weight", "transposed": false}],
    "bn.running_mean": [{"key": "bn.running_mean", "transposed": false}],
    "mask": [{"key": "mask", "transposed": false}]})");
  set_prop(&m, "pipetrain.int_buffers", R"({
    "bn.num_batches_tracked": {"start": [5], "counts_forwards_of": "bn.running_mean"},
    "pos": {"start": [0, 1, 2]}})");
  return m;
}

std::string temp(const std::string& name) {
  return (fs::temp_directory_path() / ("pt_tw_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string save(const onnx::ModelProto& m, const std::string& name) {
  const std::string path = temp(name);
  std::ofstream(path, std::ios::binary) << m.SerializeAsString();
  return path;
}

TEST(ModuleState, ReadsTheRecord) {
  const std::optional<ModuleState> s = read_module_state(recorded_model(), "m.onnx");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->entries.size(), 9u);
  EXPECT_EQ(s->entries[1].key, "fc.weight");
  EXPECT_EQ(s->entries[1].initializer, "val_7");
  EXPECT_TRUE(s->entries[1].transposed);
  EXPECT_EQ(s->entries[8].initializer, "emb");  // the tie
  EXPECT_EQ(s->entries[4].start, (std::vector<int64_t>{5}));
  EXPECT_EQ(s->entries[4].counts_forwards_of, "bn.running_mean");
  EXPECT_EQ(s->entries[6].type.str(), "int32[3]");
  EXPECT_TRUE(s->entries[7].initializer.empty());
  EXPECT_FALSE(s->entries[7].has_start);
  onnx::ModelProto plain;
  EXPECT_FALSE(read_module_state(plain, "m.onnx"));
}

std::string error_of(const std::string& key, const std::string& value) {
  onnx::ModelProto m = recorded_model();
  set_prop(&m, key, value);
  try {
    read_module_state(m, "m.onnx");
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ModuleState, RefusesABadRecord) {
  const std::string redo = "; export the module again with samples/export_model.py";
  EXPECT_EQ(error_of("pipetrain.format", "2"),
            "m.onnx: metadata_props 'pipetrain.format': is '2', this pipetrain reads format 1; export the "
            "module again with this version's samples/export_model.py");
  EXPECT_EQ(error_of("pipetrain.state_dict", "[{\"key\": \"a\"").rfind("m.onnx: metadata_props 'pipetrain.state_dict': is not valid JSON", 0), 0u);
  EXPECT_EQ(error_of("pipetrain.initializers", R"({"val_8": [{"key": "fc.weight", "transposed": true}]})"),
            "m.onnx: metadata_props 'pipetrain.initializers': names 'val_8', which is no initializer of the graph" + redo);
  EXPECT_EQ(error_of("pipetrain.initializers", R"({"val_7": [{"key": "fc.weight", "transposed": false}]})"),
            "m.onnx: metadata_props 'pipetrain.initializers': 'val_7' is float32[3,2] in the graph, but holds "
            "'fc.weight' as float32[2,3]" + redo);
  EXPECT_EQ(error_of("pipetrain.initializers", R"({"mask": [{"key": "nope", "transposed": false}]})"),
            "m.onnx: metadata_props 'pipetrain.initializers': names 'nope', which pipetrain.state_dict does not list" + redo);
  EXPECT_EQ(error_of("pipetrain.int_buffers", R"({"pos": {"start": [0, 1]}})"),
            "m.onnx: metadata_props 'pipetrain.int_buffers': 'pos' has 2 start values for int32[3]" + redo);
  EXPECT_EQ(error_of("pipetrain.int_buffers", R"({"mask": {"start": [0, 1]}})"),
            "m.onnx: metadata_props 'pipetrain.int_buffers': 'mask' is float32[2], not an integer or bool buffer" + redo);
}

TEST(TrainedWeights, TheStateDictFromTheRecord) {
  const onnx::ModelProto m = recorded_model();
  const std::string model = save(m, "recorded.onnx");
  const Tensor fc_t = floats({3, 2}, {10, 20, 30, 40, 50, 60});  // trained fc.weight^T
  const Tensor emb = floats({2, 2}, {1, 2, 3, 4});
  const Tensor mean = floats({2}, {0.125f, -0.5f});
  TrainedState t;
  t.tensors = {{"val_7", &fc_t}, {"emb", &emb}, {"bn.running_mean", &mean}};
  t.counted = {"bn.running_mean"};
  t.forwards = 6;
  const std::string out = temp("w.safetensors");
  const WeightsWritten w = write_trained_weights(model, read_module_state(m, model), t, {{"format", "pt"}}, out);
  EXPECT_EQ(w.tensors, 8);
  EXPECT_EQ(w.missing, (std::vector<std::string>{"unused.weight"}));
  const test::StFile f = test::read_safetensors_for_test(out);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.tensors.size(), 8u);
  EXPECT_EQ(f.tensors.at("fc.weight").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.values<float>("fc.weight"), (std::vector<float>{10, 30, 50, 20, 40, 60}));
  EXPECT_EQ(f.values<float>("emb.weight"), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(f.values<float>("head.weight"), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(f.values<float>("bn.weight"), (std::vector<float>{0.5f, 0.25f}));  // frozen: the file's
  EXPECT_EQ(f.values<float>("mask"), (std::vector<float>{-1, 1}));
  EXPECT_EQ(f.values<float>("bn.running_mean"), (std::vector<float>{0.125f, -0.5f}));
  EXPECT_EQ(f.tensors.at("bn.num_batches_tracked").dtype, "I64");
  EXPECT_EQ(f.values<int64_t>("bn.num_batches_tracked"), (std::vector<int64_t>{11}));
  EXPECT_EQ(f.tensors.at("pos").dtype, "I32");
  EXPECT_EQ(f.values<int32_t>("pos"), (std::vector<int32_t>{0, 1, 2}));
  // A BatchNorm pipetrain did not run in training mode counts nothing.
  t.counted.clear();
  write_trained_weights(model, read_module_state(m, model), t, {}, out);
  EXPECT_EQ(test::read_safetensors_for_test(out).values<int64_t>("bn.num_batches_tracked"), (std::vector<int64_t>{5}));
  fs::remove(out);
  fs::remove(model);
}

TEST(TrainedWeights, WithoutARecordTheInitializerNames) {
  const Tensor w = floats({2}, {1, 2});
  const Tensor b = floats({1}, {3});
  TrainedState t;
  t.tensors = {{"fc.weight", &w}, {"fc.bias", &b}};
  const std::string out = temp("plain.safetensors");
  const WeightsWritten r = write_trained_weights("unused.onnx", std::nullopt, t, {}, out);
  EXPECT_EQ(r.tensors, 2);
  const test::StFile f = test::read_safetensors_for_test(out);
  EXPECT_EQ(f.values<float>("fc.weight"), (std::vector<float>{1, 2}));
  EXPECT_EQ(f.values<float>("fc.bias"), (std::vector<float>{3}));
  fs::remove(out);
}

// A file without a record, completed by the module's state_dict at the start: the output has the
// start's keys and shapes (what load_state_dict(strict=True) needs), the trained values where
// training has them, a table's trained leading rows over its start, a tied twin as its trained
// key, and everything else as it started; trained tensors the start does not name are kept.
TEST(TrainedWeights, WithoutARecordTheStartStateCompletesTheStateDict) {
  const Tensor head = floats({2, 2}, {9, 8, 7, 6}), rows = floats({1, 2}, {5, 4}), extra = floats({1}, {3});
  const Tensor head0 = floats({2, 2}, {0.5f, -1, 2, 0.25f}), wpe0 = floats({3, 2}, {1, 1.5f, 2, 2.5f, 3, 3.5f});
  const Tensor ln0 = floats({2}, {1, 1}), ln_other0 = floats({2}, {1, 1});
  const std::string start = temp("start.safetensors");
  write_safetensors(start, {{"wte.weight", &head0}, {"wpe.weight", &wpe0}, {"lm_head.weight", &head0},
                            {"ln.weight", &ln0}, {"ln2.weight", &ln_other0}}, {}, "");
  TrainedState t;
  t.tensors = {{"lm_head.weight", &head}, {"wpe.weight", &rows}, {"ln.weight", &extra}, {"val_3", &extra}};
  t.tensors.at("ln.weight") = &ln0;
  t.start_state = start;
  const std::string out = temp("completed.safetensors");
  const WeightsWritten r = write_trained_weights("unused.onnx", std::nullopt, t, {}, out);
  const test::StFile f = test::read_safetensors_for_test(out);
  EXPECT_EQ(f.tensors.size(), 6u);
  EXPECT_EQ(f.values<float>("lm_head.weight"), (std::vector<float>{9, 8, 7, 6}));
  EXPECT_EQ(f.values<float>("wte.weight"), (std::vector<float>{9, 8, 7, 6}));  // the tie, trained once
  EXPECT_EQ(f.tensors.at("wpe.weight").shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(f.values<float>("wpe.weight"), (std::vector<float>{5, 4, 2, 2.5f, 3, 3.5f}));
  EXPECT_EQ(f.values<float>("ln2.weight"), (std::vector<float>{1, 1}));  // one value: no tie, as it started
  EXPECT_EQ(f.values<float>("val_3"), (std::vector<float>{3}));
  EXPECT_EQ(r.completed, (std::vector<std::string>{"wpe.weight"}));
  EXPECT_EQ(r.not_in_start, (std::vector<std::string>{"val_3"}));
  // A start whose entry is neither the trained tensor's shape nor room for it as leading rows.
  const Tensor wide = floats({1, 3}, {1, 2, 3});
  t.tensors = {{"wpe.weight", &wide}};
  try {
    check_start_state(t);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), start + ": tensor 'wpe.weight': is float32[3,2], and the trained one float32[1,3] "
                                     "is not its leading rows; save the state_dict of the module that was exported");
  }
  fs::remove(out);
  fs::remove(start);
}

}  // namespace
}  // namespace pt
