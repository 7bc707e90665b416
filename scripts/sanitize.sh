#!/usr/bin/env bash
# Builds the test suite with sanitizers and runs it through ctest.
#
#   bash scripts/sanitize.sh asan [CTEST_ARGS...]   AddressSanitizer + UndefinedBehaviorSanitizer,
#                                                   into build-asan/; the whole suite by default
#   bash scripts/sanitize.sh tsan [CTEST_ARGS...]   ThreadSanitizer, into build-tsan/; by default
#                                                   the executor, Comm and training tests
#   bash scripts/sanitize.sh asan-ci                what CI runs: the ASan + UBSan build of the
#                                                   unit and executor tests (no Python oracles)
#                                                   and the fuzz targets' corpus replays
#   bash scripts/sanitize.sh asan-configure         configures build-asan/ only (scripts/fuzz.sh)
#
# Every report stops the program (-fno-sanitize-recover=all; halt_on_error), so a report fails its
# test. The CUDA backend is left out (nothing CUDA runs here). Under TSan every OpenMP region runs
# with one thread: libgomp is not instrumented, and its barriers would be reported as races
# (OMP_NUM_THREADS=1); the stages' own threads, the Comm and the data loaders are what TSan checks.
# Suppressions, each with its reason, are in scripts/sanitize/.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true

# clang: it compiles the instrumented code about 2.5x faster than GCC here, and the same build
# makes the libFuzzer targets (tests/fuzz, scripts/fuzz.sh).
PT_EXTRA_APT="clang-14 libclang-rt-14-dev libomp-14-dev" bash scripts/setup.sh --deps-only

case "$mode" in
  asan | asan-ci | asan-configure)
    dir=build-asan
    flags=(-DPT_SANITIZE=address,undefined -DPT_FUZZ=ON)
    export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1"
    export LSAN_OPTIONS="suppressions=$PWD/scripts/sanitize/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
    ;;
  tsan)
    dir=build-tsan
    flags=(-DPT_SANITIZE=thread)
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/scripts/sanitize/tsan.supp"
    export OMP_NUM_THREADS=1
    ;;
  *)
    echo "usage: bash scripts/sanitize.sh asan|tsan|asan-ci|asan-configure [CTEST_ARGS...]" >&2
    exit 2
    ;;
esac

# -O1 keeps the instrumented suite fast enough while the reports still point at source lines.
CC=clang-14 CXX=clang++-14 cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DPT_CUDA=OFF -DPT_PYTHON="$PWD/.venv/bin/python" "${flags[@]}" >/dev/null

# The unit and executor tests: every GoogleTest binary of the libraries below the CLI, and the
# executor's in-process and MPI runs. The CLI tests run the pipetrain binary end to end (minutes
# each under ASan) and come with the whole suite.
ci_targets=(core_test partition_test fold_test import_test sequence_fold_test module_params_test
  draw_rewrite_test partitioner_test memory_plan_test stage_program_test grad_kernels_test
  exec_elementwise_test exec_linalg_test exec_nn_test exec_movement_test autodiff_grad_rules_test
  autodiff_backward_test autodiff_training_mode_test exec_training_kernels_test executor_test
  timeline_test optimizer_test config_test data_test safetensors_test)
# The executor, Comm and training tests: the stages' threads, the in-process Comm, data loaders,
# checkpoints and the whole `pipetrain train` runs.
tsan_targets=(executor_test timeline_test optimizer_test data_test train_test train_runs_test
  train_interrupt_test)
label_regex() { local IFS='|'; echo "^($*)\$"; }

cd "$dir"
case "$mode" in
  asan-configure) ;;
  asan-ci)
    replays=(replay_model replay_config replay_schedule_csv replay_npy replay_tokens replay_checkpoint)
    ninja -j "$(nproc)" "${ci_targets[@]}" "${replays[@]}"
    ctest --output-on-failure -j "$(nproc)" -R '^fuzz\.replay_' "$@"
    # Each GoogleTest case carries its binary's name as a label (tests/CMakeLists.txt).
    ctest --output-on-failure -j "$(nproc)" --timeout 1500 -L "$(label_regex "${ci_targets[@]}")" "$@"
    ;;
  asan)
    ninja -j "$(nproc)"
    ctest --output-on-failure -j "$(nproc)" --timeout 3000 "$@"
    ;;
  tsan)
    ninja -j "$(nproc)" pipetrain "${tsan_targets[@]}"
    if (($#)); then
      ctest --output-on-failure -j "$(nproc)" --timeout 3000 "$@"
    else
      ctest --output-on-failure -j "$(nproc)" --timeout 3000 -L "$(label_regex "${tsan_targets[@]}")"
    fi
    ;;
esac
