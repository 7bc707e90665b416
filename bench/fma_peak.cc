// bench/fma_peak.cc: the cores' fp32 multiply-add peak, the ceiling every matmul rate in the
// docs/measured.md is measured against.
//
//   fma_peak [THREADS]
// Each of THREADS OpenMP threads runs 12 independent chains of vector FMAs (AVX-512 where the CPU
// has it, else AVX2), enough to cover the FMA latency on current x86 cores; prints GFLOP/s per
// thread and in all, the best of five runs.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr long kIterations = 100'000'000;

// 12 chains x `lanes` floats x 2 FLOPs per iteration, written once for both vector widths. The
// chains' sum is returned so that the compiler keeps every one.
#define PT_FMA_CHAINS(Vec, set, fma, sum)                                                            \
  Vec a0 = set(0), a1 = set(1), a2 = set(2), a3 = set(3), a4 = set(4), a5 = set(5);                \
  Vec a6 = set(6), a7 = set(7), a8 = set(8), a9 = set(9), a10 = set(10), a11 = set(11);            \
  const Vec b = set(0.999999f), c = set(1e-7f);                                                      \
  for (long i = 0; i < kIterations; ++i) {                                                           \
    a0 = fma(a0, b, c), a1 = fma(a1, b, c), a2 = fma(a2, b, c), a3 = fma(a3, b, c);                \
    a4 = fma(a4, b, c), a5 = fma(a5, b, c), a6 = fma(a6, b, c), a7 = fma(a7, b, c);                \
    a8 = fma(a8, b, c), a9 = fma(a9, b, c), a10 = fma(a10, b, c), a11 = fma(a11, b, c);            \
    __asm__ volatile("" ::: "memory");                                                               \
  }                                                                                                  \
  return sum(a0) + sum(a1) + sum(a2) + sum(a3) + sum(a4) + sum(a5) + sum(a6) + sum(a7) + sum(a8) + \
         sum(a9) + sum(a10) + sum(a11);

// The lanes' sum, read through memory (GCC 12's _mm512_reduce_add_ps warns of an uninitialised
// temporary).
template <class Vec>
float lane_total(const Vec& a) {
  float v[sizeof(Vec) / sizeof(float)];
  std::memcpy(v, &a, sizeof v);
  float total = 0;
  for (float x : v) total += x;
  return total;
}

__attribute__((target("avx512f"))) float run512() {
  PT_FMA_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, lane_total)
}
__attribute__((target("avx2,fma"))) float run256() {
  PT_FMA_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, lane_total)
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  if (threads < 1) {
    std::fprintf(stderr, "usage: fma_peak [THREADS]\n");
    return 2;
  }
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 && !__builtin_cpu_supports("fma")) {
    std::fprintf(stderr, "error: this CPU has no FMA instructions\n");
    return 2;
  }
  const int lanes = avx512 ? 16 : 8;
  double best = 0, sink = 0;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += avx512 ? run512() : run256();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 12.0 * lanes * 2 * kIterations * threads / s / 1e9);
  }
  // The chains' results are printed (as a checksum) so that none is optimised away.
  std::printf("%s FMA peak: %.1f GFLOP/s per thread, %.1f in all on %d thread(s) (checksum %.3g)\n",
              avx512 ? "AVX-512" : "AVX2", best / threads, best, threads, sink);
  return 0;
}
