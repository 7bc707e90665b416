#include "exec/cpu/row_chain.h"

#include <algorithm>

#include "exec/cpu/vector_clones.h"

namespace pt::cpu {

std::optional<RowOperand> RowOperand::make(const Dims& shape, const Dims& out, size_t input) {
  const std::optional<Dims> aligned = align_to_rank(shape, out.size());
  if (!aligned || out.empty()) return std::nullopt;
  RowOperand o;
  o.input = input;
  int64_t stride = 1;
  Dims strides(out.size());
  for (size_t d = out.size(); d-- > 0;) {
    if ((*aligned)[d] != out[d] && (*aligned)[d] != 1) return std::nullopt;
    strides[d] = (*aligned)[d] == 1 ? 0 : stride;
    stride *= (*aligned)[d];
  }
  o.step = strides.back();
  // The leading dims, innermost first, merged where the operand walks two as one (a mask of
  // [1, 1, T, T] over [B, H, T, T] rows is one dim of T rows, and a scalar none), the outer ones
  // it broadcasts over dropped: offset() divides once per dim left.
  for (size_t d = out.size() - 1; d-- > 0;) {
    if (!o.dims_.empty() && strides[d] == o.strides_.back() * o.dims_.back()) {
      o.dims_.back() *= out[d];
      continue;
    }
    o.dims_.push_back(out[d]);
    o.strides_.push_back(strides[d]);
  }
  while (!o.strides_.empty() && o.strides_.back() == 0) {
    o.dims_.pop_back();
    o.strides_.pop_back();
  }
  return o;
}

int64_t RowOperand::offset(int64_t row) const {
  int64_t off = 0;
  for (size_t d = 0; d < dims_.size(); ++d) {
    off += row % dims_[d] * strides_[d];
    row /= dims_[d];
  }
  return off;
}

namespace {

// Link `e` (a node reading the chain's tensor, of type `t`, at input e.through) as a row link,
// its other inputs numbered from `next`.
std::optional<RowLink> row_link(const KernelSpec& e, const TensorType& t, size_t& next) {
  const std::string& op = e.node.op_type;
  if (!e.node.domain.empty() || e.outputs.size() != 1 || !(e.outputs[0] == t) || t.dtype != DType::kFloat32 ||
      e.through >= e.inputs.size() || !(e.inputs[e.through] == t))
    return std::nullopt;
  for (size_t k = 0; k < e.inputs.size(); ++k)
    if (e.input_channels_last(k)) return std::nullopt;
  RowLink l;
  if (op == "Where") {
    if (e.inputs.size() != 3 || e.through == 0 || e.inputs[0].dtype != DType::kBool) return std::nullopt;
    const size_t other = 3 - e.through;
    if (e.inputs[other].dtype != DType::kFloat32) return std::nullopt;
    const auto cond = RowOperand::make(e.inputs[0].shape, t.shape, next);
    const auto branch = RowOperand::make(e.inputs[other].shape, t.shape, next + 1);
    if (!cond || !branch) return std::nullopt;
    next += 2;
    return RowLink{RowLink::Op::kWhere, e.through == 2, *branch, *cond};
  }
  if (op == "Add") l.op = RowLink::Op::kAdd;
  else if (op == "Sub") l.op = RowLink::Op::kSub;
  else if (op == "Mul") l.op = RowLink::Op::kMul;
  else if (op == "Div") l.op = RowLink::Op::kDiv;
  else return std::nullopt;
  if (e.inputs.size() != 2 || e.inputs[1 - e.through].dtype != DType::kFloat32) return std::nullopt;
  const auto other = RowOperand::make(e.inputs[1 - e.through].shape, t.shape, next);
  if (!other) return std::nullopt;
  ++next;
  l.second = e.through == 1;
  l.other = *other;
  return l;
}

// y[k] = f(x[k], c[k * step]) over [0, n); step 0 or 1.
template <class F>
[[gnu::always_inline]] inline void each(const float* x, const float* c, int64_t step, float* y, int64_t n, F f) {
  if (step == 1) {
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) y[k] = f(x[k], c[k]);
  } else {
    const float v = c[0];
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) y[k] = f(x[k], v);
  }
}

// y[k] = cond[k] != second ? x[k] : o[k], each of cond and o read with step 1, or 0 (CS, OS
// false). The condition's bytes are read as bytes, and a broadcast operand once, so that the
// loop vectorises.
template <bool CS, bool OS>
[[gnu::always_inline]] inline void select(const float* x, const bool* cond, const float* o, bool second, float* y, int64_t n) {
  const auto* c = reinterpret_cast<const unsigned char*>(cond);
  const unsigned char c0 = c[0], s = second;
  const float o0 = o[0];
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) y[k] = (CS ? c[k] : c0) != s ? x[k] : (OS ? o[k] : o0);
}

}  // namespace

std::optional<std::vector<RowLink>> epilogue_links(const KernelSpec& s, size_t& next_input) {
  std::vector<RowLink> links;
  for (const KernelSpec* e = s.epilogue; e; e = e->epilogue) {
    const auto l = row_link(*e, s.outputs[0], next_input);
    if (!l) return std::nullopt;
    links.push_back(*l);
  }
  return links;
}

std::optional<std::vector<RowLink>> prologue_links(const KernelSpec& s, size_t& next_input) {
  std::vector<RowLink> links;
  for (const KernelSpec* p = s.prologue; p; p = p->prologue) {
    const auto l = row_link(*p, s.inputs[0], next_input);
    if (!l) return std::nullopt;
    links.push_back(*l);
  }
  std::reverse(links.begin(), links.end());
  return links;
}

// The links applied to one row: out = links(in), `row` the row's index in the chain's tensor;
// inlined, so that each clone of apply_links has its own.
[[gnu::always_inline]] inline void link_row(std::span<const RowLink> links, std::span<const Buffer> inputs,
                                            int64_t row, int64_t n, const float* in, float* out) {
  for (const RowLink& l : links) {
    const float* c = inputs[l.other.input].as<const float>() + l.other.offset(row);
    const int64_t step = l.other.step;
    switch (l.op) {
      case RowLink::Op::kAdd: each(in, c, step, out, n, [](float x, float v) { return x + v; }); break;
      case RowLink::Op::kMul: each(in, c, step, out, n, [](float x, float v) { return x * v; }); break;
      case RowLink::Op::kSub:
        if (l.second) each(in, c, step, out, n, [](float x, float v) { return v - x; });
        else each(in, c, step, out, n, [](float x, float v) { return x - v; });
        break;
      case RowLink::Op::kDiv:
        if (l.second) each(in, c, step, out, n, [](float x, float v) { return v / x; });
        else each(in, c, step, out, n, [](float x, float v) { return x / v; });
        break;
      case RowLink::Op::kWhere: {
        const bool* cond = inputs[l.cond.input].as<const bool>() + l.cond.offset(row);
        if (l.cond.step && step) select<true, true>(in, cond, c, l.second, out, n);
        else if (l.cond.step) select<true, false>(in, cond, c, l.second, out, n);
        else if (step) select<false, true>(in, cond, c, l.second, out, n);
        else select<false, false>(in, cond, c, l.second, out, n);
        break;
      }
    }
    in = out;
  }
}

PT_VECTOR_CLONES void apply_links(std::span<const RowLink> links, std::span<const Buffer> inputs, int64_t r0,
                                  int64_t r1, int64_t n, const float* in, float* out) {
  for (int64_t r = r0; r < r1; ++r) link_row(links, inputs, r, n, in + (r - r0) * n, out + (r - r0) * n);
}

}  // namespace pt::cpu
