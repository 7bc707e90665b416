#include "onnx_import/export.h"

#include <onnx/checker.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/files.h"
#include "core/half_floats.h"
#include "onnx_import/load.h"
#include "onnx_import/model_bytes.h"
#include "onnx_import/proto_convert.h"
#include "onnx_import/widen_halves.h"

namespace pt {
namespace {

// Gelu (opset 20) written with opset-17 ops, so that an exported graph stays at the canonical
// opset (the form every runtime reads and the onnx library here checks):
//   none: Y = X * 0.5 * (1 + Erf(X / sqrt 2))
//   tanh: Y = X * 0.5 * (1 + Tanh(sqrt(2/pi) * (X + 0.044715 X^3)))
void write_gelu_as_opset17(const Node& n, const Graph& g, onnx::GraphProto* gp) {
  const std::string x = g.value(n.inputs[0]).name, y = g.value(n.outputs[0]).name;
  const std::string p = n.name + "/gelu17/";
  auto scalar = [&](const std::string& name, float v) {
    Tensor t;
    t.type = TensorType{DType::kFloat32, {}};
    t.data.resize(sizeof(float));
    std::memcpy(t.data.data(), &v, sizeof v);
    tensor_to_proto(t, p + name, gp->add_initializer());
    return p + name;
  };
  auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
    auto* np = gp->add_node();
    np->set_name(p + out);
    np->set_op_type(op);
    for (const std::string& i : in) np->add_input(i);
    np->add_output(out == y ? y : p + out);
    return out == y ? y : p + out;
  };
  std::string inner;
  if (n.attr_string("approximate", "none") == "tanh") {
    const std::string cube = node("Mul", {x, node("Mul", {x, x}, "x2")}, "x3");
    const std::string sum = node("Add", {x, node("Mul", {cube, scalar("c", 0.044715f)}, "cx3")}, "sum");
    inner = node("Tanh", {node("Mul", {sum, scalar("k", 0.7978845608028654f)}, "arg")}, "t");
  } else {
    inner = node("Erf", {node("Mul", {x, scalar("r", 0.7071067811865476f)}, "arg")}, "t");
  }
  const std::string half_x = node("Mul", {x, scalar("half", 0.5f)}, "half_x");
  node("Mul", {half_x, node("Add", {inner, scalar("one", 1.0f)}, "one_plus")}, y);
}

}  // namespace

onnx::ModelProto to_model_proto(const Graph& g) {
  onnx::ModelProto m;
  m.set_ir_version(g.ir_version);
  m.set_producer_name("pipetrain");
  for (const auto& [domain, version] : g.opsets) {
    auto* o = m.add_opset_import();
    o->set_domain(domain);
    o->set_version(version);
  }
  // A node domain the graph's opsets lack ("pipetrain" in a graph built by hand) is imported at
  // version 1, so that the model names every domain it uses.
  std::set<std::string> missing;
  for (const Node& n : g.nodes)
    if (!n.domain.empty() && n.domain != "ai.onnx" && !g.opsets.count(n.domain))
      missing.insert(n.domain);
  for (const std::string& domain : missing) {
    auto* o = m.add_opset_import();
    o->set_domain(domain);
    o->set_version(1);
  }
  auto* gp = m.mutable_graph();
  gp->set_name(g.name.empty() ? "pipetrain" : g.name);
  std::set<ValueId> io;
  for (ValueId v : g.inputs) {
    type_to_value_info(g.value(v).type, g.value(v).name, gp->add_input());
    io.insert(v);
  }
  for (ValueId v : g.outputs) {
    type_to_value_info(g.value(v).type, g.value(v).name, gp->add_output());
    io.insert(v);
  }
  for (ValueId v : g.initializers) {
    tensor_to_proto(*g.value(v).init, g.value(v).name, gp->add_initializer());
    io.insert(v);
  }
  for (const Node& n : g.nodes) {
    if (n.domain.empty() && n.op_type == "Gelu" && g.opset() < 20) {
      write_gelu_as_opset17(n, g, gp);
      if (!io.count(n.outputs[0]))
        type_to_value_info(g.value(n.outputs[0]).type, g.value(n.outputs[0]).name, gp->add_value_info());
      continue;
    }
    auto* np = gp->add_node();
    np->set_name(n.name);
    np->set_op_type(n.op_type);
    if (!n.domain.empty()) np->set_domain(n.domain);
    for (ValueId v : n.inputs) np->add_input(v == kNoValue ? "" : g.value(v).name);
    for (ValueId v : n.outputs) {
      np->add_output(v == kNoValue ? "" : g.value(v).name);
      if (v != kNoValue && !io.count(v))
        type_to_value_info(g.value(v).type, g.value(v).name, gp->add_value_info());
    }
    for (const auto& [key, value] : n.attrs) attr_to_proto(key, value, np->add_attribute());
  }
  return m;
}

namespace {

// A path a model cannot be written to: a folder, or a model past what one protobuf holds.
void check_model_path(const std::string& path, size_t bytes) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError(path, "is a folder", "name the model file, e.g. " + path + "/model.onnx");
  if (bytes > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw UserError(path, "cannot be written: the model is over 2 GiB, the most one protobuf holds",
                    "models this large need external data, which pipetrain does not write yet");
}

namespace pb = google::protobuf;

constexpr int kLastField = std::numeric_limits<int>::max();  // a range that reaches the message's end

// m's fields numbered in [lo, hi) as SerializeToString writes them: fields in number order,
// unknown fields after the last (they go with the range reaching kLastField). A message's bytes
// are its ranges' bytes one after the other.
std::string fields_in(const pb::Message& m, int lo, int hi) {
  std::unique_ptr<pb::Message> part(m.New());
  part->CopyFrom(m);
  const pb::Reflection* r = part->GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(*part, &fields);
  for (const pb::FieldDescriptor* f : fields)
    if (f->number() < lo || f->number() >= hi) r->ClearField(part.get(), f);
  if (hi != kLastField) r->MutableUnknownFields(part.get())->Clear();
  return part->SerializeAsString();
}

// A piece of the file: bytes made now, or an initializer's raw data brought when written (a
// view valid until the next piece is asked for).
struct Piece {
  std::string bytes;
  std::function<std::string_view()> data;
  size_t size = 0;  // of data
};

// An initializer whose raw_data (field 9 of TensorProto) is `size` bytes brought by `data`; the
// proto holds every other field.
void add_streamed(const onnx::TensorProto& t, size_t size, std::function<std::string_view()> data,
                  std::vector<Piece>* graph) {
  const std::string head = fields_in(t, 1, 9) + field_head(9, size), tail = fields_in(t, 10, kLastField);
  graph->push_back({field_head(5, head.size() + size + tail.size()) + head, nullptr, 0});
  graph->push_back({"", std::move(data), size});
  graph->push_back({tail, nullptr, 0});
}

std::string_view bytes_of(const Tensor& t) { return {reinterpret_cast<const char*>(t.data.data()), t.data.size()}; }

// A float32 weight of a float16/bfloat16 initializer: written rounded to the file's dtype.
bool narrows(const TensorType& file, const TensorType& weight) {
  return is_half(file.dtype) && weight == TensorType{DType::kFloat32, file.shape};
}

// Every weight names an initializer of m of its type (or its float32 widening); else a
// UserError naming the source.
void check_weights(const onnx::ModelProto& m, const std::map<std::string, const Tensor*>& weights,
                   const std::string& source) {
  for (const auto& [name, t] : weights) {
    const onnx::TensorProto* init = nullptr;
    for (const onnx::TensorProto& i : m.graph().initializer())
      if (i.name() == name) init = &i;
    if (!init)
      throw UserError(source, "has no initializer '" + name + "' to carry the trained value",
                      "export the trained model from the file that was trained");
    const TensorType old = check_tensor_data(*init, source + ": initializer '" + name + "'");
    if (!(old == t->type) && !narrows(old, t->type))
      throw UserError(source + ": initializer '" + name + "'",
                      "is " + old.str() + " but the trained value is " + t->type.str(), "train and export the same model file");
  }
}

// Where the trained model's initializers' bytes go: each inline in the model, or those the
// source keeps in external data (kAsSource) or every float one of 1 KiB or more (kLarge: an inline
// source whose trained model would pass 2 GiB; onnx's size_threshold) back to back in the data
// file beside it, `location` (the data file's name, relative to the model) `length` bytes long.
struct DataFile {
  enum Placement { kInline, kAsSource, kLarge } placement = kInline;
  std::string location;
  std::vector<Piece> pieces;
  size_t length = 0;
};

constexpr size_t kExternalThreshold = 1024;

// Whether an initializer of `size` bytes, external in the source or not, goes to the data file.
bool goes_external(const DataFile& file, bool was_external, bool floating, size_t size) {
  if (file.placement == DataFile::kAsSource) return was_external;
  return file.placement == DataFile::kLarge && floating && size >= kExternalThreshold;
}

// The initializer (every field but its data) with its `size` bytes brought by `data`: inline
// (raw_data, field 9), or at the data file's end, its external data naming the range.
void add_placed(onnx::TensorProto& t, size_t size, std::function<std::string_view()> data, bool external,
                DataFile* file, std::vector<Piece>* graph) {
  if (!external) return add_streamed(t, size, std::move(data), graph);
  t.clear_external_data();
  for (const auto& [key, value] : {std::pair<const char*, std::string>{"location", file->location},
                                   {"offset", std::to_string(file->length)},
                                   {"length", std::to_string(size)}}) {
    auto* kv = t.add_external_data();
    kv->set_key(key);
    kv->set_value(value);
  }
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  const std::string whole = t.SerializeAsString();
  graph->push_back({field_head(5, whole.size()) + whole, nullptr, 0});
  file->pieces.push_back({"", std::move(data), size});
  file->length += size;
}

// An initializer's pieces: a weight's bytes through fetch (without one, its own), a float the
// file keeps in its external data read into `read` (one at a time), any other as it is; each
// inline or in `file` as goes_external says.
void add_initializer(onnx::TensorProto& init, const std::map<std::string, const Tensor*>& weights, const TensorFetch& fetch,
                     const std::shared_ptr<std::vector<std::byte>>& read, DataFile* file, std::vector<Piece>* pieces) {
  const bool stored = init.data_location() == onnx::TensorProto::EXTERNAL;  // in the source's data file or .onnx
  const bool was_external = in_data_file(init);
  auto it = weights.find(init.name());
  if (it != weights.end()) {  // as tensor_to_proto writes it
    const Tensor* own = it->second;
    const TensorType type = check_tensor_data(init, init.name());
    const DType to = narrows(type, own->type) ? type.dtype : own->type.dtype;
    init.Clear();
    init.set_name(it->first);
    init.set_data_type(static_cast<int32_t>(to));
    for (int64_t d : own->type.shape) init.add_dims(d);
    const auto held = std::make_shared<Tensor>();  // the narrowed copy, while it is written
    const size_t size = static_cast<size_t>(own->type.numel()) * dtype_size(to);
    add_placed(init, size, [&fetch, own, to, held, name = it->first]() {
      const Tensor& t = fetch ? fetch(name) : (own->load(), *own);
      PT_CHECK(t.type == own->type, "'" + name + "' came back as " + t.type.str());
      if (to == t.type.dtype) return bytes_of(t);
      *held = narrowed(t, to);
      return bytes_of(*held);
    }, goes_external(*file, was_external, true, size), file, pieces);
  } else if (stored) {  // as inline_placed reads it: the file's bytes, widened where marked
    const StoredBytes range = stored_range(init, init.name());
    const TensorType type = check_tensor_data(init, init.name());
    init.clear_external_data();
    if (was_external) init.set_data_location(onnx::TensorProto::DEFAULT);
    else init.clear_data_location();  // inline in the source: written as it was
    const size_t size = static_cast<size_t>(type.bytes());
    add_placed(init, size, [range, type, read]() {
      read_stored_tensor(range, type, read.get());
      return std::string_view(reinterpret_cast<const char*>(read->data()), read->size());
    }, goes_external(*file, was_external, true, size), file, pieces);
  } else if (init.has_raw_data() && goes_external(*file, false, is_floating(static_cast<DType>(init.data_type())),
                                                  init.raw_data().size())) {
    const auto bytes = std::make_shared<std::string>(std::move(*init.mutable_raw_data()));
    init.clear_raw_data();
    add_placed(init, bytes->size(), [bytes]() { return std::string_view(*bytes); }, true, file, pieces);
  } else {
    const std::string whole = init.SerializeAsString();
    pieces->push_back({field_head(5, whole.size()) + whole, nullptr, 0});
  }
  init.Clear();  // what is written from here on lives in the pieces
}

// How the trained model places its initializers' bytes: as the source does when it keeps any
// in external data; else inline, unless that would pass 2 GiB (the weights counted at the
// size written, the rest as they are).
DataFile::Placement placement_of(const pb::RepeatedPtrField<onnx::TensorProto>& inits,
                                 const std::map<std::string, const Tensor*>& weights) {
  size_t bytes = 0;
  for (const onnx::TensorProto& t : inits) {
    if (in_data_file(t)) return DataFile::kAsSource;
    auto it = weights.find(t.name());
    bytes += it == weights.end() ? t.ByteSizeLong() : static_cast<size_t>(it->second->type.bytes());
  }
  return bytes > static_cast<size_t>(std::numeric_limits<int>::max()) ? DataFile::kLarge : DataFile::kInline;
}

size_t length_of(const std::vector<Piece>& pieces) {
  size_t bytes = 0;
  for (const Piece& p : pieces) bytes += p.bytes.size() + p.size;
  return bytes;
}

}  // namespace

void save_model(const onnx::ModelProto& m, const std::string& path) {
  check_model_path(path, m.ByteSizeLong());
  // Streamed to the file: no second copy of the weights in memory.
  write_file_atomic(path, [&](int fd) { return m.SerializeToFileDescriptor(fd); },
                    "check that its folder exists and is writable, and has free space");
}

namespace {

// Writes the pieces to `path` atomically, each initializer's bytes brought as it comes.
void write_pieces(const std::string& path, std::vector<Piece>& pieces) {
  write_file_atomic(
      path, pieces.size(),
      [&](size_t i) {
        if (!pieces[i].data) return std::string_view(pieces[i].bytes);
        const std::string_view data = pieces[i].data();
        PT_CHECK(data.size() == pieces[i].size, "an initializer's bytes changed size while written");
        return data;
      },
      "check that its folder exists and is writable, and has free space");
}

}  // namespace

void save_model_with_weights(const std::string& source,
                             const std::map<std::string, const Tensor*>& weights,
                             const std::string& path, const ParameterChoices& choices, bool float32,
                             const TensorFetch& fetch) {
  // The file's float initializers stay in their external-data file until written.
  onnx::ModelProto m = read_model(source, ExternalData::kLeaveFloats);
  restore_module_parameters(m.mutable_graph(), choices);  // the copies import trained
  if (float32) widen_half_floats(&m);
  check_weights(m, weights, source);
  // The graph: its fields before the initializers (field 5), each initializer, its fields after.
  pb::RepeatedPtrField<onnx::TensorProto> inits;
  inits.Swap(m.mutable_graph()->mutable_initializer());
  DataFile data;
  data.placement = placement_of(inits, weights);
  data.location = std::filesystem::path(path).filename().string() + ".data";
  const std::unique_ptr<onnx::GraphProto> graph(m.release_graph());
  std::vector<Piece> pieces{{fields_in(*graph, 1, 5), nullptr, 0}};
  const auto read = std::make_shared<std::vector<std::byte>>();
  for (onnx::TensorProto& init : inits) add_initializer(init, weights, fetch, read, &data, &pieces);
  pieces.push_back({fields_in(*graph, 6, kLastField), nullptr, 0});
  // The model: its fields before the graph (field 7), the graph, its fields after.
  pieces.insert(pieces.begin(), {fields_in(m, 1, 7) + field_head(7, length_of(pieces)), nullptr, 0});
  pieces.push_back({fields_in(m, 8, kLastField), nullptr, 0});
  check_model_path(path, length_of(pieces));
  if (data.pieces.empty()) return write_pieces(path, pieces);
  // The data file first, then the model that names it: a failed model write takes the new data
  // file away again, so no model is left naming bytes that are not its own.
  const std::string data_path = path + ".data";
  write_pieces(data_path, data.pieces);
  try {
    write_pieces(path, pieces);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(data_path, ec);
    throw;
  }
}

void export_graphs(const std::vector<std::pair<std::string, Graph>>& files, const std::string& dir,
                   const std::string& flag) {
  namespace fs = std::filesystem;
  std::vector<onnx::ModelProto> models;
  for (const auto& [name, graph] : files) {
    models.push_back(to_model_proto(graph));
    try {
      onnx::checker::check_model(models.back());
    } catch (const std::exception& e) {
      PT_CHECK(false, name + " fails the onnx checker: " + e.what());
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir, "cannot create the export folder: " + ec.message(), "choose another " + flag);
  for (size_t k = 0; k < models.size(); ++k)
    save_model(models[k], (fs::path(dir) / files[k].first).string());
}

}  // namespace pt
