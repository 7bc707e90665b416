// save_model_with_weights (onnx_import/export.h) streams the trained model, one initializer's
// bytes at a time: the file holds the very bytes of the whole model proto serialized at once
// (every tensor inline, the trained ones replaced), for a model with external data and for
// models without, whether the weights give their own bytes or a fetch brings them; a weight the
// model lacks or of another type is one error, and no file.
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

TEST(SaveModelWithWeights, StreamsTheBytesOfTheWholeModel) {
  const fs::path dir = fs::temp_directory_path() / "pt_export_test";
  fs::create_directories(dir);
  for (const char* model : {"samples/synthetic/tiny_ext.onnx", "samples/synthetic/tiny.onnx", "samples/mlp/mlp.onnx"}) {
    SCOPED_TRACE(model);
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
    EXPECT_TRUE(slurp(dir / "own.onnx") == want);
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
    EXPECT_TRUE(slurp(dir / "fetched.onnx") == want);
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
