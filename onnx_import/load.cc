#include "onnx_import/load.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <onnx/checker.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "onnx_import/model_bytes.h"
#include "onnx_import/op_table.h"
#include "onnx_import/opset_adapt.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  return line.empty() ? s : line;
}

// The model at `path`, parsed from a read-only map of the file; with leave_weights, its inline
// floating-point weights are left in the file and *left says where (onnx_import/model_bytes.h).
onnx::ModelProto parse_file(const std::string& path, bool leave_weights, std::vector<InlineBytes>* left) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw UserError(path, "no such file", "check the path to the model");
  if (fs::is_directory(path, ec))
    throw UserError(path, "is a folder, not a model file", "pass the .onnx file inside it");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st{};
  if (fd < 0 || fstat(fd, &st) != 0) {
    if (fd >= 0) close(fd);
    throw UserError(path, "cannot be opened for reading", "check its permissions");
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* map = size == 0 ? MAP_FAILED : mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (size == 0) throw UserError(path, "is empty", "export the model again");
  if (map == MAP_FAILED) throw UserError(path, "cannot be mapped for reading", "check that it is a regular file");
  onnx::ModelProto m;
  const bool parsed = parse_model_bytes({static_cast<const char*>(map), size}, leave_weights, &m, left);
  munmap(map, size);
  if (!parsed)
    throw UserError(path, "is not an ONNX model (protobuf parsing failed: garbage or truncated)",
                    "export the model again with torch.onnx.export");
  if (!m.has_graph() || m.graph().node_size() == 0)
    throw UserError(path, "holds no graph nodes (not an ONNX model, or an empty one)",
                    "export the model again with torch.onnx.export");
  return m;
}

// One number of a tensor's external_data (offset, length): a decimal count of bytes.
int64_t external_number(const std::string& where, const std::string& key, const std::string& value) {
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < 0)
    throw UserError(where, "has external data " + key + " '" + value + "', not a count of bytes",
                    "export the model again");
  return v;
}

// Where one tensor's external bytes lie, every check made against the file as it is now: the
// location inside the model's folder, the file there and readable, the range inside it.
StoredBytes external_range(const onnx::TensorProto& t, const fs::path& dir, const std::string& model_path) {
  const std::string where = model_path + ": tensor '" + t.name() + "'";
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location") location = kv.value();
    if (kv.key() == "offset") offset = external_number(where, "offset", kv.value());
    if (kv.key() == "length") length = external_number(where, "length", kv.value());
  }
  if (location.empty())
    throw UserError(where, "is marked external but names no location", "export the model again");
  // As the ONNX spec has it: a relative path inside the model's folder, never out of it.
  const fs::path relative(location);
  bool escapes = relative.is_absolute() || relative.has_root_name();
  for (const fs::path& part : relative) escapes = escapes || part == "..";
  if (escapes)
    throw UserError(where, "names external data '" + location + "', outside the model's folder",
                    "keep the data file beside the model, as it was exported");
  const fs::path file = dir / relative;
  std::error_code ec;
  if (!fs::exists(file, ec))
    throw UserError(where, "its external data file '" + file.string() + "' is missing",
                    "keep the data file beside the model, as it was exported");
  if (!fs::is_regular_file(file, ec))
    throw UserError(where, "names external data '" + file.string() + "', which is not a regular file",
                    "keep the data file beside the model, as it was exported");
  if (!std::ifstream(file, std::ios::binary))
    throw UserError(where, "its external data file '" + file.string() + "' cannot be opened",
                    "check its permissions");
  const int64_t size = static_cast<int64_t>(fs::file_size(file, ec));
  if (length < 0) length = offset <= size ? size - offset : 0;
  if (offset > size || length > size - offset)
    throw UserError(where,
                    "needs " + std::to_string(length) + " bytes from byte " + std::to_string(offset) + " of '" +
                        file.string() + "', which holds " + std::to_string(size),
                    "the external data file is truncated; export the model again");
  return StoredBytes{where, fs::absolute(file, ec).lexically_normal().string(), offset, length};
}

// Moves one tensor's external bytes into raw_data.
void inline_external(onnx::TensorProto* t, const StoredBytes& range) {
  std::string data(static_cast<size_t>(range.length), '\0');
  read_stored_bytes(range, reinterpret_cast<std::byte*>(data.data()));
  t->set_raw_data(std::move(data));
  t->clear_external_data();
  t->set_data_location(onnx::TensorProto::DEFAULT);
}

// Leaves one tensor's bytes in the file, its external data naming the checked range with the
// file's absolute path (tensor_from_proto and stored_tensor read it there; the onnx checker
// takes it as it is).
void locate_external(onnx::TensorProto* t, const StoredBytes& range) {
  t->clear_external_data();
  for (const auto& [key, value] : {std::pair<const char*, std::string>{"location", range.file},
                                   {"offset", std::to_string(range.offset)},
                                   {"length", std::to_string(range.length)}}) {
    auto* kv = t->add_external_data();
    kv->set_key(key);
    kv->set_value(value);
  }
}

// Marks each initializer parse_file left in the model's own file as stored there, its external
// data naming the range (kInModelFileKey: the bytes are the .onnx's own, not an external file's).
void locate_inline(onnx::ModelProto* m, const std::string& path, const std::vector<InlineBytes>& left) {
  const std::string file = fs::absolute(path).string();
  for (const InlineBytes& b : left) {
    onnx::TensorProto* t = m->mutable_graph()->mutable_initializer(b.initializer);
    locate_external(t, {path + ": initializer '" + t->name() + "'", file, b.offset, b.length});
    auto* kv = t->add_external_data();
    kv->set_key(kInModelFileKey);
    kv->set_value("1");
    t->set_data_location(onnx::TensorProto::EXTERNAL);
  }
}

void place_all_external(onnx::ModelProto* m, const std::string& path, ExternalData how) {
  const fs::path dir = fs::path(path).parent_path();
  auto* g = m->mutable_graph();
  for (auto& t : *g->mutable_initializer()) {
    if (t.data_location() != onnx::TensorProto::EXTERNAL) continue;
    const StoredBytes range = external_range(t, dir, path);
    // Only float initializers (parameters, large buffers) stay in the file: integer tensors are
    // shapes and indices that import folds with.
    if (how == ExternalData::kLeaveFloats && is_floating(static_cast<DType>(t.data_type()))) locate_external(&t, range);
    else inline_external(&t, range);
  }
  for (auto& n : *g->mutable_node())
    for (auto& a : *n.mutable_attribute())
      if (a.has_t() && a.t().data_location() == onnx::TensorProto::EXTERNAL)
        inline_external(a.mutable_t(), external_range(a.t(), dir, path));
}

}  // namespace

void inline_placed(onnx::TensorProto* t) {
  if (t->data_location() != onnx::TensorProto::EXTERNAL) return;
  const StoredBytes range = stored_range(*t, t->name());
  if (range.file_dtype == DType::kUndefined) return inline_external(t, range);
  const Tensor widened = tensor_from_proto(*t, t->name());  // marked by widen_halves.h
  t->set_raw_data(widened.data.data(), widened.data.size());
  t->clear_external_data();
  t->set_data_location(onnx::TensorProto::DEFAULT);
}

namespace {

void check_opsets(const onnx::ModelProto& m, const std::string& path) {
  const int64_t opset = default_opset(m);
  if (opset < kMinOpset || opset > kMaxOpset)
    throw UserError(path, "opset " + std::to_string(opset) + " is outside the supported range " +
                              std::to_string(kMinOpset) + ".." + std::to_string(kMaxOpset),
                    "export again with torch.onnx.export(..., opset_version=20)");
}

void check_ops(const onnx::ModelProto& m, const std::string& path) {
  const int64_t opset = default_opset(m);
  for (int i = 0; i < m.graph().node_size(); ++i) {
    const auto& n = m.graph().node(i);
    if (find_op(n.domain(), n.op_type())) continue;
    const std::string name = n.name().empty() ? "#" + std::to_string(i) : n.name();
    const std::string op = n.domain().empty() ? n.op_type() : n.domain() + "::" + n.op_type();
    // Ops of opset 23+ that PyTorch does not write and import does not rewrite yet.
    if (n.domain().empty() && n.op_type() == "RotaryEmbedding")
      throw UserError(path + ": node '" + name + "' (" + op + ", opset " + std::to_string(opset) + ")",
                      "op RotaryEmbedding (opset 23) is not rewritten yet: PyTorch writes rotary "
                      "embeddings as plain ops at every opset",
                      "export with torch.onnx.export, which writes them so, or compute them with "
                      "Mul, Slice, Neg and Concat");
    throw UserError(path + ": node '" + name + "' (" + op + ", opset " + std::to_string(opset) + ")",
                    "op " + op + " is not supported",
                    "`pipetrain ops` lists the supported ops; replace it in the exported model");
  }
}

// A node reading a name that it or a later node writes: a cycle, or nodes out of order. Named
// here because the onnx checker's message for it spans lines and loses the node.
void check_node_order(const onnx::ModelProto& m, const std::string& path) {
  const auto& g = m.graph();
  std::map<std::string, int> writer;
  for (int i = 0; i < g.node_size(); ++i)
    for (const std::string& o : g.node(i).output())
      if (!o.empty()) writer.emplace(o, i);
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    for (const std::string& in : n.input()) {
      auto w = writer.find(in);
      if (w == writer.end() || w->second < i) continue;
      const auto& later = g.node(w->second);
      std::string what = "reads '" + in + "'";
      what += w->second == i ? ", its own output"
                             : ", which node '" + later.name() + "' (" + later.op_type() + ") writes after it";
      throw UserError(node_where(path, n, default_opset(m)), what + " (a cycle, or nodes out of order)",
                      "export the model again; an ONNX graph lists its nodes in topological order");
    }
  }
}

}  // namespace

std::string node_where(const std::string& path, const onnx::NodeProto& n, int64_t opset) {
  return path + ": node '" + n.name() + "' (" + n.op_type() + ", opset " + std::to_string(opset) + ")";
}

int64_t default_opset(const onnx::ModelProto& m) {
  for (const auto& o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") return o.version();
  return 0;
}

std::set<std::string> names_read(const onnx::GraphProto& g) {
  std::set<std::string> read;
  for (const auto& n : g.node())
    for (const auto& i : n.input()) read.insert(i);
  for (const auto& o : g.output()) read.insert(o.name());
  return read;
}

// Every tensor the file holds (initializers, Constant values and other tensor attributes) has a
// possible shape and the data that shape needs, before anything reads one. Tensors of a dtype
// pipetrain does not take are refused later, with the op or opset that brought them.
void check_tensors(const onnx::ModelProto& m, const std::string& path) {
  auto check = [](const onnx::TensorProto& t, const std::string& where) {
    if (numeric_dtype(t)) check_tensor_data(t, where);
  };
  for (const auto& t : m.graph().initializer()) check(t, path + ": initializer '" + t.name() + "'");
  for (int i = 0; i < m.graph().node_size(); ++i) {
    const auto& n = m.graph().node(i);
    for (const auto& a : n.attribute())
      if (a.has_t())
        check(a.t(), path + ": node '" + (n.name().empty() ? "#" + std::to_string(i) : n.name()) +
                                     "' (" + n.op_type() + "), attribute '" + a.name() + "'");
  }
}

onnx::ModelProto read_model(const std::string& path, ExternalData how) {
  std::vector<InlineBytes> left;
  onnx::ModelProto m = parse_file(path, how == ExternalData::kLeaveFloats, &left);
  place_all_external(&m, path, how);
  locate_inline(&m, path, left);
  check_tensors(m, path);
  return m;
}

std::vector<std::string> unsupported_ops(const onnx::ModelProto& m) {
  std::vector<std::string> out;
  for (int i = 0; i < m.graph().node_size(); ++i) {
    const auto& n = m.graph().node(i);
    if (find_op(n.domain(), n.op_type())) continue;
    const std::string op = n.domain().empty() ? n.op_type() : n.domain() + "::" + n.op_type();
    out.push_back("node '" + (n.name().empty() ? "#" + std::to_string(i) : n.name()) + "' (" + op + ")");
  }
  return out;
}

namespace {

// Input positions a kernel reads when it is made, not at run time: shapes, axes, starts, pads,
// repeats and counts (opset 13-28 forms).
bool is_shape_argument(const std::string& op, int i) {
  if (op == "Reshape" || op == "Expand" || op == "Tile" || op == "Split" || op == "Squeeze" ||
      op == "Unsqueeze" || op == "CumSum" || op == "TopK" || op.rfind("Reduce", 0) == 0)
    return i == 1;
  if (op == "Slice") return i >= 1;
  if (op == "Pad") return i == 1 || i == 3;
  return op == "ConstantOfShape" || op == "Range";
}

// Whether the input's declared element type and static dims are t's.
bool declares(const onnx::ValueInfoProto& in, const TensorType& t) {
  if (!in.type().has_tensor_type() || in.type().tensor_type().elem_type() != static_cast<int>(t.dtype))
    return false;
  const auto& dims = in.type().tensor_type().shape().dim();
  if (dims.size() != static_cast<int>(t.shape.size())) return false;
  for (int k = 0; k < dims.size(); ++k)
    if (dims[k].has_dim_value() && dims[k].dim_value() != t.shape[static_cast<size_t>(k)]) return false;
  return true;
}

// Replaces each given input that every reader takes as a shape argument by an initializer holding
// its value (ImportOptions::given_inputs).
void take_shape_inputs(onnx::GraphProto* g, const std::map<std::string, Tensor>& given) {
  std::map<std::string, bool> only_shape;  // input name -> every reader a shape argument
  for (const auto& n : g->node())
    for (int i = 0; i < n.input_size(); ++i) {
      auto [it, fresh] = only_shape.try_emplace(n.input(i), true);
      it->second = it->second && is_shape_argument(n.op_type(), i);
    }
  google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> kept;
  for (auto& in : *g->mutable_input()) {
    auto v = given.find(in.name());
    auto reads = only_shape.find(in.name());
    // Only what the model declares: anything else stays an input, for run's type check to name.
    const bool take = v != given.end() && reads != only_shape.end() && reads->second &&
                      declares(in, v->second.type);
    if (take) tensor_to_proto(v->second, in.name(), g->add_initializer());
    else *kept.Add() = std::move(in);
  }
  g->mutable_input()->Swap(&kept);
}

// Every name or glob of parameters.tied / untied / trained matches an initializer of the file, as
// it came or as import made it: a misspelt name is one line, not a silent no-op.
void check_parameter_choices(const ParameterChoices& c, const std::set<std::string>& names, const std::string& path) {
  for (const auto& [key, patterns] : {std::pair<const char*, const std::vector<std::string>&>{"tied", c.tied},
                                      {"untied", c.untied},
                                      {"trained", c.trained}})
    for (const std::string& p : patterns)
      if (std::none_of(names.begin(), names.end(),
                       [&](const std::string& n) { return fnmatch(p.c_str(), n.c_str(), 0) == 0; }))
        throw UserError(path + ": parameters." + key + " '" + p + "'", "matches no initializer of the model",
                        "`pipetrain inspect` lists them (and what import untied, restored or folded)");
}

}  // namespace

onnx::ModelProto load_model(const std::string& path, int64_t* source_opset,
                            const ParameterChoices* choices, ModuleParameters* restored,
                            const std::map<std::string, Tensor>* given_inputs) {
  onnx::ModelProto m = read_model(path, ExternalData::kLeaveFloats);
  check_opsets(m, path);
  if (source_opset) *source_opset = default_opset(m);
  check_ops(m, path);
  if (choices) {
    std::set<std::string> names;
    for (const auto& t : m.graph().initializer()) names.insert(t.name());
    *restored = restore_module_parameters(m.mutable_graph(), *choices);
    for (const auto& t : m.graph().initializer()) names.insert(t.name());
    check_parameter_choices(*choices, names, path);
  }
  if (given_inputs && !given_inputs->empty()) take_shape_inputs(m.mutable_graph(), *given_inputs);
  adapt_to_canonical_opset(&m, path);
  // Newer exporters write IR versions past what this onnx library knows (9 adds float8 types,
  // 10 4-bit ones and function overloads, up to 14 for opset 28); adapt_to_canonical_opset has
  // refused the new types, and nothing else changes a graph of supported ops, so such a model is
  // checked as the newest IR version known here.
  if (m.ir_version() > onnx::Version::IR_VERSION) m.set_ir_version(onnx::Version::IR_VERSION);
  check_node_order(m, path);
  try {
    NewerOpsHidden hidden(m.mutable_graph());
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    throw UserError(path, "fails the onnx checker: " + first_line(e.what()),
                    "export the model again; the file does not follow the ONNX spec");
  }
  return m;
}

}  // namespace pt
