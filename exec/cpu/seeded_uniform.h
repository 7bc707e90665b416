// exec/cpu/seeded_uniform.h: the counter-based generator behind SeededDropout and SeededBernoulli
// (core/pipetrain_ops.h). Each draw is a pure function of (key, stream, index): no state, so a
// mask is the same whichever thread, schedule or recompute draws it.
//   mix(z)      splitmix64's finaliser (a bijection of 64-bit words)
//   base        mix(key ^ mix(stream))
//   u(i)        (mix(base + (i + 1) * G) >> 40) / 2^24, G = 0x9e3779b97f4a7c15: the i-th draw of
//               splitmix64 started at base, its top 24 bits as a float in [0, 1) (exact in fp32)
#pragma once

#include <cstdint>

namespace pt::cpu {

inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr uint64_t seeded_base(int64_t key, int64_t stream) {
  return mix64(static_cast<uint64_t>(key) ^ mix64(static_cast<uint64_t>(stream)));
}

// u(i) for a base from seeded_base.
constexpr float seeded_uniform(uint64_t base, int64_t i) {
  const uint64_t r = mix64(base + (static_cast<uint64_t>(i) + 1) * kGolden);
  return static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
}

}  // namespace pt::cpu
