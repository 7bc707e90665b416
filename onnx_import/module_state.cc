#include "onnx_import/module_state.h"

#include <nlohmann/json.hpp>

#include <map>

#include "core/error.h"
#include "core/files.h"
#include "onnx_import/load.h"

namespace pt {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "1";
constexpr const char* kRedo = "export the module again with samples/export_model.py";

DType parse_dtype(const std::string& name) {
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt64,
                  DType::kInt32, DType::kInt16, DType::kInt8, DType::kUInt8, DType::kUInt16,
                  DType::kUInt32, DType::kUInt64, DType::kBool})
    if (name == dtype_name(t)) return t;
  return DType::kUndefined;
}

class Reader {
 public:
  Reader(const onnx::ModelProto& m, const std::string& path) : path_(path) {
    for (const auto& p : m.metadata_props()) props_[p.key()] = p.value();
    for (const auto& t : m.graph().initializer()) {
      TensorType type{static_cast<DType>(t.data_type()), {t.dims().begin(), t.dims().end()}};
      inits_[t.name()] = type;
    }
  }

  bool recorded() const { return props_.count("pipetrain.state_dict") != 0; }

  ModuleState read() {
    key_ = "pipetrain.format";
    if (props_["pipetrain.format"] != kFormat)
      fail("is '" + props_["pipetrain.format"] + "', this pipetrain reads format " + kFormat,
           "export the module again with this version's samples/export_model.py");
    ModuleState s;
    read_entries(&s);
    read_initializers(&s);
    read_int_buffers(&s);
    return s;
  }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& todo = kRedo) const {
    throw UserError(path_ + ": metadata_props '" + key_ + "'", what, todo);
  }

  json parse(const std::string& key, json fallback) {
    key_ = key;
    auto it = props_.find(key);
    if (it == props_.end()) return fallback;
    try {
      return json::parse(it->second);
    } catch (const json::exception& e) {
      fail(std::string("is not valid JSON: ") + e.what());
    }
  }

  StateEntry& entry(ModuleState* s, const std::string& key) {
    auto it = index_.find(key);
    if (it == index_.end()) fail("names '" + key + "', which pipetrain.state_dict does not list");
    return s->entries[it->second];
  }

  void read_entries(ModuleState* s) {
    const json list = parse("pipetrain.state_dict", json());
    if (!list.is_array()) fail("is not a list of {key, dtype, shape}");
    try {
      for (const json& e : list) {
        StateEntry se;
        se.key = e.at("key").get<std::string>();
        const std::string dtype = e.at("dtype").get<std::string>();
        se.type = {parse_dtype(dtype), e.at("shape").get<std::vector<int64_t>>()};
        if (se.type.dtype == DType::kUndefined) fail("'" + se.key + "' has dtype '" + dtype + "', which pipetrain does not hold");
        for (int64_t d : se.type.shape)
          if (d < 0) fail("'" + se.key + "' has a negative dim");
        if (!index_.emplace(se.key, s->entries.size()).second) fail("lists '" + se.key + "' twice");
        s->entries.push_back(std::move(se));
      }
    } catch (const json::exception& e) {
      fail(std::string("an entry is not {key, dtype, shape}: ") + e.what());
    }
  }

  void read_initializers(ModuleState* s) {
    const json map = parse("pipetrain.initializers", json::object());
    if (!map.is_object()) fail("is not a map of initializer: [{key, transposed}]");
    for (const auto& [name, keys] : map.items()) {
      auto it = inits_.find(name);
      if (it == inits_.end()) fail("names '" + name + "', which is no initializer of the graph");
      if (!keys.is_array()) fail("'" + name + "' maps to no list of {key, transposed}");
      for (const json& k : keys) {
        std::string key;
        bool transposed = false;
        try {
          key = k.at("key").get<std::string>();
          transposed = k.value("transposed", false);
        } catch (const json::exception& e) {
          fail("'" + name + "': an item is not {key, transposed}: " + e.what());
        }
        StateEntry& se = entry(s, key);
        if (!se.initializer.empty()) fail("'" + key + "' is held by both '" + se.initializer + "' and '" + name + "'");
        TensorType want = se.type;
        if (transposed) {
          if (want.shape.size() != 2) fail("'" + key + "' is " + want.str() + ": only a 2-D entry can be stored transposed");
          std::swap(want.shape[0], want.shape[1]);
        }
        if (!(it->second == want))
          fail("'" + name + "' is " + it->second.str() + " in the graph, but holds '" + key + "' as " + want.str() +
               (transposed ? " (transposed)" : ""));
        se.initializer = name;
        se.transposed = transposed;
      }
    }
  }

  void read_int_buffers(ModuleState* s) {
    const json map = parse("pipetrain.int_buffers", json::object());
    if (!map.is_object()) fail("is not a map of key: {start, counts_forwards_of}");
    for (const auto& [key, b] : map.items()) {
      StateEntry& se = entry(s, key);
      if (is_floating(se.type.dtype)) fail("'" + key + "' is " + se.type.str() + ", not an integer or bool buffer");
      try {
        se.start = b.at("start").get<std::vector<int64_t>>();
        se.counts_forwards_of = b.value("counts_forwards_of", std::string());
      } catch (const json::exception& e) {
        fail("'" + key + "' is not {start: [int], counts_forwards_of: key}: " + e.what());
      }
      if (static_cast<int64_t>(se.start.size()) != se.type.numel())
        fail("'" + key + "' has " + std::to_string(se.start.size()) + " start values for " + se.type.str());
      if (!se.counts_forwards_of.empty()) {
        const StateEntry& counted = entry(s, se.counts_forwards_of);
        if (counted.initializer.empty())
          fail("'" + key + "' counts the forwards of '" + counted.key + "', which no initializer holds");
      }
      se.has_start = true;
    }
  }

  std::string path_, key_;
  std::map<std::string, std::string> props_;
  std::map<std::string, TensorType> inits_;
  std::map<std::string, size_t> index_;
};

}  // namespace

std::optional<ModuleState> read_module_state(const onnx::ModelProto& m, const std::string& path) {
  Reader r(m, path);
  if (!r.recorded()) return std::nullopt;
  return r.read();
}

std::optional<ModuleState> read_module_state(const std::string& path) {
  return read_module_state(read_model(path, ExternalData::kLeaveFloats), path);  // the weights not read
}

}  // namespace pt
