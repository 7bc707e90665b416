#include "onnx_import/widen_halves.h"

#include <nlohmann/json.hpp>

#include <set>

#include "core/half_floats.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

constexpr int kFloat32 = static_cast<int>(DType::kFloat32);

bool is_half_type(int32_t t) { return is_half(static_cast<DType>(t)); }

// One tensor as float32: inline data widened, external data marked for widening at its read.
void widen_tensor(onnx::TensorProto* t) {
  if (!is_half_type(t->data_type())) return;
  if (t->data_location() == onnx::TensorProto::EXTERNAL) {
    auto* kv = t->add_external_data();
    kv->set_key(kFileDTypeKey);
    kv->set_value(std::to_string(t->data_type()));
  } else {
    const Tensor w = widened(tensor_from_proto(*t, "tensor '" + t->name() + "'"));
    t->clear_int32_data();
    t->set_raw_data(w.data.data(), w.data.size());
  }
  t->set_data_type(kFloat32);
}

void widen_value(onnx::ValueInfoProto* v) {
  if (!v->type().has_tensor_type()) return;
  auto* tt = v->mutable_type()->mutable_tensor_type();
  if (is_half_type(tt->elem_type())) tt->set_elem_type(kFloat32);
}

// Whether attribute a of node n names the dtype of what n makes.
bool names_dtype(const onnx::NodeProto& n, const onnx::AttributeProto& a) {
  static const std::set<std::string> kDtypeOps = {"EyeLike", "RandomNormal", "RandomNormalLike", "RandomUniform",
                                                  "RandomUniformLike", "Bernoulli"};
  if (!n.domain().empty() && n.domain() != "ai.onnx") return false;
  return a.type() == onnx::AttributeProto::INT &&
         ((n.op_type() == "Cast" && a.name() == "to") || (kDtypeOps.count(n.op_type()) && a.name() == "dtype"));
}

void widen_node(onnx::NodeProto* n) {
  for (auto& a : *n->mutable_attribute()) {
    if (a.has_t()) widen_tensor(a.mutable_t());
    for (auto& t : *a.mutable_tensors()) widen_tensor(&t);
    if (names_dtype(*n, a) && is_half_type(static_cast<int32_t>(a.i()))) a.set_i(kFloat32);
  }
}

// The record's (onnx_import/module_state.h) float16/bfloat16 entries as float32.
void widen_record(onnx::ModelProto* m) {
  for (auto& p : *m->mutable_metadata_props()) {
    if (p.key() != "pipetrain.state_dict") continue;
    nlohmann::json list = nlohmann::json::parse(p.value(), nullptr, false);
    if (!list.is_array()) return;  // read_module_state names what is wrong with it
    bool changed = false;
    for (auto& e : list)
      if (e.is_object() && e.contains("dtype") && (e["dtype"] == "float16" || e["dtype"] == "bfloat16")) {
        e["dtype"] = dtype_name(DType::kFloat32);
        changed = true;
      }
    if (changed) p.set_value(list.dump());
  }
}

}  // namespace

std::map<std::string, DType> widen_half_floats(onnx::ModelProto* m) {
  std::map<std::string, DType> file_dtypes;
  auto* g = m->mutable_graph();
  bool half_weights = false;
  for (const auto& t : g->initializer()) half_weights = half_weights || is_half_type(t.data_type());
  if (!half_weights) return file_dtypes;
  for (auto& t : *g->mutable_initializer()) {
    if (is_half_type(t.data_type())) file_dtypes[t.name()] = static_cast<DType>(t.data_type());
    widen_tensor(&t);
  }
  for (auto& n : *g->mutable_node()) widen_node(&n);
  for (auto& v : *g->mutable_input()) widen_value(&v);
  for (auto& v : *g->mutable_output()) widen_value(&v);
  for (auto& v : *g->mutable_value_info()) widen_value(&v);
  widen_record(m);
  return file_dtypes;
}

}  // namespace pt
