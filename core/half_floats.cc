#include "core/half_floats.h"

#include <bit>
#include <cstring>

#include "core/error.h"

namespace pt {
namespace {

// q + 1 where the dropped bits `rem` (of a `half`-way point) round q up: nearest, ties to even.
uint32_t round_even(uint32_t q, uint32_t rem, uint32_t half) { return q + (rem > half || (rem == half && (q & 1))); }

}  // namespace

float float16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000 | (man << 13));  // inf, NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
  if (man == 0) return std::bit_cast<float>(sign);
  // Subnormal: man * 2^-24, normalized into float32's exponent.
  exp = 113;
  while (!(man & 0x400)) {
    man <<= 1;
    --exp;
  }
  return std::bit_cast<float>(sign | (exp << 23) | ((man & 0x3FF) << 13));
}

float bfloat16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_float16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFF;
  if (ax > 0x7F800000) return sign | 0x7E00;       // NaN
  if (ax >= 0x477FF000) return sign | 0x7C00;      // from 65520, halfway past 65504: infinity
  if (ax >= 0x38800000) {                          // from 2^-14: a normal float16, exponent rebiased
    const uint32_t r = ax - 0x38000000;
    return static_cast<uint16_t>(sign | round_even(r >> 13, r & 0x1FFF, 0x1000));
  }
  if (ax <= 0x33000000) return sign;               // up to 2^-25, halfway to the least subnormal
  // A subnormal float16: q * 2^-24, with q = m * 2^(e - 150 + 24) of the float's m * 2^(e - 150).
  const uint32_t e = ax >> 23, m = (ax & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - e;
  return static_cast<uint16_t>(sign | round_even(m >> shift, m & ((1u << shift) - 1), 1u << (shift - 1)));
}

uint16_t float_to_bfloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return 0x7FC0;  // NaN
  return static_cast<uint16_t>(round_even(x >> 16, x & 0xFFFF, 0x8000));
}

void widen_halves(DType from, const std::byte* in, int64_t n, float* out) {
  PT_CHECK(is_half(from), std::string("widening ") + dtype_name(from));
  float (*widen)(uint16_t) = from == DType::kFloat16 ? float16_to_float : bfloat16_to_float;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, sizeof h);
    out[i] = widen(h);
  }
}

Tensor widened(const Tensor& t) {
  if (!is_half(t.type.dtype)) return t;
  Tensor out;
  out.type = {DType::kFloat32, t.type.shape};
  out.data.resize(static_cast<size_t>(out.type.bytes()));
  t.load();
  widen_halves(t.type.dtype, t.data.data(), t.type.numel(), reinterpret_cast<float*>(out.data.data()));
  return out;
}

Tensor narrowed(const Tensor& t, DType to) {
  PT_CHECK(t.type.dtype == DType::kFloat32 && is_half(to), "narrowing " + t.type.str() + " to " + dtype_name(to));
  uint16_t (*narrow)(float) = to == DType::kFloat16 ? float_to_float16 : float_to_bfloat16;
  Tensor out;
  out.type = {to, t.type.shape};
  out.data.resize(static_cast<size_t>(out.type.bytes()));
  const float* x = t.as<float>();
  for (int64_t i = 0, n = t.type.numel(); i < n; ++i) {
    const uint16_t h = narrow(x[i]);
    std::memcpy(&out.data[static_cast<size_t>(2 * i)], &h, sizeof h);
  }
  return out;
}

}  // namespace pt
