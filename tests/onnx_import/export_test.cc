// save_model_with_weights (onnx_import/export.h) streams the trained model, one initializer's
// bytes at a time: for a model without external data the file holds the very bytes of the whole
// model proto serialized at once (every tensor inline, the trained ones replaced); for a model
// with external data, the same model once its data file (model.data, back to back, external
// where the source's is) is read back in; whether the weights give their own bytes or a fetch
// brings them. A weight the model lacks or of another type is one error, and no file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "onnx_import/export.h"
#include "onnx_import/load.h"
#include "onnx_import/module_params.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// New values for every second float initializer of the model: each byte + 1.
std::map<std::string, Tensor> new_weights(const onnx::ModelProto& m) {
  std::map<std::string, Tensor> out;
  int k = 0;
  for (const onnx::TensorProto& t : m.graph().initializer()) {
    if (!is_floating(static_cast<DType>(t.data_type())) || k++ % 2) continue;
    Tensor w = tensor_from_proto(t, t.name());
    for (std::byte& b : w.data) b = static_cast<std::byte>(static_cast<unsigned>(b) + 1);
    out.emplace(t.name(), std::move(w));
  }
  return out;
}

// The model written at `path` against `want` (the whole model, inline): its very bytes, or, when
// the source keeps float initializers in external data, the same model once path.data is read
// back in, each initializer external where the source's is, their ranges back to back.
void expect_written(const std::string& source, const fs::path& path, const std::string& want) {
  onnx::ModelProto src = read_model(source, ExternalData::kLeaveFloats);
  restore_module_parameters(src.mutable_graph(), {});
  bool external = false;
  for (const onnx::TensorProto& t : src.graph().initializer())
    external = external || in_data_file(t);
  const fs::path data = path.string() + ".data";
  if (!external) {
    EXPECT_TRUE(slurp(path) == want);
    EXPECT_FALSE(fs::exists(data));
    return;
  }
  onnx::ModelProto out;
  ASSERT_TRUE(out.ParseFromString(slurp(path)));
  std::map<std::string, bool> was_external;
  for (const onnx::TensorProto& t : src.graph().initializer())
    was_external[t.name()] = in_data_file(t);
  int64_t end = 0;
  for (const onnx::TensorProto& t : out.graph().initializer()) {
    const bool is_external = t.data_location() == onnx::TensorProto::EXTERNAL;
    EXPECT_EQ(is_external, was_external.at(t.name())) << t.name();
    if (!is_external) continue;
    std::map<std::string, std::string> kv;
    for (const auto& e : t.external_data()) kv[e.key()] = e.value();
    EXPECT_EQ(kv.size(), 3u) << t.name();
    EXPECT_EQ(kv["location"], path.filename().string() + ".data");
    EXPECT_EQ(kv["offset"], std::to_string(end)) << t.name();
    end += std::stoll(kv["length"]);
  }
  EXPECT_GT(end, 0);
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(data)), end);
  // Read back, each tensor that was external says DEFAULT where the trained ones say nothing.
  auto without_location = [](onnx::ModelProto m) {
    for (onnx::TensorProto& t : *m.mutable_graph()->mutable_initializer()) t.clear_data_location();
    return m.SerializeAsString();
  };
  onnx::ModelProto whole;
  ASSERT_TRUE(whole.ParseFromString(want));
  EXPECT_TRUE(without_location(read_model(path.string(), ExternalData::kInline)) == without_location(whole));
}

TEST(SaveModelWithWeights, StreamsTheBytesOfTheWholeModel) {
  const fs::path dir = fs::temp_directory_path() / "pt_export_test";
  fs::create_directories(dir);
  for (const char* model : {"samples/synthetic/tiny_ext.onnx", "samples/synthetic/tiny.onnx", "samples/mlp/mlp.onnx"}) {
    SCOPED_TRACE(model);
    for (const char* name : {"own.onnx", "own.onnx.data", "fetched.onnx", "fetched.onnx.data"}) fs::remove(dir / name);
    onnx::ModelProto whole = read_model(model, ExternalData::kInline);
    restore_module_parameters(whole.mutable_graph(), {});
    const std::map<std::string, Tensor> trained = new_weights(whole);
    ASSERT_FALSE(trained.empty());
    for (onnx::TensorProto& t : *whole.mutable_graph()->mutable_initializer())
      if (const std::string name = t.name(); trained.count(name)) tensor_to_proto(trained.at(name), name, &t);
    const std::string want = whole.SerializeAsString();
    std::map<std::string, const Tensor*> weights;
    for (const auto& [name, t] : trained) weights[name] = &t;
    save_model_with_weights(model, weights, (dir / "own.onnx").string());
    expect_written(model, dir / "own.onnx", want);
    // Through a fetch that holds one tensor at a time, each asked for once.
    Tensor held;
    std::map<std::string, int> asked;
    const TensorFetch fetch = [&](const std::string& name) -> const Tensor& {
      ++asked[name];
      held = trained.at(name);
      return held;
    };
    std::map<std::string, Tensor> typed;  // the weights' types alone, as rank 0 holds another rank's
    std::map<std::string, const Tensor*> types;
    for (const auto& [name, t] : trained) {
      typed[name].type = t.type;
      types[name] = &typed[name];
    }
    save_model_with_weights(model, types, (dir / "fetched.onnx").string(), {}, false, fetch);
    expect_written(model, dir / "fetched.onnx", want);
    EXPECT_EQ(asked.size(), trained.size());
    for (const auto& [name, n] : asked) EXPECT_EQ(n, 1) << name;
  }
}

TEST(SaveModelWithWeights, AWeightTheModelLacksOrOfAnotherTypeIsAnError) {
  const fs::path out = fs::temp_directory_path() / "pt_export_test" / "bad.onnx";
  fs::remove(out);
  Tensor w;
  w.type = {DType::kFloat32, {3}};
  w.data.resize(12);
  EXPECT_THROW(save_model_with_weights("samples/mlp/mlp.onnx", {{"no_such_weight", &w}}, out.string()), UserError);
  const onnx::ModelProto m = read_model("samples/mlp/mlp.onnx");
  const std::string first = m.graph().initializer(0).name();
  try {
    save_model_with_weights("samples/mlp/mlp.onnx", {{first, &w}}, out.string());
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("but the trained value is float32[3]"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace pt
