// exec/cpu/vector_clones.h: the CPU kernels' own element loops, compiled for AVX-512 and for
// AVX2 with FMA as well as for the baseline x86-64 the build targets (oneDNN picks its ISA at
// run time; these loops would otherwise run 4 floats at a time), two ways:
// - PT_VECTOR_CLONES (GCC's target_clones): one source, one copy per target, the loader keeping
//   the widest this CPU runs; for loops the compiler vectorises alone.
// - on_vector_isa: for loops written with lane_math.h's 16-lane types, whose type must follow
//   the ISA (Vec16, Vec16x2 or Vec16x4): fn(isa) compiled once per ISA, the copy picked at run
//   time by vector_isa(), which PT_MAX_CPU_ISA can cap (the isa_avx2 tests run the AVX2 copies
//   on an AVX-512 machine).
// Either way a process runs the same copy on every call, stage and schedule. The wide copies
// contract a * b + c into one FMA where the baseline rounds twice: their last bits can differ
// from another machine's.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "exec/cpu/lane_math.h"

#include "exec/cpu/parallel.h"

// PT_NO_VECTOR_CLONES (a build for one ISA, e.g. -march=x86-64-v3 to measure the AVX2 path on an
// AVX-512 machine) leaves one copy, compiled for the build's target.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__) && \
    !defined(PT_NO_VECTOR_CLONES)
#define PT_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define PT_VECTOR_COPIES 1
// Every copy rounds a * b + c twice, as the baseline does: for a loop whose bits must equal a
// baseline loop's (nn_channel.cc's channels-last batch norm against the plain one).
#define PT_ROUNDED_TWICE __attribute__((optimize("fp-contract=off")))
#else
#define PT_VECTOR_CLONES
#define PT_ROUNDED_TWICE
#endif

namespace pt::cpu {

enum class VectorIsa { kBaseline, kAvx2, kAvx512 };

// The widest of on_vector_isa's copies this CPU runs, or a narrower one where PT_MAX_CPU_ISA
// says (avx2, sse2; as small_product.cc's copies). A kernel asks once, when it is made; a build
// for one ISA has one copy, its own.
inline VectorIsa vector_isa() {
#if defined(PT_VECTOR_COPIES)
  std::string cap = std::getenv("PT_MAX_CPU_ISA") ? std::getenv("PT_MAX_CPU_ISA") : "";
  std::transform(cap.begin(), cap.end(), cap.begin(), [](unsigned char c) { return std::tolower(c); });
  __builtin_cpu_init();
  if ((cap.empty() || cap.rfind("avx512", 0) == 0) && __builtin_cpu_supports("x86-64-v4")) return VectorIsa::kAvx512;
  if (cap != "sse2" && __builtin_cpu_supports("x86-64-v3")) return VectorIsa::kAvx2;
  return VectorIsa::kBaseline;
#elif defined(__AVX512F__)
  return VectorIsa::kAvx512;
#elif defined(__AVX2__) && defined(__FMA__)
  return VectorIsa::kAvx2;
#else
  return VectorIsa::kBaseline;
#endif
}

// fn(IsaAvx512{}), fn(IsaAvx2{}) or fn(IsaBaseline{}) (lane_math.h) as isa says, each compiled
// for its ISA. fn and every vector helper it calls must be always_inline (a lambda:
// __attribute__((always_inline)) after its parameters), or they are compiled for the baseline.
#if defined(PT_VECTOR_COPIES)
template <class Fn>
[[gnu::target("arch=x86-64-v4")]] void on_avx512(const Fn& fn) {
  fn(IsaAvx512{});
}
template <class Fn>
[[gnu::target("arch=x86-64-v3")]] void on_avx2(const Fn& fn) {
  fn(IsaAvx2{});
}
template <class Fn>
void on_baseline(const Fn& fn) {
  fn(IsaBaseline{});
}
template <class Fn>
void on_vector_isa(VectorIsa isa, const Fn& fn) {
  switch (isa) {
    case VectorIsa::kAvx512: return on_avx512(fn);
    case VectorIsa::kAvx2: return on_avx2(fn);
    case VectorIsa::kBaseline: return on_baseline(fn);
  }
}
#else
// One copy, for the ISA the build targets.
template <class Fn>
void on_vector_isa(VectorIsa, const Fn& fn) {
#if defined(__AVX512F__)
  fn(IsaAvx512{});
#elif defined(__AVX2__) && defined(__FMA__)
  fn(IsaAvx2{});
#else
  fn(IsaBaseline{});
#endif
}
#endif

// Elements per block of for_blocks: a few pages of each operand, enough to amortise the call.
inline constexpr int64_t kVectorBlock = 4096;

// fn(begin, end) over [0, n) in blocks of kVectorBlock, the blocks split between `threads`
// threads when n reaches parallel_min (each thread a run of whole blocks, so a block's
// elements are done by one clone call whatever the thread count); below it no OpenMP region
// is entered (parallel_for).
template <class Fn>
void for_blocks(int64_t n, int threads, int64_t parallel_min, Fn fn) {
  const int64_t blocks = (n + kVectorBlock - 1) / kVectorBlock;
  parallel_for(blocks, threads, n >= parallel_min,
               [&](int64_t b) { fn(b * kVectorBlock, std::min(n, (b + 1) * kVectorBlock)); });
}

}  // namespace pt::cpu
