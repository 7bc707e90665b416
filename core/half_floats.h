// core/half_floats.h: float16 and bfloat16, the 16-bit floats Hugging Face checkpoints ship, to
// and from float32. Import widens a file's half weights as a device reads them (core/ir.h
// StoredBytes::file_dtype); the trained model is written back narrowed (cli/train_cmd.cc).
//
// Widening is exact. Narrowing rounds to nearest, ties to even, as PyTorch's `.half()` and
// `.to(torch.bfloat16)` do: past float16's largest finite value (65504) to infinity, below its
// subnormals to a signed zero; NaN to a quiet NaN (float16 0x7E00 with its sign, bfloat16 0x7FC0).
#pragma once

#include <cstdint>

#include "core/ir.h"

namespace pt {

// float16 or bfloat16: a dtype import trains as float32.
inline bool is_half(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

float float16_to_float(uint16_t h);
float bfloat16_to_float(uint16_t h);
uint16_t float_to_float16(float f);
uint16_t float_to_bfloat16(float f);

// n elements of `from` (float16 or bfloat16) at in -> float32 at out.
void widen_halves(DType from, const std::byte* in, int64_t n, float* out);

// A float16 or bfloat16 tensor as float32 (its bytes read first); any other as it is.
Tensor widened(const Tensor& t);
// A float32 tensor rounded to `to` (float16 or bfloat16).
Tensor narrowed(const Tensor& t, DType to);

}  // namespace pt
