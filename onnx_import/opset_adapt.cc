#include "onnx_import/opset_adapt.h"

#include <google/protobuf/unknown_field_set.h>

#include <map>
#include <optional>
#include <set>
#include <vector>

#include "core/error.h"
#include "onnx_import/fold.h"
#include "onnx_import/fused_ops.h"
#include "onnx_import/load.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

// The last TensorProto data type the onnx library here (1.12, IR 8) knows: BFLOAT16. Later ones
// (float8 x4 = 17..20, uint4/int4 = 21/22, float4 = 23, ...) came with IR 9 and later.
constexpr int kLastKnownDtype = onnx::TensorProto::BFLOAT16;

// What one node's rewrite can see: the model's constants (initializers, Constant outputs and
// small index values computed from them) and the ranks and shapes its value infos state.
class ModelFacts {
 public:
  ModelFacts(const onnx::GraphProto& g, int64_t opset, std::string path) : path_(std::move(path)) {
    for (const auto& t : g.initializer()) constants_[t.name()] = &t;
    for (const auto& n : g.node())
      if (n.op_type() == "Constant" && n.domain().empty() && n.output_size() == 1)
        for (const auto& a : n.attribute()) {
          if (a.name() == "value" && a.has_t()) constants_[n.output(0)] = &a.t();
          if (a.name() == "value_ints") const_ints_[n.output(0)] = {a.ints().begin(), a.ints().end()};
          if (a.name() == "value_int") const_ints_[n.output(0)] = {a.i()};
          if (a.name() == "value_ints" || a.name() == "value_int")
            folded_[n.output(0)] = int64_tensor(const_ints_[n.output(0)], a.name() == "value_ints");
        }
    auto take = [&](const onnx::ValueInfoProto& vi) {
      if (vi.type().has_tensor_type() && vi.type().tensor_type().elem_type() != 0)
        dtypes_[vi.name()] = vi.type().tensor_type().elem_type();
      if (!vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
      std::vector<int64_t> dims;
      for (const auto& d : vi.type().tensor_type().shape().dim())
        dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
      shapes_[vi.name()] = dims;
    };
    for (const auto& v : g.input()) take(v);
    for (const auto& v : g.value_info()) take(v);
    for (const auto& v : g.output()) take(v);
    for (const auto& t : g.initializer()) {
      shapes_[t.name()] = {t.dims().begin(), t.dims().end()};
      dtypes_[t.name()] = t.data_type();
    }
    fold_small_constants(g, opset);
  }

  // The int64/int32 values of a constant tensor; nullopt when `name` is not a constant.
  std::optional<std::vector<int64_t>> ints(const std::string& name, const std::string& where) const {
    if (auto c = const_ints_.find(name); c != const_ints_.end()) return c->second;
    if (auto f = folded_.find(name); f != folded_.end()) return int_values(f->second);
    auto it = constants_.find(name);
    if (it == constants_.end()) return std::nullopt;
    return int_values(tensor_from_proto(*it->second, where));
  }

  // The element type a value info or initializer states; 0 when none does.
  int dtype(const std::string& name) const {
    auto it = dtypes_.find(name);
    return it == dtypes_.end() ? 0 : it->second;
  }

  // The shape a value info states (unknown dims -1); nullopt when none states its rank.
  std::optional<std::vector<int64_t>> shape(const std::string& name) const {
    auto it = shapes_.find(name);
    if (it == shapes_.end()) return std::nullopt;
    return it->second;
  }

 private:
  // Values computed from constants by the small index ops exports write without their optimizer
  // (optimize=False: axes = Reshape(Constant, Constant), Concat of Constants, ...), so that an
  // opset-18 input such as ReduceMean's axes reads as constant here. Each node is evaluated
  // once, in graph order, only when every input is known and they hold few elements.
  void fold_small_constants(const onnx::GraphProto& g, int64_t opset) {
    static const std::set<std::string> kOps = {"Reshape", "Concat", "Cast", "Unsqueeze", "Squeeze",
                                               "Identity", "Gather", "Slice", "Add", "Sub", "Mul", "Neg"};
    constexpr int64_t kMaxElements = 1024;
    for (const auto& n : g.node()) {
      if (!n.domain().empty() || !kOps.count(n.op_type()) || n.output_size() != 1) continue;
      std::vector<Tensor> values;
      values.reserve(static_cast<size_t>(n.input_size()));
      std::vector<const Tensor*> inputs;
      bool known = true;
      for (const std::string& in : n.input()) {
        std::optional<Tensor> v = in.empty() ? std::nullopt : value(in, kMaxElements);
        // Index arithmetic only: no work on float initializers (small parameters).
        if (!in.empty() && (!v || (is_floating(v->type.dtype) && n.op_type() != "Cast"))) known = false;
        if (!known) break;
        if (v) values.push_back(std::move(*v));
        inputs.push_back(v ? &values.back() : nullptr);
      }
      if (!known) continue;
      Node node;
      node.name = n.name();
      node.op_type = n.op_type();
      node.inputs.assign(inputs.size(), kNoValue);
      node.outputs.assign(1, kNoValue);
      try {
        for (const auto& a : n.attribute()) node.attrs[a.name()] = attr_from_proto(a, n.name());
        std::optional<std::vector<Tensor>> out = evaluate_constant(node, inputs, opset);
        if (out) folded_[n.output(0)] = std::move(out->front());
      } catch (const UserError&) {
        // An attribute or input left to import, which names the file and node in the same error.
      }
    }
  }

  // A constant's value (an initializer, a Constant node's or one folded above) of at most
  // max_elements elements; nullopt for any other.
  std::optional<Tensor> value(const std::string& name, int64_t max_elements) const {
    if (auto f = folded_.find(name); f != folded_.end())
      return f->second.type.numel() <= max_elements ? std::optional<Tensor>(f->second) : std::nullopt;
    auto it = constants_.find(name);
    if (it == constants_.end()) return std::nullopt;
    int64_t elements = 1;  // a negative or overflowing count is no small constant either
    for (int64_t d : it->second->dims())
      if (d < 0 || __builtin_mul_overflow(elements, d, &elements) || elements > max_elements) return std::nullopt;
    return tensor_from_proto(*it->second, path_ + ": initializer '" + name + "'");
  }

  static Tensor int64_tensor(const std::vector<int64_t>& v, bool vector) {
    Tensor t;
    t.type = TensorType{DType::kInt64, vector ? std::vector<int64_t>{static_cast<int64_t>(v.size())}
                                              : std::vector<int64_t>{}};
    t.data.resize(v.size() * sizeof(int64_t));
    std::copy(v.begin(), v.end(), t.as<int64_t>());
    return t;
  }

  std::string path_;  // the model file, for errors
  std::map<std::string, const onnx::TensorProto*> constants_;
  std::map<std::string, std::vector<int64_t>> const_ints_;  // Constant value_ints / value_int
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, int> dtypes_;
  std::map<std::string, Tensor> folded_;
};

const onnx::AttributeProto* find_attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

void remove_attr(onnx::NodeProto* n, const std::string& name) {
  auto* attrs = n->mutable_attribute();
  for (int i = attrs->size(); i-- > 0;)
    if ((*attrs)[i].name() == name) attrs->DeleteSubrange(i, 1);
}

void set_ints_attr(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
  remove_attr(n, name);
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

// Drops trailing empty input names, as a node with fewer inputs is written.
void trim_inputs(onnx::NodeProto* n) {
  while (n->input_size() > 0 && n->input(n->input_size() - 1).empty()) n->mutable_input()->RemoveLast();
}

bool has_input(const onnx::NodeProto& n, int i) { return n.input_size() > i && !n.input(i).empty(); }

// An int64 initializer added for a rewritten node; its name is derived from the node's.
std::string add_ints_initializer(onnx::GraphProto* g, const std::string& name,
                                 const std::vector<int64_t>& v) {
  Tensor t;
  t.type = TensorType{DType::kInt64, {static_cast<int64_t>(v.size())}};
  t.data.resize(v.size() * sizeof(int64_t));
  std::copy(v.begin(), v.end(), t.as<int64_t>());
  tensor_to_proto(t, name, g->add_initializer());
  return name;
}

class Adapter {
 public:
  Adapter(onnx::ModelProto* m, const std::string& path)
      : m_(m), path_(path), opset_(default_opset(*m)), facts_(m->graph(), opset_, path) {}

  void run() {
    check_dtypes();
    auto* g = m_->mutable_graph();
    bool newer_ops = false;
    std::vector<onnx::NodeProto> nodes;
    for (int i = 0; i < g->node_size(); ++i) {
      onnx::NodeProto* n = g->mutable_node(i);
      if (!n->domain().empty() && n->domain() != "ai.onnx") {
        nodes.push_back(std::move(*n));
        continue;
      }
      where_ = node_where(path_, *n, opset_);
      if (decompose_fused(*n, fused_facts(), g, &nodes)) continue;
      adapt_node(n);
      newer_ops = newer_ops || n->domain() == kNewerOpsDomain;
      nodes.push_back(std::move(*n));
    }
    g->clear_node();
    for (auto& n : nodes) *g->add_node() = std::move(n);
    for (auto& o : *m_->mutable_opset_import())
      if (o.domain().empty() || o.domain() == "ai.onnx") o.set_version(kCanonicalOpset);
    if (newer_ops) {
      auto* o = m_->add_opset_import();
      o->set_domain(kNewerOpsDomain);
      o->set_version(1);
    }
  }

 private:
  FusedFacts fused_facts() const {
    return {where_, [this](const std::string& v) { return facts_.shape(v); },
            [this](const std::string& v) { return facts_.dtype(v); }};
  }

  [[noreturn]] void refuse(const std::string& what, const std::string& todo) const {
    throw UserError(where_, what, todo);
  }

  void adapt_node(onnx::NodeProto* n) {
    const std::string& op = n->op_type();
    if (op == "ReduceMean" || op == "ReduceMax" || op == "ReduceMin" || op == "ReduceProd") {
      if (opset_ >= 18) axes_input_to_attribute(n);
    } else if (op == "Split") {
      if (opset_ >= 18) split_num_outputs(n);
    } else if (op == "Pad") {
      pad_mode_and_axes(n);
    } else if (op == "AveragePool") {
      if (const auto* d = find_attr(*n, "dilations")) {
        for (int64_t x : d->ints())
          if (x != 1) refuse("dilations other than 1 are not supported", "export without dilated pooling");
        remove_attr(n, "dilations");
      }
    } else if (op == "Cast" || op == "CastLike") {
      // Both only concern float8/float4 targets, which check_dtypes has refused already.
      remove_attr(n, "saturate");
      remove_attr(n, "round_mode");
    } else if (op == "Range") {
      remove_attr(n, "stash_type");  // float16/bfloat16 only
    } else if (op == "Gelu") {
      n->set_domain(kNewerOpsDomain);
    }
  }

  // Reduce*-18: axes as an optional input (constant here) -> the opset-13 attribute.
  void axes_input_to_attribute(onnx::NodeProto* n) {
    const auto* noop = find_attr(*n, "noop_with_empty_axes");
    const bool noop_if_empty = noop && noop->i() != 0;
    std::vector<int64_t> axes;
    if (has_input(*n, 1)) {
      auto v = facts_.ints(n->input(1), where_);
      if (!v)
        refuse("its axes are computed at run time", "export with constant reduction axes");
      axes = *v;
    }
    remove_attr(n, "noop_with_empty_axes");
    if (n->input_size() > 1) n->mutable_input()->DeleteSubrange(1, n->input_size() - 1);
    if (axes.empty() && noop_if_empty) {
      n->set_op_type("Identity");
      n->clear_attribute();
      return;
    }
    if (!axes.empty()) set_ints_attr(n, "axes", axes);
  }

  // Split-18 with num_outputs: equal parts, the last smaller when the axis does not divide.
  void split_num_outputs(onnx::NodeProto* n) {
    const auto* num = find_attr(*n, "num_outputs");
    if (!num) return;
    const int64_t parts = num->i();
    remove_attr(n, "num_outputs");
    if (has_input(*n, 1)) return;
    if (parts != n->output_size())
      refuse("num_outputs " + std::to_string(parts) + " differs from its " +
                 std::to_string(n->output_size()) + " outputs",
             "export the model again; the file does not follow the ONNX spec");
    const auto* axis_attr = find_attr(*n, "axis");
    const int64_t axis = axis_attr ? axis_attr->i() : 0;
    auto shape = facts_.shape(n->input(0));
    if (!shape) return;  // equal parts: the opset-13 form without sizes, checked by inference
    const int64_t rank = static_cast<int64_t>(shape->size());
    const int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank || (*shape)[a] < 0) return;
    const int64_t dim = (*shape)[a], size = (dim + parts - 1) / parts;
    if (dim % parts == 0) return;
    std::vector<int64_t> sizes;
    for (int64_t p = 0, left = dim; p < parts; ++p, left -= size) sizes.push_back(std::min(size, left));
    while (n->input_size() < 2) n->add_input();
    n->set_input(1, add_ints_initializer(m_->mutable_graph(), n->name() + "/split_sizes", sizes));
  }

  // Pad-19 mode 'wrap' has no opset-17 form; Pad-18's axes input expands to pads over all axes.
  void pad_mode_and_axes(onnx::NodeProto* n) {
    if (const auto* mode = find_attr(*n, "mode"); mode && mode->s() == "wrap")
      refuse("mode 'wrap' is not supported (constant, reflect and edge are)",
             "pad in another mode, or before export");
    if (!has_input(*n, 3)) {
      if (n->input_size() > 3) n->mutable_input()->DeleteSubrange(3, n->input_size() - 3);
      trim_inputs(n);
      return;
    }
    auto axes = facts_.ints(n->input(3), where_);
    auto pads = has_input(*n, 1) ? facts_.ints(n->input(1), where_) : std::nullopt;
    auto shape = facts_.shape(n->input(0));
    if (!axes || !pads)
      refuse("its pads or axes are computed at run time", "export with constant padding");
    if (!shape)
      refuse("the rank of its input is not stated in the model", "export with shape information");
    const int64_t rank = static_cast<int64_t>(shape->size()), k = static_cast<int64_t>(axes->size());
    if (static_cast<int64_t>(pads->size()) != 2 * k)
      refuse("has " + std::to_string(pads->size()) + " pads for " + std::to_string(k) + " axes",
             "export the model again; the file does not follow the ONNX spec");
    std::vector<int64_t> full(static_cast<size_t>(2 * rank), 0);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t a = (*axes)[i] < 0 ? (*axes)[i] + rank : (*axes)[i];
      if (a < 0 || a >= rank)
        refuse("axis " + std::to_string((*axes)[i]) + " is out of range for rank " + std::to_string(rank),
               "export the model again; the file does not follow the ONNX spec");
      full[a] = (*pads)[i];
      full[a + rank] = (*pads)[i + k];
    }
    n->set_input(1, add_ints_initializer(m_->mutable_graph(), n->name() + "/pads", full));
    n->mutable_input()->DeleteSubrange(3, n->input_size() - 3);
    trim_inputs(n);
  }

  // Tensors of a dtype newer than the canonical opset (float8, int4, float4, ...).
  void check_dtypes() {
    const auto& g = m_->graph();
    auto check = [&](int dtype, const std::string& what) {
      if (dtype <= kLastKnownDtype) return;
      throw UserError(path_ + ": " + what,
                      "has data type " + std::to_string(dtype) +
                          " (float8, 4-bit or newer), which pipetrain does not take",
                      "export in float32 (or float16/bfloat16), without quantization");
    };
    for (const auto& t : g.initializer()) check(t.data_type(), "initializer '" + t.name() + "'");
    for (const auto& v : g.input())
      if (v.type().has_tensor_type()) check(v.type().tensor_type().elem_type(), "input '" + v.name() + "'");
    for (const auto& v : g.output())
      if (v.type().has_tensor_type()) check(v.type().tensor_type().elem_type(), "output '" + v.name() + "'");
    for (const auto& n : g.node()) {
      const std::string where = "node '" + n.name() + "' (" + n.op_type() + ", opset " +
                                std::to_string(opset_) + ")";
      for (const auto& a : n.attribute()) {
        if (a.has_t()) check(a.t().data_type(), where);
        if (a.name() == "to" && (n.op_type() == "Cast")) check(static_cast<int>(a.i()), where);
      }
    }
  }

  onnx::ModelProto* m_;
  std::string path_;
  int64_t opset_;
  ModelFacts facts_;
  std::string where_;
};

}  // namespace

void adapt_to_canonical_opset(onnx::ModelProto* m, const std::string& path) {
  Adapter(m, path).run();
}

namespace {

// A repeated StringStringEntryProto field this onnx library predates, read from the unknown fields.
std::map<std::string, std::string> unknown_metadata(const google::protobuf::Message& m, int field) {
  std::map<std::string, std::string> out;
  const google::protobuf::UnknownFieldSet& fields = m.GetReflection()->GetUnknownFields(m);
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.number() != field || f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    onnx::StringStringEntryProto entry;
    if (entry.ParseFromString(f.length_delimited())) out[entry.key()] = entry.value();
  }
  return out;
}

}  // namespace

std::map<std::string, std::string> metadata_props(const onnx::ValueInfoProto& vi) {
  return unknown_metadata(vi, 4);  // ValueInfoProto.metadata_props in onnx.proto (IR 10)
}

std::map<std::string, std::string> metadata_props(const onnx::NodeProto& n) {
  return unknown_metadata(n, 9);  // NodeProto.metadata_props in onnx.proto (IR 10)
}

std::map<std::string, std::string> metadata_props(const onnx::GraphProto& g) {
  return unknown_metadata(g, 16);  // GraphProto.metadata_props in onnx.proto (IR 10)
}

NewerOpsHidden::NewerOpsHidden(onnx::GraphProto* g) : g_(g) {
  for (int i = 0; i < g->node_size(); ++i) {
    onnx::NodeProto* n = g->mutable_node(i);
    if (n->domain() != kNewerOpsDomain) continue;
    hidden_.emplace_back(i, *n);
    n->set_op_type("Identity");
    n->set_domain("");
    n->clear_attribute();
    if (n->input_size() > 1) n->mutable_input()->DeleteSubrange(1, n->input_size() - 1);
  }
}

NewerOpsHidden::~NewerOpsHidden() {
  for (auto& [i, node] : hidden_) *g_->mutable_node(i) = std::move(node);
}

}  // namespace pt
