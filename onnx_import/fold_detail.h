// onnx_import/fold_detail.h: what the three files of evaluate_constant (fold.h) share: the
// helpers fold.cc defines, and the folders fold_ops.cc (numeric) and fold_index.cc (index-driven)
// define for fold.cc's registry. Internal to onnx_import.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt::fold_detail {

using Inputs = std::vector<const Tensor*>;
using Folded = std::optional<std::vector<Tensor>>;

// ---- Helpers (fold.cc) ----

// UserError naming the node.
[[noreturn]] void fail(const Node& node, const std::string& what);
Folded one(Tensor t);
// A zero-filled tensor. Past kMaxFoldBytes (fold.h) it stops the fold instead: evaluate_constant
// then returns nullopt, so a folder needs no size check of its own before calling it.
Tensor new_tensor(DType dtype, std::vector<int64_t> shape);
// The values of an int32 or int64 tensor; nullopt for null or any other dtype.
std::optional<std::vector<int64_t>> read_ints(const Tensor* t);
// axis in [-rank, rank) -> [0, rank); UserError outside.
int64_t normalize_axis(const Node& node, int64_t axis, int64_t rank);
// numpy broadcasting of `shapes`; UserError where two dims differ and neither is 1.
std::vector<int64_t> broadcast_shape(const Node& node, const std::vector<std::vector<int64_t>>& shapes);
// offsets[i] = the element of a tensor of shape `in` that element i of `out` reads when `in`
// broadcasts to `out`; past kMaxFoldBytes it stops the fold as new_tensor does.
std::vector<int64_t> broadcast_offsets(const std::vector<int64_t>& in, const std::vector<int64_t>& out);

// ---- Numeric folders (fold_ops.cc) ----

Folded fold_cast(const Node&, const Inputs&, int64_t);
Folded fold_reciprocal(const Node&, const Inputs&, int64_t);
Folded fold_sin(const Node&, const Inputs&, int64_t);
Folded fold_cos(const Node&, const Inputs&, int64_t);
Folded fold_exp(const Node&, const Inputs&, int64_t);
Folded fold_is_nan(const Node&, const Inputs&, int64_t);
Folded fold_mod(const Node&, const Inputs&, int64_t);
Folded fold_cast_like(const Node&, const Inputs&, int64_t);
Folded fold_range(const Node&, const Inputs&, int64_t);
Folded fold_add(const Node&, const Inputs&, int64_t);
Folded fold_sub(const Node&, const Inputs&, int64_t);
Folded fold_mul(const Node&, const Inputs&, int64_t);
Folded fold_div(const Node&, const Inputs&, int64_t);
Folded fold_pow(const Node&, const Inputs&, int64_t);
Folded fold_min(const Node&, const Inputs&, int64_t);
Folded fold_max(const Node&, const Inputs&, int64_t);
Folded fold_equal(const Node&, const Inputs&, int64_t);
Folded fold_less(const Node&, const Inputs&, int64_t);
Folded fold_less_or_equal(const Node&, const Inputs&, int64_t);
Folded fold_greater(const Node&, const Inputs&, int64_t);
Folded fold_greater_or_equal(const Node&, const Inputs&, int64_t);
Folded fold_and(const Node&, const Inputs&, int64_t);
Folded fold_or(const Node&, const Inputs&, int64_t);
Folded fold_xor(const Node&, const Inputs&, int64_t);
Folded fold_not(const Node&, const Inputs&, int64_t);
Folded fold_neg(const Node&, const Inputs&, int64_t);
Folded fold_abs(const Node&, const Inputs&, int64_t);
Folded fold_sqrt(const Node&, const Inputs&, int64_t);
Folded fold_floor(const Node&, const Inputs&, int64_t);
Folded fold_ceil(const Node&, const Inputs&, int64_t);
Folded fold_reduce_sum(const Node&, const Inputs&, int64_t);
Folded fold_reduce_prod(const Node&, const Inputs&, int64_t);
Folded fold_reduce_max(const Node&, const Inputs&, int64_t);
Folded fold_reduce_min(const Node&, const Inputs&, int64_t);

// ---- Index-driven folders (fold_index.cc) ----

Folded fold_gather_elements(const Node&, const Inputs&, int64_t);
Folded fold_gather_nd(const Node&, const Inputs&, int64_t);
Folded fold_cumsum(const Node&, const Inputs&, int64_t);

}  // namespace pt::fold_detail
