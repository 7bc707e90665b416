#include "onnx_import/sequence_fold.h"

#include <optional>
#include <set>
#include <vector>

#include "core/error.h"
#include "onnx_import/load.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

using Dims = std::vector<int64_t>;

bool is_sequence_op(const onnx::NodeProto& n) {
  static const std::set<std::string> kOps = {"SplitToSequence", "SequenceConstruct", "SequenceAt",
                                             "ConcatFromSequence", "SequenceLength"};
  return (n.domain().empty() || n.domain() == "ai.onnx") && kOps.count(n.op_type());
}

int64_t attr_int(const onnx::NodeProto& n, const std::string& name, int64_t fallback) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return fallback;
}

onnx::NodeProto make_node(const std::string& op, const std::string& name,
                          const std::vector<std::string>& in, const std::vector<std::string>& out) {
  onnx::NodeProto p;
  p.set_op_type(op);
  p.set_name(name);
  for (const std::string& i : in) p.add_input(i);
  for (const std::string& o : out) p.add_output(o);
  return p;
}

void set_int_attr(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

// One sequence that folds: the names of its parts, and for a SplitToSequence how they are cut.
struct Sequence {
  std::vector<std::string> parts;
  Dims sizes;            // SplitToSequence: the length of each part along axis
  int64_t axis = 0;
  bool squeeze = false;  // split omitted and keepdims = 0: each part loses the axis
};

class SequenceFolder {
 public:
  SequenceFolder(onnx::GraphProto* g, std::map<std::string, TensorType>* types,
                 std::map<std::string, Tensor>* constants, const std::string& path, int64_t opset)
      : g_(g), types_(types), constants_(constants), path_(path), opset_(opset) {}

  int run() {
    for (const auto& n : g_->node()) {
      if (n.op_type() == "SplitToSequence" && is_sequence_op(n)) {
        if (auto s = split_parts(n)) sequences_[n.output(0)] = *s;
      } else if (n.op_type() == "SequenceConstruct" && is_sequence_op(n)) {
        Sequence s;
        s.parts.assign(n.input().begin(), n.input().end());
        sequences_[n.output(0)] = s;
      }
    }
    drop_sequences_with_unknown_readers();
    if (sequences_.empty()) return 0;
    const int folded = static_cast<int>(sequences_.size());
    google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
    for (auto& n : *g_->mutable_node()) rewrite(n, &kept);
    g_->mutable_node()->Swap(&kept);
    return folded;
  }

 private:
  std::string where(const onnx::NodeProto& n) const { return node_where(path_, n, opset_); }

  const Tensor* constant(const onnx::NodeProto& n, int i) const {
    if (n.input_size() <= i || n.input(i).empty()) return nullptr;
    auto it = constants_->find(n.input(i));
    return it == constants_->end() ? nullptr : &it->second;
  }

  // The parts of SplitToSequence(X, split): nullopt while X's shape or split is not known.
  std::optional<Sequence> split_parts(const onnx::NodeProto& n) const {
    auto t = types_->find(n.input(0));
    if (t == types_->end()) return std::nullopt;
    const Dims& shape = t->second.shape;
    const int64_t rank = static_cast<int64_t>(shape.size());
    Sequence s;
    s.axis = attr_int(n, "axis", 0);
    if (s.axis < -rank || s.axis >= rank)
      throw UserError(where(n), "axis " + std::to_string(s.axis) + " is out of range for rank " +
                                    std::to_string(rank), "export the model again; the file does not follow the ONNX spec");
    if (s.axis < 0) s.axis += rank;
    const int64_t dim = shape[static_cast<size_t>(s.axis)];
    const bool has_split = n.input_size() > 1 && !n.input(1).empty();
    if (!has_split) {
      s.sizes.assign(static_cast<size_t>(dim), 1);
      s.squeeze = attr_int(n, "keepdims", 1) == 0;
    } else {
      const Tensor* split = constant(n, 1);
      if (!split) return std::nullopt;
      std::optional<Dims> v = int_values(*split);
      if (!v) return std::nullopt;
      if (split->type.shape.empty()) {
        const int64_t size = (*v)[0];
        if (size <= 0)
          throw UserError(where(n), "split size " + std::to_string(size) + " is not positive",
                          "export with positive split sizes");
        for (int64_t left = dim; left > 0; left -= size) s.sizes.push_back(std::min(size, left));
      } else {
        s.sizes = *v;
        int64_t sum = 0;
        for (int64_t x : s.sizes) sum += x;
        if (sum != dim)
          throw UserError(where(n), "split sizes sum to " + std::to_string(sum) + ", not to the " +
                                        std::to_string(dim) + " of axis " + std::to_string(s.axis),
                          "check the bound dimensions (--micro-batch, --dim) against the model");
      }
    }
    for (size_t k = 0; k < s.sizes.size(); ++k) s.parts.push_back(n.output(0) + "/" + std::to_string(k));
    return s;
  }

  // Position p of SequenceAt in [-n, n) -> [0, n); nullopt when it is not constant.
  std::optional<size_t> position(const onnx::NodeProto& n, size_t parts) const {
    const Tensor* t = constant(n, 1);
    std::optional<Dims> v = t ? int_values(*t) : std::nullopt;
    if (!v || v->size() != 1) return std::nullopt;
    const int64_t count = static_cast<int64_t>(parts), p = (*v)[0];
    if (p < -count || p >= count)
      throw UserError(where(n), "position " + std::to_string(p) + " is out of range for a sequence of " +
                                    std::to_string(count), "fix the index the model uses and export again");
    return static_cast<size_t>(p < 0 ? p + count : p);
  }

  // A sequence folds only when every reader does: SequenceAt at a constant position,
  // ConcatFromSequence, SequenceLength. Any other reader (or a graph output) keeps it whole.
  void drop_sequences_with_unknown_readers() {
    std::set<std::string> keep_whole;
    for (const auto& o : g_->output()) keep_whole.insert(o.name());
    for (const auto& n : g_->node())
      for (int i = 0; i < n.input_size(); ++i) {
        auto s = sequences_.find(n.input(i));
        if (s == sequences_.end()) continue;
        const std::string& op = n.op_type();
        const bool reads = is_sequence_op(n) && i == 0 &&
                           (op == "ConcatFromSequence" || op == "SequenceLength" ||
                            (op == "SequenceAt" && position(n, s->second.parts.size())));
        if (!reads) keep_whole.insert(n.input(i));
      }
    for (const std::string& name : keep_whole) sequences_.erase(name);
  }

  std::string resolve(std::string name) const {
    for (auto it = alias_.find(name); it != alias_.end(); it = alias_.find(name)) name = it->second;
    return name;
  }

  std::string add_ints(const std::string& name, const Dims& shape, const Dims& v) {
    Tensor t;
    t.type = TensorType{DType::kInt64, shape};
    t.data.resize(v.size() * sizeof(int64_t));
    std::copy(v.begin(), v.end(), t.as<int64_t>());
    tensor_to_proto(t, name, g_->add_initializer());
    (*types_)[name] = t.type;
    (*constants_)[name] = std::move(t);
    return name;
  }

  const Sequence* folded(const onnx::NodeProto& n, int input) const {
    if (!is_sequence_op(n) || n.input_size() <= input) return nullptr;
    auto s = sequences_.find(n.input(input));
    return s == sequences_.end() ? nullptr : &s->second;
  }

  // Appends what n becomes to *out.
  void rewrite(onnx::NodeProto& n, google::protobuf::RepeatedPtrField<onnx::NodeProto>* out) {
    for (auto& in : *n.mutable_input()) in = resolve(in);
    const bool produces = is_sequence_op(n) && n.output_size() == 1 && sequences_.count(n.output(0));
    if (produces && n.op_type() == "SplitToSequence") {
      emit_split(n, sequences_.at(n.output(0)), out);
    } else if (produces) {  // SequenceConstruct: its parts are its inputs
      for (auto& p : sequences_.at(n.output(0)).parts) p = resolve(p);
    } else if (const Sequence* s = folded(n, 0); s && n.op_type() == "SequenceAt") {
      const std::string& part = s->parts[*position(n, s->parts.size())];
      alias_[n.output(0)] = part;
      for (const auto& o : g_->output())
        if (o.name() == n.output(0)) *out->Add() = make_node("Identity", n.name(), {part}, {n.output(0)});
    } else if (s && n.op_type() == "ConcatFromSequence") {
      emit_concat(n, *s, out);
    } else if (s && n.op_type() == "SequenceLength") {
      add_ints(n.output(0), {}, {static_cast<int64_t>(s->parts.size())});
    } else {
      *out->Add() = std::move(n);
    }
  }

  void emit_split(const onnx::NodeProto& n, const Sequence& s,
                  google::protobuf::RepeatedPtrField<onnx::NodeProto>* out) {
    std::vector<std::string> cut = s.parts;
    if (s.squeeze)
      for (auto& c : cut) c += "/kept";
    const std::string sizes = add_ints(n.name() + "/split_sizes", {static_cast<int64_t>(s.sizes.size())}, s.sizes);
    onnx::NodeProto split = make_node("Split", n.name(), {n.input(0), sizes}, cut);
    set_int_attr(&split, "axis", s.axis);
    *out->Add() = std::move(split);
    if (!s.squeeze) return;
    const std::string axes = add_ints(n.name() + "/squeeze_axes", {1}, {s.axis});
    for (size_t k = 0; k < cut.size(); ++k)
      *out->Add() = make_node("Squeeze", s.parts[k], {cut[k], axes}, {s.parts[k]});
  }

  void emit_concat(const onnx::NodeProto& n, const Sequence& s,
                   google::protobuf::RepeatedPtrField<onnx::NodeProto>* out) {
    const int64_t axis = attr_int(n, "axis", 0);
    std::vector<std::string> parts;
    for (const std::string& p : s.parts) parts.push_back(resolve(p));
    if (attr_int(n, "new_axis", 0) != 0) {
      const std::string axes = add_ints(n.name() + "/unsqueeze_axes", {1}, {axis});
      for (auto& p : parts) {
        const std::string grown = n.output(0) + "/" + p;
        *out->Add() = make_node("Unsqueeze", grown, {p, axes}, {grown});
        p = grown;
      }
    }
    onnx::NodeProto concat = make_node("Concat", n.name(), parts, {n.output(0)});
    set_int_attr(&concat, "axis", axis);
    *out->Add() = std::move(concat);
  }

  onnx::GraphProto* g_;
  std::map<std::string, TensorType>* types_;
  std::map<std::string, Tensor>* constants_;
  std::string path_;
  int64_t opset_;
  std::map<std::string, Sequence> sequences_;   // by the sequence's name: those that fold
  std::map<std::string, std::string> alias_;   // SequenceAt output -> the part it names
};

}  // namespace

int fold_sequences(onnx::GraphProto* g, std::map<std::string, TensorType>* types,
                   std::map<std::string, Tensor>* constants, const std::string& path, int64_t opset) {
  return SequenceFolder(g, types, constants, path, opset).run();
}

void check_sequences_folded(const onnx::GraphProto& g, const std::string& path, int64_t opset) {
  for (const auto& n : g.node())
    if (is_sequence_op(n))
      throw UserError(node_where(path, n, opset),
                      "sequence op " + n.op_type() + " cannot be folded: its split sizes, positions "
                      "or input shape are computed at run time, or its sequence is read by an op "
                      "other than SequenceAt, ConcatFromSequence or SequenceLength",
                      "export with constant split sizes (torch.split with int sizes) and constant "
                      "indices");
}

}  // namespace pt
