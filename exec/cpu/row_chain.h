// exec/cpu/row_chain.h: element-wise nodes fused into a row kernel (KernelSpec::prologue and
// ::epilogue): an attention's scale and mask before its Softmax, and the mask's Where and the
// scale after SoftmaxGrad on the way back. A link is an Add, Sub, Mul or Div with one other
// operand, or a Where with a condition and the other branch, every operand broadcast (numpy) to
// the chain's fp32 tensor, which has the kernel's shape. A row kernel applies the links to each
// row of that tensor (the last axis) with the float operation the node's own kernel computes
// per element, so the fused program has the bits of the unfused one, in training programs too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "exec/kernel.h"
#include "exec/kernel_geometry.h"

namespace pt::cpu {

// An operand broadcast over the rows of the chain's tensor, [rows, n]: where row r starts in it,
// and its step along the row (1, or 0 where it broadcasts along the last axis).
class RowOperand {
 public:
  // `shape` broadcast into `out` (right-aligned, each dim 1 or out's); nullopt when it does not.
  static std::optional<RowOperand> make(const Dims& shape, const Dims& out, size_t input);
  int64_t offset(int64_t row) const;
  size_t input = 0;  // its index in run()'s inputs
  int64_t step = 0;

 private:
  // out's leading dims (all but the last), innermost first and merged, and the operand's strides
  // on them
  Dims dims_, strides_;
};

struct RowLink {
  enum class Op { kAdd, kSub, kMul, kDiv, kWhere };
  Op op = Op::kAdd;
  bool second = false;  // the chain's tensor is the second operand (c - x, c / x; Where's else)
  RowOperand other;     // the other operand; Where's other branch
  RowOperand cond;      // Where's condition (bool)
};

// A kernel's epilogue chain (KernelSpec::epilogue and its own epilogues) as row links, in the
// order they apply; their other inputs are run()'s inputs from `next_input` on, which is moved
// past them. nullopt when a link is outside what a row kernel applies.
std::optional<std::vector<RowLink>> epilogue_links(const KernelSpec& s, size_t& next_input);
// The same for a prologue chain (KernelSpec::prologue, nearest first in run()'s inputs): the links
// in the order they apply, the farthest first.
std::optional<std::vector<RowLink>> prologue_links(const KernelSpec& s, size_t& next_input);

// Rows [r0, r1) of the chain's tensor, n elements each, in[0, (r1 - r0) n): out = the links
// applied in order, element by element (`in` may be `out`).
void apply_links(std::span<const RowLink> links, std::span<const Buffer> inputs, int64_t r0, int64_t r1, int64_t n,
                 const float* in, float* out);

}  // namespace pt::cpu
