// core/ir.h: the graph every pass works on. onnx_import makes it from a ModelProto; partition,
// autodiff and exec read it. Knows nothing of protobuf.
//
// A Graph is a list of Nodes in topological order over a table of Values (tensors). Every Value
// has a concrete TensorType once import is done. Initializers are Values carrying data; graph
// inputs are the Values fed at run time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace pt {

// Numbered as ONNX's TensorProto.DataType so that conversion is a cast.
enum class DType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kBFloat16 = 16,
};

size_t dtype_size(DType t);        // bytes per element; 0 for undefined and string
const char* dtype_name(DType t);   // "float32", "int64", ...
bool is_floating(DType t);

// The DType of a C++ element type (bool is stored as one byte, 0 or 1).
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kFloat32;
  else if constexpr (std::is_same_v<T, double>) return DType::kFloat64;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::kInt64;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::kInt32;
  else if constexpr (std::is_same_v<T, int8_t>) return DType::kInt8;
  else if constexpr (std::is_same_v<T, uint8_t>) return DType::kUInt8;
  else {
    static_assert(std::is_same_v<T, bool>, "no DType for this element type");
    return DType::kBool;
  }
}

struct TensorType {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;  // concrete after import; a scalar has shape {}

  int64_t numel() const;
  int64_t bytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype)); }
  std::string str() const;  // "float32[8,128,256]"
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[8,128,256]"
// numpy (multidirectional) broadcasting of `shapes`, aligned right; nullopt where two dims differ
// and neither is 1.
std::optional<std::vector<int64_t>> broadcast_shapes(const std::vector<std::vector<int64_t>>& shapes);
// "[2,3] and [4,3]": the shapes, for a message saying they do not broadcast.
std::string shapes_str(const std::vector<std::vector<int64_t>>& shapes);

// Where a tensor's bytes lie in a file (an initializer's ONNX external data) until read.
// Import checks that the range lies inside the file; a load that still fails (the file changed
// since) is a UserError naming `where` ("model.onnx: initializer 'w'") and the file. A float
// tensor holding NaN is refused when it is loaded, as import refuses a resident one.
struct StoredBytes {
  std::string where;
  std::string file;
  int64_t offset = 0;
  int64_t length = 0;
  // The bytes' dtype where it is not the tensor's: float16 or bfloat16 in the file, widened to
  // the tensor's float32 as they are read (core/half_floats.h). Undefined: the tensor's own.
  DType file_dtype = DType::kUndefined;
};

// Reads s.length bytes of s into out; UserError naming s.where and the file when they cannot be
// read (the file changed or shrank since import checked it).
void read_stored_bytes(const StoredBytes& s, std::byte* out);
// The values of a tensor of `type` stored at s, into *bytes (resized): s's bytes as they are, or
// widened to float32 from s.file_dtype. UserError as read_stored_bytes.
void read_stored_tensor(const StoredBytes& s, const TensorType& type, std::vector<std::byte>* bytes);

// Bytes this process has read from stored tensors so far (every load adds its length): what
// tests compare with the parameters a device's chunks read.
int64_t stored_bytes_loaded();

// Set once a tensor's stored bytes are in its data; copied by value so that Tensor stays a
// copyable aggregate.
struct LoadedFlag {
  std::atomic<bool> set{false};
  LoadedFlag() = default;
  LoadedFlag(const LoadedFlag& o) : set(o.set.load(std::memory_order_acquire)) {}
  LoadedFlag& operator=(const LoadedFlag& o) {
    set.store(o.set.load(std::memory_order_acquire), std::memory_order_release);
    return *this;
  }
};

// Host data of an initializer or a constant attribute, row-major. An initializer import found in
// an external-data file keeps its bytes there (`stored`) and `data` empty until the first read:
// as<T>() and load() read them then, once, under a lock (devices of one process may build at
// the same time). Code that reads `data` directly calls load() first.
struct Tensor {
  TensorType type;
  std::vector<std::byte> data;
  std::shared_ptr<const StoredBytes> stored;  // null: data is all there is
  mutable LoadedFlag loaded;

  // Whether data holds the values (always, but for a stored tensor not read yet).
  bool resident() const { return !stored || loaded.set.load(std::memory_order_acquire); }
  void load() const {
    if (!resident()) load_stored();
  }
  // Makes data type.bytes() of zeros without reading the stored bytes: for a caller about to
  // write every one of them (a parameter another rank sends).
  void skip_load();
  template <class T>
  const T* as() const {
    load();
    return reinterpret_cast<const T*>(data.data());
  }
  template <class T>
  T* as() {
    load();
    return reinterpret_cast<T*>(data.data());
  }

 private:
  void load_stored() const;  // core/stored_bytes.cc
};

// A rank-0 tensor holding v (a loss scale, a dropout key).
template <class T>
Tensor scalar_tensor(T v) {
  Tensor t;
  t.type = TensorType{dtype_of<T>(), {}};
  t.data.resize(sizeof v);
  std::memcpy(t.data.data(), &v, sizeof v);
  return t;
}

// The values of an int64 or int32 tensor (shapes, axes, indices); nullopt for any other dtype.
std::optional<std::vector<int64_t>> int_values(const Tensor& t);

using ValueId = int32_t;
constexpr ValueId kNoValue = -1;  // an omitted optional input

struct Value {
  std::string name;
  TensorType type;
  int producer = -1;                    // node index, -1 for graph inputs and initializers
  std::vector<int> consumers;           // node indices, ascending; filled by rebuild_uses()
  std::shared_ptr<const Tensor> init;   // set for initializers and folded constants
  bool constant = false;                // data known at import, never trained (folded, Constant)
  bool is_initializer() const { return init != nullptr; }
  // A trainable parameter: a floating-point initializer the model file carried.
  bool is_parameter() const { return init != nullptr && !constant && is_floating(type.dtype); }
};

using AttrValue = std::variant<int64_t, float, std::string, std::vector<int64_t>,
                               std::vector<float>, std::vector<std::string>, Tensor>;

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;  // "" is the default ONNX domain
  std::vector<ValueId> inputs;   // kNoValue marks an omitted optional input
  std::vector<ValueId> outputs;
  std::map<std::string, AttrValue> attrs;

  bool has_attr(const std::string& key) const { return attrs.count(key) != 0; }
  int64_t attr_int(const std::string& key, int64_t fallback) const;
  float attr_float(const std::string& key, float fallback) const;
  std::string attr_string(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(const std::string& key) const;  // empty when absent
  // Name for messages: "node 'mm1' (MatMul)".
  std::string label() const;
  // Reshape, Flatten, Squeeze, Unsqueeze or Identity of the default domain: output 0 holds input
  // 0's bytes as they are, so no byte needs to move.
  bool is_view() const;
};

// The user's overrides of import's tie rules (config `parameters: {tied, untied}`).
struct ParameterChoices {
  std::vector<std::string> tied;    // initializer names or globs kept as the file has them
  std::vector<std::string> untied;  // initializer names or globs untied per module scope
  std::vector<std::string> trained;  // constants the exporter folded from parameters, trained as held
};

// What import did to the file's initializers to give back the module's parameters
// (onnx_import/module_params.h), for `pipetrain inspect`.
struct ParameterNote {
  std::string initializer;
  std::string action;  // e.g. "untied into a, b", "kept tied", "restored as zeros", "folded"
  std::string why;
};

// The module parameter an initializer holds, where its name is not the parameter's.
struct ModuleName {
  std::string parameter;
  bool transposed = false;  // the initializer holds the parameter's transpose
};

class Graph {
 public:
  std::string name;
  std::map<std::string, int64_t> opsets;  // domain -> version; "" is the ONNX domain
  int64_t ir_version = 8;
  int64_t source_opset = 0;  // the file's default opset, before import adapted it to opset()
  std::string producer_name;
  // Float initializers import keeps out of training (constant), each with the reason.
  std::map<std::string, std::string> buffers;
  std::vector<ParameterNote> parameter_notes;
  std::map<std::string, ModuleName> module_names;  // initializer -> module parameter
  // Initializer -> its dtype in the file (float16, bfloat16), where import widened it and the
  // graph's half values to float32 (onnx_import/widen_halves.h).
  std::map<std::string, DType> file_dtypes;
  // Bernoulli nodes the file itself holds, by name: they draw in every mode (run, training,
  // evaluation), where stochastic depth's mask (onnx_import/random_rewrite.h) draws only in
  // training (autodiff/training_mode.h).
  std::set<std::string> file_draws;

  std::vector<Value> values;
  std::vector<Node> nodes;          // topological order
  std::vector<ValueId> inputs;      // fed at run time (no initializers)
  std::vector<ValueId> outputs;
  std::vector<ValueId> initializers;

  int64_t opset() const;  // version of the default domain
  ValueId add_value(const std::string& value_name, const TensorType& type);
  ValueId add_initializer(const std::string& value_name, Tensor data, bool constant = false);
  // Shares data another graph holds (a parameter read by several stage graphs).
  ValueId add_initializer(const std::string& value_name, std::shared_ptr<const Tensor> data,
                          bool constant = false);
  int add_node(Node node);  // appends; call rebuild_uses() after a batch of edits
  ValueId find(const std::string& value_name) const;  // kNoValue if absent
  const Value& value(ValueId id) const { return values.at(static_cast<size_t>(id)); }
  Value& value(ValueId id) { return values.at(static_cast<size_t>(id)); }
  // Recomputes producer/consumers and the name index from nodes. O(nodes + values).
  void rebuild_uses();
  // Drops node i where gone[i] (a rewrite's replaced nodes; their values stay, read by no one),
  // keeping the others' order, then rebuild_uses().
  void remove_nodes(const std::vector<bool>& gone);
  // Total bytes of float initializers (the trainable parameters).
  int64_t parameter_bytes() const;
  int64_t parameter_count() const;
  // A view (Node::is_view), or a node that gives back its input as it is at these shapes: a
  // GlobalAveragePool whose input has a spatial extent of 1 (the mean of one element is that
  // element). Its output 0 holds input 0's bytes.
  bool moves_no_bytes(const Node& n) const;

 private:
  std::map<std::string, ValueId> by_name_;
};

// The graph as text, one line per input, node and output: for debugging and golden tests.
//   input x float32[2,3]
//   mm1 = MatMul(x, w) -> y float32[2,5]
std::string graph_text(const Graph& g);

// A standalone graph made of `nodes` (whose value ids refer to src), with the given inputs and
// outputs (ids in src). Values and initializers (data shared, not copied) come along as the nodes
// reference them; opsets, IR version and producer are src's.
Graph extract_subgraph(const Graph& src, const std::string& name, const std::vector<Node>& nodes,
                       const std::vector<ValueId>& inputs, const std::vector<ValueId>& outputs);

}  // namespace pt
