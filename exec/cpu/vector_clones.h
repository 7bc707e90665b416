// exec/cpu/vector_clones.h: the CPU kernels' own element loops, compiled for AVX-512 and for
// AVX2 with FMA as well as for the baseline x86-64 the build targets (oneDNN picks its ISA at
// run time; these loops would otherwise run 4 floats at a time). GCC's target_clones makes one
// copy per target and the loader keeps the widest this CPU runs, once per process, so a machine
// runs the same clone on every call, stage and schedule. The wide clones contract a * b + c into
// one FMA where the baseline rounds twice: their last bits can differ from another machine's.
#pragma once

#include <algorithm>
#include <cstdint>

#include "exec/cpu/parallel.h"

// PT_NO_VECTOR_CLONES (a build for one ISA, e.g. -march=x86-64-v3 to measure the AVX2 path on an
// AVX-512 machine) leaves one copy, compiled for the build's target.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__) && \
    !defined(PT_NO_VECTOR_CLONES)
#define PT_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PT_VECTOR_CLONES
#endif

namespace pt::cpu {

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
