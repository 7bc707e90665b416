// onnx_import/fold_index.cc: the index-driven folders of evaluate_constant (registered in
// fold.cc): GatherElements, GatherND and CumSum, as today's exporters write them to build
// position ids and attention masks. Gathers copy elements as bytes (every fixed-size dtype);
// CumSum adds int64, int32, float32 and float64.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ir.h"
#include "onnx_import/fold_detail.h"

namespace pt::fold_detail {

namespace {

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

// An index into a dim of size `dim`, negative counting from the end; UserError outside.
int64_t checked_index(const Node& node, int64_t i, int64_t dim) {
  if (i < -dim || i >= dim)
    fail(node, "index " + std::to_string(i) + " is out of range for a dim of size " + std::to_string(dim));
  return i < 0 ? i + dim : i;
}

void copy_element(Tensor* out, int64_t o, const Tensor& src, int64_t s) {
  const size_t elem = dtype_size(src.type.dtype);
  std::memcpy(&out->data[static_cast<size_t>(o) * elem], &src.data[static_cast<size_t>(s) * elem], elem);
}

}  // namespace

// GatherElements: out[i...] = data[i... with i[axis] replaced by indices[i...]]; out has the
// indices' shape.
Folded fold_gather_elements(const Node& node, const Inputs& in, int64_t) {
  const Tensor& data = *in[0];
  std::optional<std::vector<int64_t>> indices = read_ints(in[1]);
  if (!indices) return std::nullopt;
  const std::vector<int64_t>& ds = data.type.shape;
  const std::vector<int64_t>& is = in[1]->type.shape;
  const int64_t rank = static_cast<int64_t>(ds.size());
  if (static_cast<int64_t>(is.size()) != rank)
    fail(node, "indices of rank " + std::to_string(is.size()) + " for data of rank " + std::to_string(rank));
  const int64_t axis = normalize_axis(node, node.attr_int("axis", 0), rank);
  const std::vector<int64_t> dstr = strides_of(ds), istr = strides_of(is);
  Tensor out = new_tensor(data.type.dtype, is);
  for (int64_t o = 0; o < out.type.numel(); ++o) {
    int64_t src = 0;
    for (int64_t d = 0; d < rank; ++d) {
      const int64_t i = (o / istr[d]) % is[d];
      src += (d == axis ? checked_index(node, (*indices)[o], ds[d]) : i) * dstr[d];
    }
    copy_element(&out, o, data, src);
  }
  return one(std::move(out));
}

// GatherND (batch_dims b): for each index tuple t = indices[j..., :] (length k),
// out[j..., rest...] = data[batch(j)..., t..., rest...]; out's shape is indices.shape[:-1] +
// data.shape[b + k:].
Folded fold_gather_nd(const Node& node, const Inputs& in, int64_t) {
  const Tensor& data = *in[0];
  std::optional<std::vector<int64_t>> indices = read_ints(in[1]);
  if (!indices) return std::nullopt;
  const std::vector<int64_t>& ds = data.type.shape;
  const std::vector<int64_t>& is = in[1]->type.shape;
  const int64_t b = node.attr_int("batch_dims", 0);
  if (is.empty()) fail(node, "indices must have rank 1 or more");
  const int64_t k = is.back();
  if (k < 1 || b < 0 || b >= static_cast<int64_t>(is.size()) || b + k > static_cast<int64_t>(ds.size()))
    fail(node, "index tuples of length " + std::to_string(k) + " with batch_dims " +
                   std::to_string(b) + " do not fit data " + shape_str(ds));
  for (int64_t d = 0; d < b; ++d)
    if (is[d] != ds[d]) fail(node, "batch dims of indices " + shape_str(is) + " and data " + shape_str(ds) + " differ");
  std::vector<int64_t> shape(is.begin(), is.end() - 1);
  shape.insert(shape.end(), ds.begin() + b + k, ds.end());
  Tensor out = new_tensor(data.type.dtype, shape);
  const std::vector<int64_t> dstr = strides_of(ds);
  const int64_t slice = dstr[static_cast<size_t>(b + k - 1)];  // elements after the indexed dims
  const int64_t batch_stride = b > 0 ? dstr[static_cast<size_t>(b - 1)] : 0;
  int64_t batches = 1;
  for (int64_t d = 0; d < b; ++d) batches *= is[d];
  const int64_t tuples = static_cast<int64_t>(indices->size()) / k;
  const int64_t per_batch = batches == 0 ? 1 : tuples / batches;
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t src = (t / per_batch) * batch_stride;
    for (int64_t j = 0; j < k; ++j)
      src += checked_index(node, (*indices)[t * k + j], ds[b + j]) * dstr[b + j];
    for (int64_t e = 0; e < slice; ++e) copy_element(&out, t * slice + e, data, src + e);
  }
  return one(std::move(out));
}

// CumSum(x, axis) with exclusive and reverse: running sums along one axis.
Folded fold_cumsum(const Node& node, const Inputs& in, int64_t) {
  const Tensor& x = *in[0];
  std::optional<std::vector<int64_t>> axis_v = read_ints(in[1]);
  if (!axis_v || axis_v->size() != 1) return std::nullopt;
  const std::vector<int64_t>& s = x.type.shape;
  const int64_t axis = normalize_axis(node, (*axis_v)[0], static_cast<int64_t>(s.size()));
  const bool exclusive = node.attr_int("exclusive", 0) != 0, reverse = node.attr_int("reverse", 0) != 0;
  const int64_t n = s[axis], inner = strides_of(s)[axis];
  const int64_t outer = n * inner == 0 ? 0 : x.type.numel() / (n * inner);
  auto scan = [&](auto tag) -> Folded {
    using T = decltype(tag);
    Tensor out = new_tensor(x.type.dtype, s);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        T sum = 0;
        for (int64_t step = 0; step < n; ++step) {
          const int64_t a = reverse ? n - 1 - step : step;
          const int64_t at = (o * n + a) * inner + i;
          if (exclusive) {
            out.as<T>()[at] = sum;
            sum += x.as<T>()[at];
          } else {
            sum += x.as<T>()[at];
            out.as<T>()[at] = sum;
          }
        }
      }
    return one(std::move(out));
  };
  switch (x.type.dtype) {
    case DType::kInt64: return scan(int64_t{});
    case DType::kInt32: return scan(int32_t{});
    case DType::kFloat32: return scan(float{});
    case DType::kFloat64: return scan(double{});
    default: return std::nullopt;
  }
}

}  // namespace pt::fold_detail
