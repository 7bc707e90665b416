#include "exec/kernel_geometry.h"

#include <algorithm>
#include <cmath>

namespace pt {
namespace {

// True when `in` broadcasts to `out` (both aligned): each dim equal or 1.
bool broadcasts_to(const Dims& in, const Dims& out) {
  for (size_t d = 0; d < out.size(); ++d)
    if (in[d] != out[d] && in[d] != 1) return false;
  return true;
}

// The axes of a reduction: the `axes` attribute, else constant int64 input 1; nullopt when
// input 1 is given but not a constant int64 tensor.
std::optional<Dims> reduce_axes(const KernelSpec& s) {
  Dims axes = s.node.attr_ints("axes");
  if (!s.node.has_attr("axes") && s.has_input(1)) {
    const Tensor* t = s.constant(1);
    if (!t || t->type.dtype != DType::kInt64) return std::nullopt;
    axes.assign(t->as<int64_t>(), t->as<int64_t>() + t->type.numel());
  }
  return axes;
}

}  // namespace

bool wanted(const KernelSpec& s, size_t k) {
  return k < s.outputs.size() && s.outputs[k].dtype != DType::kUndefined;
}

bool has_io(const KernelSpec& s, size_t inputs) {
  for (size_t i = 0; i < inputs; ++i)
    if (!s.has_input(i)) return false;
  return wanted(s, 0);
}

bool float_io(const KernelSpec& s) {
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (s.has_input(i) && s.inputs[i].dtype != DType::kFloat32) return false;
  for (size_t k = 0; k < s.outputs.size(); ++k)
    if (wanted(s, k) && s.outputs[k].dtype != DType::kFloat32) return false;
  return wanted(s, 0);
}

int64_t product(const Dims& v, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= v[i];
  return p;
}

int64_t normalize_axis(int64_t axis, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) return -1;
  return axis < 0 ? axis + r : axis;
}

Dims strides_of(const Dims& shape) {
  Dims st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

std::optional<Dims> align_to_rank(const Dims& in, size_t rank) {
  if (in.size() > rank) return std::nullopt;
  Dims out(rank - in.size(), 1);
  out.insert(out.end(), in.begin(), in.end());
  return out;
}

std::optional<Dims> constant_ints(const KernelSpec& s, size_t i) {
  const Tensor* t = s.constant(i);
  if (!t) return std::nullopt;
  return int_values(*t);
}

std::optional<BroadcastGeometry> broadcast_geometry(const KernelSpec& s, int n) {
  const Dims& out = s.outputs[0].shape;
  if (out.size() > static_cast<size_t>(kMaxBroadcastRank)) return std::nullopt;
  // Full strides per operand over the output's dims.
  std::array<std::array<int64_t, kMaxBroadcastRank>, 3> full{};
  for (int k = 0; k < n; ++k) {
    const auto in = align_to_rank(s.inputs[static_cast<size_t>(k)].shape, out.size());
    if (!in || !broadcasts_to(*in, out)) return std::nullopt;
    int64_t stride = 1;
    for (size_t d = out.size(); d-- > 0;) {
      full[static_cast<size_t>(k)][d] = (*in)[d] == 1 ? 0 : stride;
      stride *= (*in)[d];
    }
  }
  BroadcastGeometry bc;
  bc.numel = s.outputs[0].numel();
  bc.rank = 0;
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;  // contributes nothing to any offset
    bool merge = bc.rank > 0;
    for (int k = 0; k < 3 && merge; ++k)
      merge = bc.strides[k][bc.rank - 1] == full[k][d] * out[d];
    if (merge) {
      bc.dims[bc.rank - 1] *= out[d];
      for (int k = 0; k < 3; ++k) bc.strides[k][bc.rank - 1] = full[k][d];
      continue;
    }
    bc.dims[bc.rank] = out[d];
    for (int k = 0; k < 3; ++k) bc.strides[k][bc.rank] = full[k][d];
    ++bc.rank;
  }
  if (bc.rank == 0) bc = BroadcastGeometry{1, {1}, {}, bc.numel};  // every dim is 1: one element
  return bc;
}

std::optional<std::vector<bool>> reduce_geometry(const KernelSpec& s) {
  if (!s.has_input(0) || !wanted(s, 0) || s.outputs[0].dtype != s.inputs[0].dtype) return std::nullopt;
  const auto axes = reduce_axes(s);
  if (!axes) return std::nullopt;
  const Dims& shape = s.inputs[0].shape;
  const size_t rank = shape.size();
  const bool noop = s.node.attr_int("noop_with_empty_axes", 0) != 0;
  std::vector<bool> reduced(rank, axes->empty() && !noop);
  for (int64_t a : *axes) {
    const int64_t k = normalize_axis(a, rank);
    if (k < 0 || reduced[static_cast<size_t>(k)]) return std::nullopt;
    reduced[static_cast<size_t>(k)] = true;
  }
  // The output: reduced dims set to 1 (keepdims) or dropped; the bytes are the same either way.
  const bool keepdims = s.node.attr_int("keepdims", 1) != 0;
  Dims out;
  for (size_t k = 0; k < rank; ++k) {
    if (!reduced[k]) {
      out.push_back(shape[k]);
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  if (out != s.outputs[0].shape) return std::nullopt;
  return reduced;
}

std::optional<MatmulGeometry> matmul_geometry(const Dims& a0, const Dims& b0, const Dims& y0) {
  if (a0.empty() || b0.empty()) return std::nullopt;
  MatmulGeometry g;
  Dims& a = g.a;
  Dims& b = g.b;
  a = a0.size() == 1 ? Dims{1, a0[0]} : a0;
  b = b0.size() == 1 ? Dims{b0[0], 1} : b0;
  g.k = a.back();
  g.m = a[a.size() - 2];
  g.n = b.back();
  if (b[b.size() - 2] != g.k) return std::nullopt;
  // Numpy's result shape: broadcast batch dims, then M unless A was 1-D, N unless B was 1-D.
  const size_t r = std::max(a.size(), b.size());
  a.insert(a.begin(), r - a.size(), 1);
  b.insert(b.begin(), r - b.size(), 1);
  for (size_t i = 0; i + 2 < r; ++i) {
    if (a[i] != b[i] && a[i] != 1 && b[i] != 1) return std::nullopt;
    g.batch.push_back(std::max(a[i], b[i]));
  }
  Dims want = g.batch;
  if (a0.size() > 1) want.push_back(g.m);
  if (b0.size() > 1) want.push_back(g.n);
  if (want != y0) return std::nullopt;
  return g;
}

std::optional<GemmGeometry> gemm_geometry(const KernelSpec& s) {
  const Dims& a = s.inputs[0].shape;
  const Dims& b = s.inputs[1].shape;
  if (a.size() != 2 || b.size() != 2) return std::nullopt;
  GemmGeometry g;
  g.trans_a = s.node.attr_int("transA", 0) != 0;
  g.trans_b = s.node.attr_int("transB", 0) != 0;
  g.m = g.trans_a ? a[1] : a[0];
  g.k = g.trans_a ? a[0] : a[1];
  g.n = g.trans_b ? b[0] : b[1];
  if ((g.trans_b ? b[1] : b[0]) != g.k || s.outputs[0].shape != Dims{g.m, g.n})
    return std::nullopt;
  g.alpha = s.node.attr_float("alpha", 1.f);
  const float beta = s.node.attr_float("beta", 1.f);
  if (!s.has_input(2) || beta == 0.f) return g;
  const Dims& c = s.inputs[2].shape;
  if (c.size() > 2) return std::nullopt;
  g.c_rows = c.size() == 2 ? c[0] : 1;
  g.c_cols = c.empty() ? 1 : c.back();
  if ((g.c_rows != 1 && g.c_rows != g.m) || (g.c_cols != 1 && g.c_cols != g.n))
    return std::nullopt;
  g.beta = beta;
  return g;
}

std::optional<ScanGeometry> scan_geometry(const KernelSpec& s) {
  if (s.inputs.size() != 2 || s.outputs.size() != 1 || !(s.outputs[0] == s.inputs[0])) return std::nullopt;
  const std::optional<Dims> axis = constant_ints(s, 1);
  const Dims& shape = s.inputs[0].shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (!axis || axis->size() != 1 || (*axis)[0] < -rank || (*axis)[0] >= rank) return std::nullopt;
  const size_t a = static_cast<size_t>((*axis)[0] < 0 ? (*axis)[0] + rank : (*axis)[0]);
  ScanGeometry g;
  for (size_t d = 0; d < a; ++d) g.outer *= shape[d];
  for (size_t d = a + 1; d < shape.size(); ++d) g.inner *= shape[d];
  g.n = shape[a];
  g.exclusive = s.node.attr_int("exclusive", 0) != 0;
  g.reverse = s.node.attr_int("reverse", 0) != 0;
  return g;
}

namespace {

// g from Q, K, V (inputs q_at, +1, +2) and the optional mask (input mask_at).
std::optional<AttentionGeometry> attention_inputs(const KernelSpec& s, size_t q_at, size_t mask_at) {
  if (!s.has_input(q_at) || !s.has_input(q_at + 1) || !s.has_input(q_at + 2)) return std::nullopt;
  const TensorType &q = s.inputs[q_at], &k = s.inputs[q_at + 1], &v = s.inputs[q_at + 2];
  for (const TensorType* t : {&q, &k, &v})
    if (t->dtype != DType::kFloat32 || t->shape.size() != 4) return std::nullopt;
  AttentionGeometry g;
  g.batch = q.shape[0];
  g.heads = q.shape[1];
  g.queries = q.shape[2];
  g.dim = q.shape[3];
  g.kv_heads = k.shape[1];
  g.keys = k.shape[2];
  g.vdim = v.shape[3];
  if (k.shape[0] != g.batch || k.shape[3] != g.dim || v.shape[0] != g.batch || v.shape[1] != g.kv_heads ||
      v.shape[2] != g.keys || g.kv_heads <= 0 || g.heads % g.kv_heads != 0 || g.keys <= 0)
    return std::nullopt;
  g.scale = s.node.attr_float("scale", 1.f / std::sqrt(static_cast<float>(g.dim)));
  g.causal = s.node.attr_int("causal", 0) != 0;
  if (!s.has_input(mask_at)) return g;
  const TensorType& m = s.inputs[mask_at];
  if (m.dtype == DType::kFloat32) g.mask = AttentionGeometry::Mask::kFloat;
  else if (m.dtype == DType::kBool) g.mask = AttentionGeometry::Mask::kBool;
  else return std::nullopt;
  if (m.shape.size() > 4) return std::nullopt;
  const int64_t full[4] = {g.batch, g.heads, g.queries, g.keys};
  int64_t stride = 1;
  for (int64_t a = 3, r = static_cast<int64_t>(m.shape.size()) - 1; a >= 0; --a, --r) {
    const int64_t dim = r >= 0 ? m.shape[static_cast<size_t>(r)] : 1;
    if (dim != 1 && dim != full[a]) return std::nullopt;
    g.mask_stride[a] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
  return g;
}

}  // namespace

std::optional<AttentionGeometry> fused_attention_geometry(const KernelSpec& s) {
  if (s.inputs.size() < 3 || s.inputs.size() > 4 || s.outputs.empty() || s.outputs.size() > 2) return std::nullopt;
  std::optional<AttentionGeometry> g = attention_inputs(s, 0, 3);
  if (!g || s.outputs[0] != TensorType{DType::kFloat32, {g->batch, g->heads, g->queries, g->vdim}}) return std::nullopt;
  if (s.outputs.size() > 1 && s.outputs[1].dtype != DType::kUndefined &&
      s.outputs[1] != TensorType{DType::kFloat32, {g->batch, g->heads, g->queries}})
    return std::nullopt;
  return g;
}

std::optional<AttentionGeometry> fused_attention_grad_geometry(const KernelSpec& s) {
  if (s.inputs.size() < 6 || s.inputs.size() > 7 || s.outputs.size() != 3) return std::nullopt;
  std::optional<AttentionGeometry> g = attention_inputs(s, 1, 6);
  if (!g) return std::nullopt;
  const TensorType y{DType::kFloat32, {g->batch, g->heads, g->queries, g->vdim}};
  if (s.inputs[0] != y || s.inputs[4] != y || s.inputs[5] != TensorType{DType::kFloat32, {g->batch, g->heads, g->queries}})
    return std::nullopt;
  for (size_t o = 0; o < 3; ++o)
    if (s.outputs[o].dtype != DType::kUndefined && s.outputs[o] != s.inputs[o + 1]) return std::nullopt;
  if ((s.outputs[1].dtype == DType::kUndefined) != (s.outputs[2].dtype == DType::kUndefined)) return std::nullopt;
  return g;
}

}  // namespace pt
