#!/usr/bin/env bash
# Runs the libFuzzer targets (tests/fuzz) for a given time each, as many at once as there are
# cores, and prints one line per target.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]     SECONDS defaults to 30 (CI's smoke); TARGETs to
#                                                  all: model config schedule_csv npy tokens checkpoint
#                                                  safetensors
#
# The targets are built by scripts/sanitize.sh's ASan + UBSan build (build-asan/, clang, PT_FUZZ=ON).
# Each starts from the committed corpus (tests/fuzz/corpus/TARGET, read only) and keeps what it
# finds in build-asan/fuzz/corpus/TARGET; an input that crashes lands in
# build-asan/fuzz/crashes/TARGET/ and fails the run. A crash, once fixed, goes into the committed
# corpus as regress-WHAT, where ctest's fuzz.replay_TARGET replays it in every build.
# Runs from the repository root: the config seeds name samples/... relative to it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(model config schedule_csv npy tokens checkpoint safetensors)

dir=build-asan
if [ ! -f "$dir/CMakeCache.txt" ] || ! grep -q '^PT_FUZZ:BOOL=ON' "$dir/CMakeCache.txt"; then
  bash scripts/sanitize.sh asan-configure
fi
ninja -C "$dir" -j "$(nproc)" $(printf 'fuzz_%s ' "${targets[@]}") >/dev/null

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# One target: fuzz it, then write its summary line to $dir/fuzz/$t.line.
fuzz_one() {
  local t=$1 work=$dir/fuzz/corpus/$1 crashes=$dir/fuzz/crashes/$1 log=$dir/fuzz/$1.log rc=0
  mkdir -p "$work" "$crashes"
  # -timeout: an input that takes longer is a hang, reported as a crash. -rss_limit_mb: the
  # readers refuse what would not fit; none needs 2 GiB for an input of at most max_len bytes.
  "$dir/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  local execs rate found
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log" | tail -1)
  rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$log" | tail -1)
  found=$(find "$crashes" -type f | wc -l)
  printf '%-13s %8s %12s %9s %7s %8s %s\n' "$t" "$seconds" "${execs:-?}" "${rate:-?}" "$found" \
    "$(find "$work" -type f | wc -l)" "$rc" >"$dir/fuzz/$t.line"
}

# As many targets at once as there are cores, each on one.
running=0
for t in "${targets[@]}"; do
  fuzz_one "$t" &
  running=$((running + 1))
  if ((running >= $(nproc))); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=0
printf '%-13s %8s %12s %9s %7s %8s\n' target seconds executions "exec/s" crashes corpus
for t in "${targets[@]}"; do
  read -r name secs execs rate found corpus rc <"$dir/fuzz/$t.line"
  printf '%-13s %8s %12s %9s %7s %8s\n' "$name" "$secs" "$execs" "$rate" "$found" "$corpus"
  if ((rc != 0 || found != 0)); then
    failed=1
    echo "fuzz: $t stopped with status $rc; the input is in $dir/fuzz/crashes/$t, the report in $dir/fuzz/$t.log:" >&2
    grep -a -m 5 -E "ERROR|fuzz: |SUMMARY|terminate|internal error" "$dir/fuzz/$t.log" >&2 || tail -5 "$dir/fuzz/$t.log" >&2
    grep -a -A1 -m 1 "fuzz: a rejection" "$dir/fuzz/$t.log" | tail -1 >&2 || true
  fi
done
exit "$failed"
