#include "onnx_import/state_dict.h"

#include <cstring>
#include <string_view>

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

// The model file's initializers, each left in its external-data file until its bytes are asked
// for (the model read the first time one is).
class FileInitializers {
 public:
  explicit FileInitializers(std::string path) : path_(std::move(path)) {}
  Tensor get(const std::string& name) {
    if (!model_) model_ = read_model(path_, ExternalData::kLeaveFloats);
    for (const auto& t : model_->graph().initializer())
      if (t.name() == name) return stored_tensor(t, path_ + ": initializer '" + name + "'");
    PT_CHECK(false, "'" + name + "' was an initializer of " + path_ + " when the run began");
  }

 private:
  std::string path_;
  std::optional<onnx::ModelProto> model_;
};

// A stored tensor's bytes in a copy of it, which the caller drops: the tensor stays in its file.
Tensor loaded_copy(const Tensor& t) {
  Tensor copy = t;
  copy.load();
  return copy;
}

// The entries' bytes, made when the writer asks: a trained tensor through the fetch (as it is,
// or transposed back into `derived`), a start tensor completed by a trained one (into
// `completed`), a file's initializer or a start tensor read into `derived`. Each scratch holds one
// tensor at a time.
struct Makers {
  TensorFetch fetch;
  std::shared_ptr<Tensor> derived = std::make_shared<Tensor>(), completed = std::make_shared<Tensor>();
  std::map<std::string, DType> file_dtypes;  // a trained tensor's half dtype in the file (none with float32)
  bool float32 = false;                      // the file's half tensors widened

  explicit Makers(const TrainedState& trained)
      : fetch(trained.fetch), file_dtypes(trained.float32 ? std::map<std::string, DType>{} : trained.file_dtypes),
        float32(trained.float32) {
    if (!fetch)
      fetch = [tensors = trained.tensors](const std::string& name) -> const Tensor& {
        const Tensor* t = tensors.at(name);
        t->load();
        return *t;
      };
  }
  // A trained tensor is written in its file dtype: rounded where the file holds it as a half.
  StateTensor trained(const std::string& key, const std::string& name, const TensorType& type, bool transposed) const {
    auto half = file_dtypes.find(name);
    const DType to = half != file_dtypes.end() && type.dtype == DType::kFloat32 ? half->second : type.dtype;
    if (!transposed && to == type.dtype) return {key, type, [f = fetch, name]() -> const Tensor& { return f(name); }};
    PT_CHECK(!transposed || type.shape.size() == 2, "transpose of " + type.str());
    const TensorType out{to, transposed ? std::vector<int64_t>{type.shape[1], type.shape[0]} : type.shape};
    return {key, out, [f = fetch, name, transposed, to, into = derived]() -> const Tensor& {
              *into = Tensor();
              Tensor t = transposed ? transpose_2d(f(name)) : f(name);
              *into = to == t.type.dtype ? std::move(t) : narrowed(t, to);
              return *into;
            }};
  }
  // A stored tensor (a file's initializer, a start tensor) as its file holds it, or widened to
  // float32 where it is a half and every tensor is written in float32.
  StateTensor file(const std::string& key, const Tensor* lazy, bool transposed) const {
    const TensorType& t = lazy->type;
    PT_CHECK(!transposed || t.shape.size() == 2, "transpose of " + t.str());
    const bool widen = float32 && is_half(t.dtype);
    const DType dtype = widen ? DType::kFloat32 : t.dtype;
    const TensorType type = transposed ? TensorType{dtype, {t.shape[1], t.shape[0]}} : TensorType{dtype, t.shape};
    return {key, type, [lazy, transposed, widen, into = derived]() -> const Tensor& {
              *into = Tensor();
              Tensor read = loaded_copy(*lazy);
              if (widen) read = widened(read);
              *into = transposed ? transpose_2d(read) : std::move(read);
              return *into;
            }};
  }
  // The start tensor `start` with the trained tensor's bytes over its leading elements.
  StateTensor completed_from(const std::string& key, const Tensor* start, const StateTensor& trained) const {
    return {key, start->type, [start, bytes = trained.bytes, into = completed]() -> const Tensor& {
              *into = Tensor();
              const Tensor& t = bytes();
              Tensor whole = loaded_copy(*start);
              std::memcpy(whole.data.data(), t.data.data(), t.data.size());
              *into = std::move(whole);
              return *into;
            }};
  }
  static StateTensor held(const std::string& key, const Tensor* t) {
    return {key, t->type, [t]() -> const Tensor& { return *t; }};
  }
};

// Without a record: each trained tensor under its module parameter's name where import found one.
std::vector<StateTensor> by_module_name(const TrainedState& trained, const Makers& make) {
  std::vector<StateTensor> tensors;
  for (const auto& [name, t] : trained.tensors) {
    auto m = trained.module_names.find(name);
    if (m == trained.module_names.end()) tensors.push_back(make.trained(name, name, t->type, false));
    else tensors.push_back(make.trained(m->second.parameter, name, t->type, m->second.transposed));
  }
  return tensors;
}

size_t hash_of(const Tensor& t) {
  return std::hash<std::string_view>{}({reinterpret_cast<const char*>(t.data.data()), t.data.size()});
}

// The trained tensors by module name, completed to the state_dict at the start (see the header).
// The start tensors stay in their file: each is read when the writer comes to it, and where a
// tied twin is looked for, one at a time, known by the hash of its bytes; only a trained key's
// start of a type some untrained start tensor has can be one, so only those are hashed.
std::vector<StateTensor> complete_from_start(const std::string& path, std::vector<std::pair<std::string, Tensor>> start_file,
                                             const std::vector<StateTensor>& trained, const Makers& make, StateDict* w) {
  std::deque<Tensor>* owned = &w->owned;
  std::map<std::string, const StateTensor*> by_name;
  for (const StateTensor& t : trained) by_name[t.key] = &t;
  std::vector<std::pair<std::string, const Tensor*>> start;  // kept in *owned, for the writer
  for (auto& [key, t] : start_file) start.emplace_back(key, &owned->emplace_back(std::move(t)));
  std::set<std::string> untrained_types;
  for (const auto& [key, t] : start)
    if (!by_name.count(key)) untrained_types.insert(t->type.str());
  // Hash of the start bytes -> the trained keys with those bytes at the start, in file order.
  std::multimap<size_t, std::pair<std::string, const Tensor*>> trained_by_start;
  for (const auto& [key, t] : start)
    if (by_name.count(key) && untrained_types.count(t->type.str()))
      trained_by_start.emplace(hash_of(loaded_copy(*t)), std::make_pair(key, t));
  std::vector<StateTensor> out;
  std::set<std::string> named;
  for (const auto& [key, sp] : start) {
    const Tensor& s = *sp;
    named.insert(key);
    auto t = by_name.find(key);
    if (t != by_name.end() && t->second->type == s.type) {
      out.push_back(*t->second);
      continue;
    }
    if (t != by_name.end()) {
      const TensorType& have = t->second->type;
      if (have.dtype != s.type.dtype || have.numel() > s.type.numel() || have.shape.empty() || s.type.shape.empty() ||
          have.shape.back() != s.type.shape.back())
        throw UserError(path + ": tensor '" + key + "'",
                        "is " + s.type.str() + ", and the trained one " + have.str() + " is not its leading rows",
                        "save the state_dict of the module that was exported");
      // The rows the file holds, trained; the rest as they started.
      w->completed.push_back(key);
      out.push_back(make.completed_from(key, sp, *t->second));
      continue;
    }
    // A tied twin: the bytes of a trained key's start, bit for bit, and not one value throughout.
    const StateTensor* twin = nullptr;
    {
      const Tensor bytes = loaded_copy(s);
      bool one_value = true;
      const size_t e = dtype_size(s.type.dtype);
      for (size_t i = e; i < bytes.data.size() && one_value; i += e)
        one_value = std::memcmp(&bytes.data[i], &bytes.data[0], e) == 0;
      const auto [from, to] = trained_by_start.equal_range(hash_of(bytes));
      for (auto c = from; c != to && !one_value && !twin; ++c) {
        const StateTensor* candidate = by_name.at(c->second.first);
        if (candidate->type == s.type && loaded_copy(*c->second.second).data == bytes.data) twin = candidate;
      }
    }
    if (twin) {
      StateTensor as_twin = *twin;
      as_twin.key = key;
      out.push_back(std::move(as_twin));
    } else {
      out.push_back(make.file(key, sp, false));
    }
  }
  for (const StateTensor& t : trained)
    if (!named.count(t.key)) {
      w->not_in_start.push_back(t.key);
      out.push_back(t);
    }
  return out;
}

}  // namespace

StateDict trained_state_dict(const std::string& model_path, const std::optional<ModuleState>& module,
                             const TrainedState& trained, std::vector<std::pair<std::string, Tensor>> start) {
  StateDict w;
  std::vector<StateTensor>& tensors = w.tensors;
  std::deque<Tensor>& owned = w.owned;
  const Makers make(trained);
  if (!module) {
    tensors = by_module_name(trained, make);
    if (trained.float32)  // widened as each is read from its file (open_safetensors)
      for (auto& [key, t] : start)
        if (is_half(t.type.dtype)) {
          PT_CHECK(t.stored != nullptr, "start tensor '" + key + "' is not left in its file");
          StoredBytes at = *t.stored;
          at.file_dtype = t.type.dtype;
          t.type.dtype = DType::kFloat32;
          t.stored = std::make_shared<const StoredBytes>(std::move(at));
        }
    if (!trained.start_state.empty()) tensors = complete_from_start(trained.start_state, std::move(start), tensors, make, &w);
    return w;
  }
  FileInitializers file(model_path);
  std::map<std::string, const StateEntry*> by_key;
  for (const StateEntry& e : module->entries) by_key[e.key] = &e;
  for (const StateEntry& e : module->entries) {
    if (e.has_start) {
      std::vector<int64_t> values = e.start;
      if (!e.counts_forwards_of.empty() && trained.counted.count(by_key.at(e.counts_forwards_of)->initializer))
        for (int64_t& v : values) v += trained.forwards;
      tensors.push_back(Makers::held(e.key, &owned.emplace_back(int_tensor(e.type, values))));
      continue;
    }
    if (e.initializer.empty()) {
      w.missing.push_back(e.key);
      continue;
    }
    auto it = trained.tensors.find(e.initializer);
    StateTensor t = it != trained.tensors.end()
                        ? make.trained(e.key, e.initializer, it->second->type, e.transposed)
                        : make.file(e.key, &owned.emplace_back(file.get(e.initializer)), e.transposed);
    TensorType want = e.type;  // the record's dtype, but float32 where every tensor is
    if (trained.float32 && is_half(want.dtype)) want.dtype = DType::kFloat32;
    if (!(t.type == want))
      throw UserError(model_path + ": initializer '" + e.initializer + "'",
                      "is " + t.type.str() + " after import, but the record says '" + e.key + "' is " + want.str(),
                      "export the module again with samples/export_model.py");
    tensors.push_back(std::move(t));
  }
  return w;
}

}  // namespace pt
