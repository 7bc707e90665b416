#include "onnx_import/import.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <set>

#include "core/error.h"
#include "onnx_import/buffers.h"
#include "onnx_import/cast_like.h"
#include "onnx_import/fold.h"
#include "onnx_import/attention_fusion.h"
#include "onnx_import/gather_rewrite.h"
#include "onnx_import/gelu_fusion.h"
#include "onnx_import/random_rewrite.h"
#include "onnx_import/infer.h"
#include "onnx_import/load.h"
#include "onnx_import/op_table.h"
#include "onnx_import/opset_adapt.h"
#include "onnx_import/proto_convert.h"
#include "onnx_import/sequence_fold.h"
#include "onnx_import/widen_halves.h"

namespace pt {
namespace {

void name_unnamed_nodes(onnx::GraphProto* g) {
  std::set<std::string> taken;
  for (const auto& n : g->node()) taken.insert(n.name());
  int counter = 0;
  for (auto& n : *g->mutable_node()) {
    if (!n.name().empty()) continue;
    std::string name;
    do name = n.op_type() + "_" + std::to_string(counter++);
    while (taken.count(name));
    taken.insert(name);
    n.set_name(name);
  }
}

// Graph inputs that are not initializers (models with IR version < 4 list both).
std::vector<onnx::ValueInfoProto*> runtime_inputs(onnx::GraphProto* g) {
  std::set<std::string> inits;
  for (const auto& t : g->initializer()) inits.insert(t.name());
  std::vector<onnx::ValueInfoProto*> out;
  for (auto& in : *g->mutable_input())
    if (!inits.count(in.name())) out.push_back(&in);
  return out;
}

// No tensor can pass 2^48 bytes (256 TiB, what 48-bit virtual addresses reach), so an input's
// bound shape is refused past that; below it, sizes summed by the memory plan cannot overflow.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 48;

void check_input_size(const onnx::ValueInfoProto& in, const std::string& path) {
  TensorType t{static_cast<DType>(in.type().tensor_type().elem_type()), {}};
  int64_t bytes = static_cast<int64_t>(dtype_size(t.dtype));
  bool over = false;
  for (const auto& d : in.type().tensor_type().shape().dim()) {
    t.shape.push_back(d.dim_value());
    over = over || __builtin_mul_overflow(bytes, d.dim_value(), &bytes);
  }
  if (over || bytes > kMaxTensorBytes)
    throw UserError(path + ": input '" + in.name() + "'",
                    "is " + t.str() + ", more than 2^48 bytes (256 TiB), which no machine holds",
                    "check the dims the model declares, or bind smaller ones with --dim (dims: in the config)");
}

void bind_dims(onnx::ModelProto* m, const ImportOptions& opts, const std::string& path) {
  for (onnx::ValueInfoProto* in : runtime_inputs(m->mutable_graph())) {
    if (!in->type().has_tensor_type() || !in->type().tensor_type().has_shape())
      throw UserError(path + ": input '" + in->name() + "'", "has no shape",
                      "export with named input shapes");
    auto* dims = in->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim();
    for (int axis = 0; axis < dims->size(); ++axis) {
      auto& d = (*dims)[axis];
      if (d.has_dim_value()) continue;
      const std::string sym = d.dim_param();
      auto it = opts.dims.find(sym);
      if (!sym.empty() && it != opts.dims.end()) {
        d.set_dim_value(it->second);
      } else if (axis == 0) {
        d.set_dim_value(opts.batch);
      } else {
        throw UserError(path + ": input '" + in->name() + "' axis " + std::to_string(axis),
                        "dimension '" + sym + "' is symbolic",
                        "bind it with --dim " + (sym.empty() ? std::string("NAME") : sym) +
                            "=VALUE (or dims: in the config)");
      }
    }
  }
  for (const onnx::ValueInfoProto* in : runtime_inputs(m->mutable_graph())) check_input_size(*in, path);
  // Outputs are re-inferred from the bound inputs.
  for (auto& out : *m->mutable_graph()->mutable_output())
    out.mutable_type()->mutable_tensor_type()->clear_shape();
}

// A weight holding NaN makes every output it reaches NaN (or, through Relu, silently 0): refused
// at import. Inf is left alone: masks hold -inf on purpose, and training stops at an inf loss.
void check_no_nan(const Tensor& t, const std::string& where) {
  const int64_t n = t.type.numel();
  int64_t first = -1;
  if (t.type.dtype == DType::kFloat32)
    first = std::find_if(t.as<float>(), t.as<float>() + n, [](float x) { return std::isnan(x); }) - t.as<float>();
  else if (t.type.dtype == DType::kFloat64)
    first = std::find_if(t.as<double>(), t.as<double>() + n, [](double x) { return std::isnan(x); }) - t.as<double>();
  if (first < 0 || first == n) return;
  throw UserError(where, "holds NaN (element " + std::to_string(first) + " of " + t.type.str() + ")",
                  "export the model again from finite weights");
}

// Everything known about each tensor name: its type (when concrete) and constant data.
struct Known {
  std::map<std::string, TensorType> types;
  std::map<std::string, Tensor> constants;        // folded, non-parameter initializers

  // The graph's inputs (dims bound) and initializers; every other type is inferred.
  void read(const onnx::GraphProto& g) {
    for (const auto& v : g.input()) {
      TensorType t;
      if (concrete_type(v, &t)) types[v.name()] = t;
    }
    for (const auto& t : g.initializer()) {
      TensorType tt{static_cast<DType>(t.data_type()), {t.dims().begin(), t.dims().end()}};
      types[t.name()] = tt;
    }
  }
};

// Constant inputs of node n, or false when one is not known. Shape needs only its input's type.
bool constant_inputs(const onnx::NodeProto& n, Known& known, std::vector<Tensor>* storage,
                     std::vector<const Tensor*>* inputs) {
  storage->clear();
  storage->reserve(static_cast<size_t>(n.input_size()));
  inputs->clear();
  for (const std::string& name : n.input()) {
    if (name.empty()) {
      inputs->push_back(nullptr);
      continue;
    }
    auto c = known.constants.find(name);
    if (c != known.constants.end()) {
      inputs->push_back(&c->second);
      continue;
    }
    auto t = known.types.find(name);
    if ((n.op_type() == "Shape" || n.op_type() == "Size") && t != known.types.end()) {
      // Their folders read only the type: a tensor of that type and no data stands in (the
      // input may be far too large to build).
      Tensor stand_in;
      stand_in.type = t->second;
      storage->push_back(std::move(stand_in));
      inputs->push_back(&storage->back());
      continue;
    }
    return false;
  }
  return true;
}

Node node_shell(const onnx::NodeProto& n, const std::string& where) {
  Node node;
  node.name = n.name();
  node.op_type = n.op_type();
  // Ops newer than the canonical opset went through the onnx library in their own domain.
  node.domain = n.domain() == kNewerOpsDomain ? "" : n.domain();
  for (const auto& a : n.attribute()) node.attrs[a.name()] = attr_from_proto(a, where);
  node.outputs.assign(static_cast<size_t>(n.output_size()), kNoValue);
  node.inputs.assign(static_cast<size_t>(n.input_size()), kNoValue);
  return node;
}

// One pass over the nodes: folds every node whose inputs are constant. Returns how many.
int fold_pass(onnx::ModelProto* m, Known& known, const std::string& path) {
  auto* g = m->mutable_graph();
  const int64_t opset = default_opset(*m);
  std::set<std::string> graph_outputs;
  for (const auto& o : g->output()) graph_outputs.insert(o.name());
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  int folded = 0;
  std::vector<Tensor> storage;
  std::vector<const Tensor*> inputs;
  for (auto& n : *g->mutable_node()) {
    bool is_output = false;
    for (const auto& o : n.output()) is_output = is_output || graph_outputs.count(o);
    std::optional<std::vector<Tensor>> out;
    // A graph output stays computed: folded, it is an Identity of its value (and that stays).
    const bool kept_identity = is_output && n.op_type() == "Identity";
    if (!kept_identity && n.op_type() != "Dropout" && constant_inputs(n, known, &storage, &inputs))
      out = evaluate_constant(node_shell(n, node_where(path, n, opset)), inputs, opset);
    if (!out) {
      *kept.Add() = std::move(n);
      continue;
    }
    for (int i = 0; i < n.output_size(); ++i) {
      if (n.output(i).empty()) continue;
      const std::string value = graph_outputs.count(n.output(i)) ? n.output(i) + "/constant" : n.output(i);
      tensor_to_proto((*out)[static_cast<size_t>(i)], value, g->add_initializer());
      known.types[value] = (*out)[static_cast<size_t>(i)].type;
      known.constants[value] = std::move((*out)[static_cast<size_t>(i)]);
      if (value == n.output(i)) continue;
      onnx::NodeProto& identity = *kept.Add();
      identity.set_name(n.name() + "/output_" + std::to_string(i));
      identity.set_op_type("Identity");
      identity.add_input(value);
      identity.add_output(n.output(i));
    }
    ++folded;
  }
  g->mutable_node()->Swap(&kept);
  return folded;
}

// Initializers no node reads any more (folded subgraphs leave them behind).
void drop_unused_initializers(onnx::GraphProto* g) {
  const std::set<std::string> used = names_read(*g);
  google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
  for (auto& t : *g->mutable_initializer())
    if (used.count(t.name())) *kept.Add() = std::move(t);
  g->mutable_initializer()->Swap(&kept);
}

// One pass of pipetrain's own inference (onnx_import/infer.h) over the nodes in order: types
// every output whose node's inputs are typed (and whose shape inputs are constant).
void infer_pass(const onnx::GraphProto& g, Known& known, const std::string& path, int64_t opset) {
  std::vector<const TensorType*> types;
  std::vector<const Tensor*> constants;
  for (const auto& n : g.node()) {
    bool done = true;
    for (const auto& o : n.output()) done = done && (o.empty() || known.types.count(o));
    if (done) continue;
    types.clear();
    constants.clear();
    for (const std::string& name : n.input()) {
      auto t = name.empty() ? known.types.end() : known.types.find(name);
      types.push_back(t == known.types.end() ? nullptr : &t->second);
      auto c = name.empty() ? known.constants.end() : known.constants.find(name);
      constants.push_back(c == known.constants.end() ? nullptr : &c->second);
    }
    const std::string where = node_where(path, n, opset);
    const std::optional<std::vector<TensorType>> out = infer_types(node_shell(n, where), types, constants, where);
    if (!out) continue;
    for (int k = 0; k < n.output_size(); ++k)
      if (!n.output(k).empty() && (*out)[static_cast<size_t>(k)].dtype != DType::kUndefined)
        known.types[n.output(k)] = (*out)[static_cast<size_t>(k)];
  }
}

void check_folded(const onnx::GraphProto& g, const std::string& path, int64_t opset) {
  for (const auto& n : g.node()) {
    const OpEntry* e = find_op(n.domain(), n.op_type());
    if (e && e->support == OpSupport::kFoldOnly)
      throw UserError(node_where(path, n, opset),
                      "op " + n.op_type() + " is supported only on constant inputs, and these "
                      "are computed at run time",
                      "compute it in the exporting script, or bind more dims with --dim");
    if (e && e->support == OpSupport::kRewritten && n.op_type() == "CastLike")  // cast_like.h
      throw UserError(node_where(path, n, opset),
                      "op CastLike is supported once the dtype of its second input is known, and "
                      "it is not",
                      "export with the dtype of every tensor stated, or use Cast");
    if (e && e->support == OpSupport::kRewritten)  // what opset_adapt and gather_rewrite leave
      throw UserError(node_where(path, n, opset),
                      "op " + n.op_type() + " is supported with constant indices (rewritten as Gather), "
                      "and these are computed at run time",
                      "compute the indices in the exporting script, or bind more dims with --dim");
  }
}

// The float initializers the torch.export-based exporter's optimizer computed from no module
// parameter or buffer (a ones matrix a causal mask is cut from, folded from the attention's
// shapes): constants, which folding may compute with. Each is unmarked in the graph signature, a
// buffer by find_buffers (no weight or bias input reads it), and the record of what it was folded
// from names no declared parameter. Empty for a file that declares no parameters.
std::set<std::string> exporter_constants(const onnx::GraphProto& g, const std::set<std::string>& declared) {
  std::set<std::string> out;
  if (declared.empty()) return out;
  std::map<std::string, std::map<std::string, std::string>> props;
  for (const auto& v : g.input()) props[v.name()] = metadata_props(v);
  for (const auto& v : g.value_info()) props[v.name()] = metadata_props(v);
  const std::map<std::string, std::string> buffers = find_buffers(g, declared);
  for (const auto& t : g.initializer()) {
    if (!is_floating(static_cast<DType>(t.data_type())) || !buffers.count(t.name())) continue;
    const auto& p = props[t.name()];
    if (p.count("pkg.torch.export.graph_signature.InputSpec.kind")) continue;  // a module buffer
    auto from = p.find("pkg.onnxscript.optimizer.folded_from");
    const bool from_parameter =
        from != p.end() && std::any_of(declared.begin(), declared.end(), [&](const std::string& d) {
          return from->second.find("'" + d + "'") != std::string::npos;
        });
    if (!from_parameter) out.insert(t.name());
  }
  return out;
}

// The module parameters the file declares (torch.export-based exports mark each one); empty when
// it declares none.
std::set<std::string> declared_parameters(const onnx::GraphProto& g) {
  std::set<std::string> out;
  auto take = [&](const onnx::ValueInfoProto& vi) {
    const auto props = metadata_props(vi);
    auto it = props.find("pkg.torch.export.graph_signature.InputSpec.kind");
    if (it != props.end() && it->second == "PARAMETER") out.insert(vi.name());
  };
  for (const auto& v : g.input()) take(v);
  for (const auto& v : g.value_info()) take(v);
  return out;
}

Graph convert(const onnx::ModelProto& m, const Known& known, const std::set<std::string>& declared,
              int64_t source_opset, const std::string& path) {
  const auto& g = m.graph();
  const int64_t opset = default_opset(m);
  Graph graph;
  graph.name = g.name();
  graph.ir_version = m.ir_version();
  graph.producer_name = m.producer_name();
  graph.source_opset = source_opset;
  for (const auto& o : m.opset_import())
    if (o.domain() != kNewerOpsDomain) graph.opsets[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();

  const std::map<std::string, std::string> buffers = find_buffers(g, declared);
  std::set<std::string> init_names;
  for (const auto& t : g.initializer()) {
    init_names.insert(t.name());
    bool constant = known.constants.count(t.name()) != 0;
    if (auto b = buffers.find(t.name()); !constant && b != buffers.end()) {
      constant = true;
      graph.buffers[t.name()] = b->second;
    }
    // A parameter in an external-data file stays there until a device reads it (its NaN check
    // then, Tensor::load); the rest is read now.
    const std::string where = path + ": initializer '" + t.name() + "'";
    Tensor value = constant ? tensor_from_proto(t, path) : stored_tensor(t, where);
    if (!constant && value.resident()) check_no_nan(value, where);
    graph.add_initializer(t.name(), std::move(value), constant);
  }
  for (const auto& in : g.input()) {
    if (init_names.count(in.name())) continue;
    const auto t = known.types.find(in.name());
    if (t == known.types.end())
      throw UserError(path + ": input '" + in.name() + "'", "has no tensor type pipetrain can read",
                      "export the model again, with a float, integer or bool tensor for each input");
    graph.inputs.push_back(graph.add_value(in.name(), t->second));
  }
  for (const auto& n : g.node()) {
    const std::string where = node_where(path, n, opset);
    Node node = node_shell(n, where);
    for (int i = 0; i < n.input_size(); ++i) {
      if (n.input(i).empty()) continue;
      ValueId v = graph.find(n.input(i));
      PT_CHECK(v != kNoValue, "input " + n.input(i) + " of " + n.name() + " not defined");
      node.inputs[static_cast<size_t>(i)] = v;
    }
    for (int i = 0; i < n.output_size(); ++i) {
      if (n.output(i).empty()) continue;
      auto t = known.types.find(n.output(i));
      if (t == known.types.end())
        throw UserError(where, "the shape of output '" + n.output(i) + "' cannot be inferred",
                        "bind every symbolic dimension with --dim, or export with static shapes");
      node.outputs[static_cast<size_t>(i)] = graph.add_value(n.output(i), t->second);
    }
    graph.add_node(std::move(node));
  }
  for (const auto& o : g.output()) {
    const ValueId v = graph.find(o.name());
    if (v == kNoValue)
      throw UserError(path + ": graph output '" + o.name() + "'",
                      "is written by no node and is no input or initializer", "export the model again");
    graph.outputs.push_back(v);
  }
  graph.rebuild_uses();
  return graph;
}

}  // namespace

Graph import_model(const std::string& path, const ImportOptions& opts) {
  if (opts.batch < 1)
    throw UserError("micro-batch", "must be at least 1, got " + std::to_string(opts.batch), "");
  int64_t source_opset = 0;
  ModuleParameters restored;
  onnx::ModelProto m = load_model(path, &source_opset, &opts.parameters, &restored, &opts.given_inputs);
  const std::map<std::string, DType> file_dtypes = widen_half_floats(&m);
  std::set<std::string> declared = declared_parameters(m.graph());
  if (!declared.empty()) declared.insert(restored.parameters.begin(), restored.parameters.end());
  for (const std::string& w : restored.warnings) std::cerr << "warning: " << path << ": " << w << "\n";
  name_unnamed_nodes(m.mutable_graph());
  std::set<std::string> file_draws;
  for (const auto& n : m.graph().node())
    if (n.op_type() == "Bernoulli" && (n.domain().empty() || n.domain() == "ai.onnx")) file_draws.insert(n.name());
  bind_dims(&m, opts, path);
  Known known;
  const std::set<std::string> constants = exporter_constants(m.graph(), declared);
  for (const auto& t : m.graph().initializer())
    if (!is_floating(static_cast<DType>(t.data_type())) || constants.count(t.name()))
      known.constants[t.name()] = tensor_from_proto(t, path);
  m.mutable_graph()->clear_value_info();  // stale: every type is inferred from the bound inputs
  known.read(m.graph());
  // Until nothing changes: a round makes the shapes one more stretch of the graph known, so a
  // deep model needs rounds in proportion to its layers (a SplitToSequence per attention layer
  // folds once its input's shape is known). The bound only stops a rewrite that would not end.
  const int rounds = 32 + m.graph().node_size();
  for (int round = 0; round < rounds; ++round) {
    infer_pass(m.graph(), known, path, default_opset(m));
    const int folded = fold_pass(&m, known, path);
    if (folded + rewrite_constant_gathers(m.mutable_graph(), &known.types, &known.constants, path) +
            rewrite_uniform_draws(m.mutable_graph(), &known.types, &known.constants, path) +
            fold_sequences(m.mutable_graph(), &known.types, &known.constants, path, default_opset(m)) +
            cast_like_to_cast(m.mutable_graph(), known.types) == 0)
      break;
  }
  drop_unused_initializers(m.mutable_graph());
  check_uniform_draws_rewritten(m.graph(), path, default_opset(m));
  check_sequences_folded(m.graph(), path, default_opset(m));
  check_folded(m.graph(), path, default_opset(m));
  Graph g = convert(m, known, declared, source_opset, path);
  fuse_gelu(g);
  if (opts.fuse_attention) fuse_attention(g, opts.fuse_attention_from);
  g.parameter_notes = std::move(restored.notes);
  g.module_names = std::move(restored.module_names);
  g.file_draws = std::move(file_draws);
  for (const auto& [name, dtype] : file_dtypes)
    if (const ValueId v = g.find(name); v != kNoValue && g.value(v).is_initializer()) g.file_dtypes[name] = dtype;
  return g;
}

}  // namespace pt
