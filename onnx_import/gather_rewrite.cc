#include "onnx_import/gather_rewrite.h"

#include <optional>
#include <vector>

#include "core/error.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

using Dims = std::vector<int64_t>;

Dims strides_of(const Dims& shape) {
  Dims s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

int64_t product(const Dims& d, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= d[i];
  return p;
}

class Rewriter {
 public:
  Rewriter(const onnx::NodeProto& n, onnx::GraphProto* g, std::map<std::string, TensorType>* types,
           std::map<std::string, Tensor>* constants, const std::string& where)
      : n_(n), g_(g), types_(types), constants_(constants), where_(where) {}

  int64_t index(int64_t i, int64_t dim) const {
    if (i < -dim || i >= dim)
      throw UserError(where_, "index " + std::to_string(i) + " is out of range for a dim of size " +
                                  std::to_string(dim),
                      "fix the indices the model computes and export again");
    return i < 0 ? i + dim : i;
  }

  std::string ints(const std::string& suffix, const Dims& shape, const Dims& v) {
    Tensor t;
    t.type = TensorType{DType::kInt64, shape};
    t.data.resize(v.size() * sizeof(int64_t));
    std::copy(v.begin(), v.end(), t.as<int64_t>());
    const std::string name = n_.name() + "/" + suffix;
    tensor_to_proto(t, name, g_->add_initializer());
    (*types_)[name] = t.type;
    (*constants_)[name] = std::move(t);
    return name;
  }

  onnx::NodeProto node(const std::string& op, const std::vector<std::string>& in, const std::string& out) const {
    onnx::NodeProto p;
    p.set_name(out == n_.output(0) ? n_.name() : out);
    p.set_op_type(op);
    for (const std::string& i : in) p.add_input(i);
    p.add_output(out);
    return p;
  }

 private:
  const onnx::NodeProto& n_;
  onnx::GraphProto* g_;
  std::map<std::string, TensorType>* types_;
  std::map<std::string, Tensor>* constants_;
  std::string where_;
};

int64_t attr_int(const onnx::NodeProto& n, const std::string& name, int64_t fallback) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return fallback;
}

// J[o] = offset in D of the element that element o of I picks along `axis`.
std::vector<onnx::NodeProto> gather_elements(const onnx::NodeProto& n, const Dims& ds, const Dims& is,
                                             const Dims& idx, Rewriter& r, const std::string& where) {
  const int64_t rank = static_cast<int64_t>(ds.size());
  int64_t axis = attr_int(n, "axis", 0);
  if (axis < -rank || axis >= rank || static_cast<int64_t>(is.size()) != rank)
    throw UserError(where, "axis or indices rank do not fit data " + shape_str(ds), "export the model again");
  if (axis < 0) axis += rank;
  const Dims dstr = strides_of(ds), istr = strides_of(is);
  Dims offsets(idx.size());
  for (size_t o = 0; o < idx.size(); ++o) {
    int64_t at = 0;
    for (int64_t d = 0; d < rank; ++d) {
      const int64_t i = (static_cast<int64_t>(o) / istr[d]) % is[d];
      at += (d == axis ? r.index(idx[o], ds[d]) : i) * dstr[d];
    }
    offsets[o] = at;
  }
  const std::string flat = n.name() + "/flat";
  return {r.node("Reshape", {n.input(0), r.ints("numel", {1}, {product(ds, 0, ds.size())})}, flat),
          r.node("Gather", {flat, r.ints("offsets", is, offsets)}, n.output(0))};
}

// J[t] = the row of D viewed as [rows, slice] that index tuple t (in batch t / per_batch) picks.
std::vector<onnx::NodeProto> gather_nd(const onnx::NodeProto& n, const Dims& ds, const Dims& is,
                                       const Dims& idx, Rewriter& r, const std::string& where) {
  const int64_t b = attr_int(n, "batch_dims", 0);
  const int64_t k = is.empty() ? 0 : is.back();
  if (k < 1 || b < 0 || b >= static_cast<int64_t>(is.size()) || b + k > static_cast<int64_t>(ds.size()))
    throw UserError(where, "index tuples of length " + std::to_string(k) + " with batch_dims " +
                               std::to_string(b) + " do not fit data " + shape_str(ds),
                    "export the model again");
  const size_t end = static_cast<size_t>(b + k);
  const int64_t rows = product(ds, 0, end), slice = product(ds, end, ds.size());
  const int64_t tuples = static_cast<int64_t>(idx.size()) / k;
  const int64_t batches = product(is, 0, static_cast<size_t>(b));
  const int64_t per_batch = batches == 0 ? 1 : tuples / batches;
  const int64_t batch_rows = product(ds, static_cast<size_t>(b), end);
  Dims row_of(static_cast<size_t>(tuples));
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t row = (t / per_batch) * batch_rows;
    for (int64_t j = 0; j < k; ++j)
      row += r.index(idx[static_cast<size_t>(t * k + j)], ds[static_cast<size_t>(b + j)]) *
             product(ds, static_cast<size_t>(b + j + 1), end);
    row_of[static_cast<size_t>(t)] = row;
  }
  Dims out(is.begin(), is.end() - 1);
  out.insert(out.end(), ds.begin() + static_cast<std::ptrdiff_t>(end), ds.end());
  const std::string view = n.name() + "/rows", picked = n.name() + "/picked";
  return {r.node("Reshape", {n.input(0), r.ints("rows_shape", {2}, {rows, slice})}, view),
          r.node("Gather", {view, r.ints("row_index", Dims(is.begin(), is.end() - 1), row_of)}, picked),
          r.node("Reshape", {picked, r.ints("out_shape", {static_cast<int64_t>(out.size())}, out)}, n.output(0))};
}

}  // namespace

int rewrite_constant_gathers(onnx::GraphProto* g, std::map<std::string, TensorType>* types,
                             std::map<std::string, Tensor>* constants, const std::string& path) {
  std::vector<onnx::NodeProto> nodes;
  int rewritten = 0;
  for (auto& n : *g->mutable_node()) {
    const bool elements = n.op_type() == "GatherElements", nd = n.op_type() == "GatherND";
    auto data = n.input_size() == 2 ? types->find(n.input(0)) : types->end();
    auto indices = n.input_size() == 2 ? constants->find(n.input(1)) : constants->end();
    std::optional<Dims> idx;
    // Constant data is folding's; constant indices into data computed at run time are ours.
    if ((elements || nd) && n.domain().empty() && data != types->end() && indices != constants->end() &&
        !constants->count(n.input(0)))
      idx = int_values(indices->second);
    if (!idx) {
      nodes.push_back(std::move(n));
      continue;
    }
    const std::string where = path + ": node '" + n.name() + "' (" + n.op_type() + ")";
    Rewriter r(n, g, types, constants, where);
    const Dims is = indices->second.type.shape, ds = data->second.shape;  // copies: r adds to the maps
    auto replacement = elements ? gather_elements(n, ds, is, *idx, r, where) : gather_nd(n, ds, is, *idx, r, where);
    for (auto& p : replacement) nodes.push_back(std::move(p));
    ++rewritten;
  }
  g->clear_node();
  for (auto& n : nodes) *g->add_node() = std::move(n);
  return rewritten;
}

}  // namespace pt
