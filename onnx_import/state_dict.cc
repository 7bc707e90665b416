#include "onnx_import/state_dict.h"

#include <cstring>

#include "core/error.h"
#include "core/half_floats.h"
#include "onnx_import/load.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

// W^T of a 2-D tensor of any element size: [r, c] -> [c, r].
Tensor transpose_2d(const Tensor& t) {
  PT_CHECK(t.type.shape.size() == 2, "transpose of " + t.type.str());
  const int64_t r = t.type.shape[0], c = t.type.shape[1];
  const size_t e = dtype_size(t.type.dtype);
  Tensor out;
  out.type = {t.type.dtype, {c, r}};
  out.data.resize(t.data.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      std::memcpy(&out.data[static_cast<size_t>(j * r + i) * e], &t.data[static_cast<size_t>(i * c + j) * e], e);
  return out;
}

// Integer or bool values as a tensor of `type` (bool: nonzero is 1).
Tensor int_tensor(const TensorType& type, const std::vector<int64_t>& values) {
  Tensor t;
  t.type = type;
  t.data.resize(static_cast<size_t>(type.bytes()));
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t v = values[i];
    std::byte* at = &t.data[i * dtype_size(type.dtype)];
    auto put = [&](auto x) { std::memcpy(at, &x, sizeof x); };
    switch (type.dtype) {
      case DType::kInt64: put(v); break;
      case DType::kUInt64: put(static_cast<uint64_t>(v)); break;
      case DType::kInt32: put(static_cast<int32_t>(v)); break;
      case DType::kUInt32: put(static_cast<uint32_t>(v)); break;
      case DType::kInt16: put(static_cast<int16_t>(v)); break;
      case DType::kUInt16: put(static_cast<uint16_t>(v)); break;
      case DType::kInt8: put(static_cast<int8_t>(v)); break;
      case DType::kUInt8: put(static_cast<uint8_t>(v)); break;
      case DType::kBool: put(static_cast<uint8_t>(v != 0)); break;
      default: PT_CHECK(false, std::string("integer values for ") + dtype_name(type.dtype));
    }
  }
  return t;
}

// The model file's initializers, read (with external data) the first time one is asked for;
// float16/bfloat16 ones widened with `float32`.
class FileInitializers {
 public:
  FileInitializers(std::string path, bool float32) : path_(std::move(path)), float32_(float32) {}
  Tensor get(const std::string& name) {
    if (!model_) model_ = read_model(path_, ExternalData::kLeaveFloats);  // each tensor read when asked for
    for (const auto& t : model_->graph().initializer())
      if (t.name() == name) {
        Tensor v = tensor_from_proto(t, path_ + ": initializer '" + name + "'");
        return float32_ ? widened(v) : v;
      }
    PT_CHECK(false, "'" + name + "' was an initializer of " + path_ + " when the run began");
  }

 private:
  std::string path_;
  bool float32_;
  std::optional<onnx::ModelProto> model_;
};

// The trained tensors in the dtypes they are written in: each rounded to its file dtype, unless
// trained.float32 (state_dict.h).
std::map<std::string, const Tensor*> written_dtypes(const TrainedState& trained, std::deque<Tensor>* owned) {
  std::map<std::string, const Tensor*> out = trained.tensors;
  if (trained.float32) return out;
  for (auto& [name, t] : out)
    if (auto d = trained.file_dtypes.find(name); d != trained.file_dtypes.end() && t->type.dtype == DType::kFloat32)
      t = &owned->emplace_back(narrowed(*t, d->second));
  return out;
}

using Entry = std::pair<std::string, const Tensor*>;

// Without a record: each trained tensor under its module parameter's name where import found one.
std::vector<Entry> by_module_name(const TrainedState& trained, const std::map<std::string, const Tensor*>& written,
                                  std::deque<Tensor>* owned) {
  std::vector<Entry> tensors;
  for (const auto& [name, t] : written) {
    auto m = trained.module_names.find(name);
    if (m == trained.module_names.end()) tensors.emplace_back(name, t);
    else tensors.emplace_back(m->second.parameter, m->second.transposed ? &owned->emplace_back(transpose_2d(*t)) : t);
  }
  return tensors;
}

// The trained tensors by module name, completed to the state_dict at the start (see the header).
std::vector<Entry> complete_from_start(const std::string& path, std::vector<std::pair<std::string, Tensor>> start_file,
                                       const std::vector<Entry>& trained, StateDict* w) {
  std::deque<Tensor>* owned = &w->owned;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : trained) by_name[name] = t;
  std::vector<Entry> start;  // kept in *owned, for the writer
  for (auto& [key, t] : start_file) start.emplace_back(key, &owned->emplace_back(std::move(t)));
  const auto bytes = [](const Tensor& t) { return std::string(reinterpret_cast<const char*>(t.data.data()), t.data.size()); };
  std::map<std::string, std::string> trained_by_start;  // start bytes -> a trained key
  for (const auto& [key, t] : start)
    if (by_name.count(key)) trained_by_start.emplace(bytes(*t), key);
  std::vector<Entry> out;
  std::set<std::string> named;
  for (const auto& [key, sp] : start) {
    const Tensor& s = *sp;
    named.insert(key);
    auto t = by_name.find(key);
    if (t != by_name.end() && t->second->type == s.type) {
      out.emplace_back(key, t->second);
      continue;
    }
    if (t != by_name.end()) {
      const TensorType& have = t->second->type;
      if (have.dtype != s.type.dtype || have.numel() > s.type.numel() || have.shape.empty() || s.type.shape.empty() ||
          have.shape.back() != s.type.shape.back())
        throw UserError(path + ": tensor '" + key + "'",
                        "is " + s.type.str() + ", and the trained one " + have.str() + " is not its leading rows",
                        "save the state_dict of the module that was exported");
      Tensor& whole = owned->emplace_back(s);  // the rows the file holds, trained; the rest as they started
      std::memcpy(whole.data.data(), t->second->data.data(), t->second->data.size());
      w->completed.push_back(key);
      out.emplace_back(key, &whole);
      continue;
    }
    auto twin = trained_by_start.find(bytes(s));
    bool one_value = true;
    const size_t e = dtype_size(s.type.dtype);
    for (size_t i = e; i < s.data.size() && one_value; i += e) one_value = std::memcmp(&s.data[i], &s.data[0], e) == 0;
    if (twin != trained_by_start.end() && !one_value && by_name.at(twin->second)->type == s.type)
      out.emplace_back(key, by_name.at(twin->second));
    else
      out.emplace_back(key, sp);
  }
  for (const Entry& t : trained)
    if (!named.count(t.first)) {
      w->not_in_start.push_back(t.first);
      out.push_back(t);
    }
  return out;
}

}  // namespace

StateDict trained_state_dict(const std::string& model_path, const std::optional<ModuleState>& module,
                             const TrainedState& trained, std::vector<std::pair<std::string, Tensor>> start) {
  StateDict w;
  std::vector<Entry>& tensors = w.tensors;
  std::deque<Tensor>& owned = w.owned;
  const std::map<std::string, const Tensor*> written = written_dtypes(trained, &owned);
  if (!module) {
    tensors = by_module_name(trained, written, &owned);
    if (trained.float32)
      for (auto& [key, t] : start) t = widened(t);
    if (!trained.start_state.empty()) tensors = complete_from_start(trained.start_state, std::move(start), tensors, &w);
    return w;
  }
  FileInitializers file(model_path, trained.float32);
  std::map<std::string, const StateEntry*> by_key;
  for (const StateEntry& e : module->entries) by_key[e.key] = &e;
  for (const StateEntry& e : module->entries) {
    if (e.has_start) {
      std::vector<int64_t> values = e.start;
      if (!e.counts_forwards_of.empty() && trained.counted.count(by_key.at(e.counts_forwards_of)->initializer))
        for (int64_t& v : values) v += trained.forwards;
      tensors.emplace_back(e.key, &owned.emplace_back(int_tensor(e.type, values)));
      continue;
    }
    if (e.initializer.empty()) {
      w.missing.push_back(e.key);
      continue;
    }
    auto it = written.find(e.initializer);
    const Tensor* t = it != written.end() ? it->second : &owned.emplace_back(file.get(e.initializer));
    if (e.transposed) t = &owned.emplace_back(transpose_2d(*t));
    TensorType want = e.type;  // the record's dtype, but float32 where every tensor is
    if (trained.float32 && is_half(want.dtype)) want.dtype = DType::kFloat32;
    if (!(t->type == want))
      throw UserError(model_path + ": initializer '" + e.initializer + "'",
                      "is " + t->type.str() + " after import, but the record says '" + e.key + "' is " + want.str(),
                      "export the module again with samples/export_model.py");
    tensors.emplace_back(e.key, t);
  }
  return w;
}

}  // namespace pt
