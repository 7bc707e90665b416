#!/usr/bin/env bash
# Builds the test suite with sanitizers and runs it through ctest. CI (.ci/run, its third part)
# runs `asan` and then `tsan`, as below, with no arguments.
#
#   bash scripts/sanitize.sh asan [CTEST_ARGS...]   AddressSanitizer + UndefinedBehaviorSanitizer,
#                                                   into build-asan/: the whole ctest suite, the
#                                                   CLI tests, the oracle and conformance scripts
#                                                   (which run the instrumented pipetrain) and the
#                                                   fuzz corpus replays included
#   bash scripts/sanitize.sh tsan [CTEST_ARGS...]   ThreadSanitizer, into build-tsan/, building only
#                                                   what it runs: the executor, training and MPI
#                                                   tests (in-process and under mpirun)
#   bash scripts/sanitize.sh asan-configure         configures build-asan/ only (scripts/fuzz.sh)
#
# CTEST_ARGS replace the default selection (e.g. `-R Executor`). The CUDA tests are not built
# (PT_CUDA=OFF: nothing CUDA runs here), so the whole suite is every test but cuda.*.
#
# Every report stops the program (-fno-sanitize-recover=all; halt_on_error), so a report fails its
# test. A report in a process a test starts and whose exit status the test reads as an answer (a
# `pipetrain run` refusal, a partition that does not cut) would not fail it, so every report is
# also written to build-*/sanitizer-reports/ (log_path), and a report there fails the run,
# whatever ctest said; the script prints them.
#
# Under TSan every OpenMP region runs with one thread: libgomp is not instrumented, and its
# barriers would be reported as races (OMP_NUM_THREADS=1); the stages' own threads, the Comms
# (in-process and MPI), the data loaders and the signal handling are what TSan checks.
# Suppressions, each with its reason, are in scripts/sanitize/; none names pipetrain's code.
#
# Measured on the 2-core development machine beside two other engineers' builds (load 2 to 7, so
# slower than CI's own 2 cores), clang 14, -O1 -g, on 5908163:
#   asan build, from nothing, 259 steps: 1153 s at ninja -j1 (the first 512 s beside the tsan build)
#   asan tests, 1062 (all but cuda.*), ctest -j2: 996 s from a fresh tree, 846 s once ctest's cost
#     data ran the longest first (the tests' own times add up to 1986 s); 0 failed, no report
#   tsan build, from nothing, 135 steps: 512 s at ninja -j1
#   tsan tests, 76 (30 of them under mpirun), ctest -j2: 148 s (326 s one at a time); 0 failed,
#     no report, no suppression beyond the OpenMP runtimes'
# The longest under ASan: Planner.NeverSlowerThanTheHandMadeGridAndFasterInHalf 277 s,
# oracle.exports_pytorch 124 s, conformance.onnx_package_run 109 s; none is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true

# clang: it compiles the instrumented code about 2.5x faster than GCC here, and the same build
# makes the libFuzzer targets (tests/fuzz, scripts/fuzz.sh).
PT_EXTRA_APT="clang-14 libclang-rt-14-dev libomp-14-dev" bash scripts/setup.sh --deps-only

# Jobs for ninja and ctest, counted before OMP_NUM_THREADS is set below: nproc honours it, and
# would answer 1 under TSan (which ran its build and its tests one at a time).
jobs=$(nproc)

case "$mode" in
  asan | asan-configure)
    dir=build-asan
    flags=(-DPT_SANITIZE=address,undefined -DPT_FUZZ=ON)
    reports=$PWD/$dir/sanitizer-reports
    export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1:log_path=$reports/report"
    export LSAN_OPTIONS="suppressions=$PWD/scripts/sanitize/lsan.supp:print_suppressions=0:log_path=$reports/report"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/report"
    ;;
  tsan)
    dir=build-tsan
    flags=(-DPT_SANITIZE=thread)
    reports=$PWD/$dir/sanitizer-reports
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/scripts/sanitize/tsan.supp:log_path=$reports/report"
    export OMP_NUM_THREADS=1
    ;;
  *)
    echo "usage: bash scripts/sanitize.sh asan|tsan|asan-configure [CTEST_ARGS...]" >&2
    exit 2
    ;;
esac

# -O1 keeps the instrumented suite fast enough while the reports still point at source lines.
CC=clang-14 CXX=clang++-14 cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DPT_CUDA=OFF -DPT_PYTHON="$PWD/.venv/bin/python" "${flags[@]}" >/dev/null
[ "$mode" = asan-configure ] && exit 0

# The executor, Comm and training tests: the stages' threads, the in-process Comm, data loaders,
# checkpoints, whole `pipetrain train` runs with signals; then the MPI Comm: the executor under
# mpirun (label mpi: mpi.executor_2_ranks, mpi.executor_4_ranks_tcp, mpi.two_hosts_netns, the
# trainer's evaluation and outputs across ranks mpi.trainer_2_ranks) and
# `mpirun -n N pipetrain train` (train_ranks_test). Each GoogleTest case carries its binary's
# name as a label (tests/CMakeLists.txt).
tsan_binaries=(executor_test timeline_test optimizer_test data_test trainer_test train_test train_runs_test
  train_interrupt_test train_ranks_test mpi_executor_test mpi_trainer_test)
tsan_labels=(executor_test timeline_test optimizer_test data_test trainer_test train_test train_runs_test
  train_interrupt_test train_ranks_test mpi)
label_regex() { local IFS='|'; echo "^($*)\$"; }

# Runs ctest, then fails on any report written under $reports, printing each.
run_ctest() {
  rm -rf "$reports"
  mkdir -p "$reports"
  local rc=0 t=$SECONDS
  (cd "$dir" && ctest --output-on-failure -j "$jobs" "$@") || rc=$?
  echo "sanitize: $mode tests: $((SECONDS - t)) s"
  if compgen -G "$reports/report.*" >/dev/null; then
    for f in "$reports"/report.*; do
      echo "sanitize: a $mode report ($f):" >&2
      cat "$f" >&2
    done
    rc=1
  fi
  return "$rc"
}

t=$SECONDS
case "$mode" in
  asan)
    ninja -C "$dir" -j "$jobs"
    echo "sanitize: asan build: $((SECONDS - t)) s"
    if (($#)); then run_ctest --timeout 3000 "$@"; else run_ctest --timeout 3000; fi
    ;;
  tsan)
    ninja -C "$dir" -j "$jobs" pipetrain "${tsan_binaries[@]}"
    echo "sanitize: tsan build: $((SECONDS - t)) s"
    if (($#)); then run_ctest --timeout 3000 "$@"; else run_ctest --timeout 3000 -L "$(label_regex "${tsan_labels[@]}")"; fi
    ;;
esac
