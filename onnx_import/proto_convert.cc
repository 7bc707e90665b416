#include "onnx_import/proto_convert.h"

#include <cstring>

#include "core/error.h"
#include "onnx_import/infer.h"

namespace pt {
namespace {

template <class Dst, class Field>
void copy_field(const Field& f, Tensor* t) {
  Dst* d = t->as<Dst>();
  for (int i = 0; i < f.size(); ++i) d[i] = static_cast<Dst>(f.Get(i));
}

}  // namespace

TensorType check_tensor_data(const onnx::TensorProto& tp, const std::string& where) {
  TensorType type;
  type.dtype = static_cast<DType>(tp.data_type());
  type.shape.assign(tp.dims().begin(), tp.dims().end());
  const size_t elem = dtype_size(type.dtype);
  if (elem == 0)
    throw UserError(where, std::string("tensor '") + tp.name() + "' has unsupported dtype " +
                               std::to_string(tp.data_type()),
                    "use numeric tensors (float, int, bool)");
  int64_t n = 1;
  for (int64_t d : type.shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxTensorElements)
      throw UserError(where, "tensor '" + tp.name() + "' has shape " + shape_str(type.shape) +
                                 ", not a size a tensor can have",
                      "the model file is corrupt; export it again");
  int64_t have = 0;
  if (tp.data_location() == onnx::TensorProto::EXTERNAL) {
    const StoredBytes s = stored_range(tp, where);
    const auto held = static_cast<int64_t>(s.file_dtype == DType::kUndefined ? elem : dtype_size(s.file_dtype));
    have = s.length % held == 0 ? s.length / held : -1;
    if (have < 0)
      throw UserError(where, "tensor '" + tp.name() + "' of shape " + shape_str(type.shape) + " holds " +
                                 std::to_string(s.length) + " bytes of external data, not whole elements",
                      "the model file is corrupt or truncated; export it again");
  } else if (tp.has_raw_data()) {
    have = static_cast<int64_t>(tp.raw_data().size() / elem);
    if (tp.raw_data().size() % elem != 0) have = -1;
  } else {
    switch (type.dtype) {
      case DType::kFloat32: have = tp.float_data_size(); break;
      case DType::kFloat64: have = tp.double_data_size(); break;
      case DType::kInt64: have = tp.int64_data_size(); break;
      case DType::kUInt64: case DType::kUInt32: have = tp.uint64_data_size(); break;
      default: have = tp.int32_data_size(); break;
    }
  }
  if (have != n)
    throw UserError(where,
                    "tensor '" + tp.name() + "' of shape " + shape_str(type.shape) + " holds " +
                        (have < 0 ? std::to_string(tp.raw_data().size()) + " bytes of data, not whole elements"
                                  : std::to_string(have) + " elements' worth of data") +
                        ", expected " + std::to_string(n),
                    "the model file is corrupt or truncated; export it again");
  return type;
}

StoredBytes stored_range(const onnx::TensorProto& tp, const std::string& where) {
  StoredBytes s{where, "", 0, -1};
  for (const auto& kv : tp.external_data()) {
    if (kv.key() == "location") s.file = kv.value();
    if (kv.key() == "offset") s.offset = std::stoll(kv.value());
    if (kv.key() == "length") s.length = std::stoll(kv.value());
    if (kv.key() == kFileDTypeKey) s.file_dtype = static_cast<DType>(std::stoi(kv.value()));
  }
  PT_CHECK(!s.file.empty() && s.length >= 0, "external data of '" + tp.name() + "' is not placed (onnx_import/load.h)");
  return s;
}

bool in_data_file(const onnx::TensorProto& t) {
  if (t.data_location() != onnx::TensorProto::EXTERNAL) return false;
  for (const auto& kv : t.external_data())
    if (kv.key() == kInModelFileKey) return false;
  return true;
}

Tensor stored_tensor(const onnx::TensorProto& tp, const std::string& where) {
  if (tp.data_location() != onnx::TensorProto::EXTERNAL) return tensor_from_proto(tp, where);
  Tensor t;
  t.type = check_tensor_data(tp, where);
  t.stored = std::make_shared<const StoredBytes>(stored_range(tp, where));
  return t;
}

Tensor tensor_from_proto(const onnx::TensorProto& tp, const std::string& where) {
  Tensor t;
  t.type = check_tensor_data(tp, where);
  if (tp.data_location() == onnx::TensorProto::EXTERNAL) {
    read_stored_tensor(stored_range(tp, where), t.type, &t.data);
    return t;
  }
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  if (tp.has_raw_data()) {
    if (!t.data.empty()) std::memcpy(t.data.data(), tp.raw_data().data(), t.data.size());
    return t;
  }
  switch (t.type.dtype) {
    case DType::kFloat32: copy_field<float>(tp.float_data(), &t); break;
    case DType::kFloat64: copy_field<double>(tp.double_data(), &t); break;
    case DType::kInt64: copy_field<int64_t>(tp.int64_data(), &t); break;
    case DType::kUInt64: copy_field<uint64_t>(tp.uint64_data(), &t); break;
    case DType::kUInt32: copy_field<uint32_t>(tp.uint64_data(), &t); break;
    case DType::kInt32: copy_field<int32_t>(tp.int32_data(), &t); break;
    case DType::kInt16: copy_field<int16_t>(tp.int32_data(), &t); break;
    case DType::kUInt16: case DType::kFloat16: case DType::kBFloat16:
      copy_field<uint16_t>(tp.int32_data(), &t);  // 16-bit floats travel as their bit pattern
      break;
    case DType::kInt8: copy_field<int8_t>(tp.int32_data(), &t); break;
    case DType::kUInt8: case DType::kBool: copy_field<uint8_t>(tp.int32_data(), &t); break;
    default: PT_CHECK(false, "unhandled dtype");
  }
  return t;
}

void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* out) {
  t.load();
  out->Clear();
  out->set_name(name);
  out->set_data_type(static_cast<int32_t>(t.type.dtype));
  for (int64_t d : t.type.shape) out->add_dims(d);
  out->set_raw_data(t.data.data(), t.data.size());
}

AttrValue attr_from_proto(const onnx::AttributeProto& a, const std::string& where) {
  using A = onnx::AttributeProto;
  switch (a.type()) {
    case A::INT: return a.i();
    case A::FLOAT: return a.f();
    case A::STRING: return a.s();
    case A::INTS: return std::vector<int64_t>(a.ints().begin(), a.ints().end());
    case A::FLOATS: return std::vector<float>(a.floats().begin(), a.floats().end());
    case A::STRINGS: return std::vector<std::string>(a.strings().begin(), a.strings().end());
    case A::TENSOR: return tensor_from_proto(a.t(), where);
    default:
      throw UserError(where, "attribute '" + a.name() + "' has a kind pipetrain does not take "
                             "(graphs, sparse tensors, type protos)",
                      "export the model without control flow");
  }
}

void attr_to_proto(const std::string& name, const AttrValue& v, onnx::AttributeProto* out) {
  using A = onnx::AttributeProto;
  out->Clear();
  out->set_name(name);
  if (auto* i = std::get_if<int64_t>(&v)) {
    out->set_type(A::INT);
    out->set_i(*i);
  } else if (auto* f = std::get_if<float>(&v)) {
    out->set_type(A::FLOAT);
    out->set_f(*f);
  } else if (auto* s = std::get_if<std::string>(&v)) {
    out->set_type(A::STRING);
    out->set_s(*s);
  } else if (auto* is = std::get_if<std::vector<int64_t>>(&v)) {
    out->set_type(A::INTS);
    for (int64_t x : *is) out->add_ints(x);
  } else if (auto* fs = std::get_if<std::vector<float>>(&v)) {
    out->set_type(A::FLOATS);
    for (float x : *fs) out->add_floats(x);
  } else if (auto* ss = std::get_if<std::vector<std::string>>(&v)) {
    out->set_type(A::STRINGS);
    for (const auto& x : *ss) out->add_strings(x);
  } else if (auto* t = std::get_if<Tensor>(&v)) {
    out->set_type(A::TENSOR);
    tensor_to_proto(*t, "", out->mutable_t());
  }
}

bool concrete_type(const onnx::ValueInfoProto& vi, TensorType* out) {
  *out = TensorType{};
  if (!vi.type().has_tensor_type()) return false;
  const auto& tt = vi.type().tensor_type();
  out->dtype = static_cast<DType>(tt.elem_type());
  if (!tt.has_shape()) return false;
  bool concrete = out->dtype != DType::kUndefined;
  for (const auto& d : tt.shape().dim()) {
    out->shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
    concrete = concrete && d.has_dim_value() && d.dim_value() >= 0;
  }
  return concrete;
}

void type_to_value_info(const TensorType& t, const std::string& name, onnx::ValueInfoProto* out) {
  out->Clear();
  out->set_name(name);
  auto* tt = out->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(t.dtype));
  auto* shape = tt->mutable_shape();
  for (int64_t d : t.shape) shape->add_dim()->set_dim_value(d);
}

}  // namespace pt
