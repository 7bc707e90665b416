// exec/cpu/parallel.h: the CPU kernels' parallel loops. In: a trip count, the kernel's thread
// count and whether its data is large enough to split. Out: fn(i) called for every i.
#pragma once

#include <cstdint>

namespace pt::cpu {

// fn(i) for every i in [0, n): split statically between `threads` threads when `parallel` (and
// threads > 1), else a plain loop on this thread. Entering an OpenMP region costs ~0.4 us even
// when its if clause keeps it on one thread (libgomp makes a team of one: on the Zen 5 VM, a
// third of a small kernel's whole time), so a loop that stays on one thread does not enter one.
// Each i is done whole by one thread, so a result that depends only on i is the same whatever
// the thread count.
template <class Fn>
void parallel_for(int64_t n, int threads, bool parallel, Fn fn) {
  if (!parallel || threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace pt::cpu
