#!/usr/bin/env bash
# scripts/gpu_check.sh: checks the CUDA backend on a GPU machine and prints its figures.
#
#   scripts/gpu_check.sh pack [BUILD_DIR]   here, after building with PT_CUDA=ON (default
#                                           build-cuda): writes build-gpu-pack/pack.tar.xz with
#                                           the binaries and the shared libraries a bare GPU
#                                           machine lacks (at most 60 MiB)
#   scripts/gpu_check.sh run [PART ...]     on the GPU machine, from the repository root with
#                                           build-gpu-pack/ beside it; PARTs: 1 to 4 below (all
#                                           by default); PT_GPU_OUT=DIR keeps the logs there;
#                                           PT_TRAIN_PROFILE=1 adds part 4's --profile tables
#
# The GPU machine (H100/H200, CUDA 13, python3 with torch and numpy, no package registries)
# supplies cuBLAS, cublasLt, cuDNN 9 and NCCL 2 itself: from the CUDA toolkit or from the NVIDIA
# wheels torch depends on. `run` finds them, puts them after the carried libraries on
# LD_LIBRARY_PATH (for our binaries only), and then:
#   1. every CUDA kernel against the CPU kernel on the same inputs (tests/exec/cuda: fp32 within
#      1e-4 relative, bf16 within its stated bound, bitwise repeatable), one training step of
#      every sample model against the CPU's, the backend's memory and fault tests, the GPU comms,
#      the pipeline executor on CUDA (every schedule kind at 1 and 2 stages on GPU 0 bit-identical
#      to 1 stage, close to the CPU executor); no comparison may be SKIPPED on a GPU machine (the
#      two-GPU comm tests excepted where there is one GPU); then the per-kernel figures
#   2. bench/gpu_bench: the kernels at model sizes, GPU against CPU
#   3. `pipetrain train` of mlp, resnet, gpt and vit for 3 steps on synthetic data, on the CPU
#      and on CUDA (cli/config.h's `device:`) at 1 stage (`device=cuda`), 2 stages (1f1b,
#      `device=cuda`: stage d on GPU d mod the GPUs found, NCCL between two GPUs) and 2 stages x
#      2 chunks (zb-v, `device=cuda:0`: both stages on GPU 0, peer copies):
#      every CUDA run's trained model within 1e-3 (relative to each tensor's largest value) of
#      the CPU run's, and the multi-stage CUDA runs bit-identical to the 1-stage CUDA run (the
#      determinism contract), compared by bench/gpu_compare.py; gpt stopped after 2 steps and
#      resumed from its checkpoint bit-identical too; and `precision: bf16` and `fp16` at 1
#      stage, their training updates within BF16_UPDATE_TOL of the fp32 run's (bf16 with AdamW:
#      BF16_ADAMW_UPDATE_TOL); with step times
#   4. bench/gpu_train.py: the charlm model's training step against PyTorch eager on the same GPU
#      (fp32 and bf16), and the fraction of the GPU's peak FLOP/s it reaches
#   5. `mpirun -n 2 pipetrain train` on CUDA, rank r on GPU r mod the GPUs found (one GPU: both
#      share it, messages through host memory and MPI; two: NCCL between them) (mlp and gpt;
#      under the Open MPI runtime packed by scripts/mpi_runtime.sh, the one the binaries link): 2 ranks x 1
#      stage bit-identical to one process with 2 stages, and 2 data-parallel replicas within 1e-5
#      of one process on the same global batch; with step times
# A test binary that crashes or hangs names its test and runs again without it.
# Prints PASS/FAIL per part and exits 1 when any part fails (2: the machine is not usable).
set -uo pipefail
cd "$(dirname "$0")/.."

PACK_DIR=build-gpu-pack
BINARIES=(pipetrain tests/cuda_kernels_test tests/cuda_backend_test tests/cuda_model_test tests/gpu_comm_test
          tests/cuda_executor_test bench/gpu_bench)
# Found on the GPU machine, never carried (hundreds of MiB; the driver's libcuda is the machine's).
MACHINE_LIBS=(libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2)
SYSTEM_LIBS_RE='^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libcuda|libcublas|libcublasLt|libcudnn.*|libnccl)\.so'

pack() {
  local build="${1:-build-cuda}"
  rm -rf "$PACK_DIR/stage" && mkdir -p "$PACK_DIR/stage/bin" "$PACK_DIR/stage/lib"
  for b in "${BINARIES[@]}"; do
    [ -x "$build/$b" ] || { echo "pack: $build/$b missing; build with PT_CUDA=ON first"; exit 2; }
    cp "$build/$b" "$PACK_DIR/stage/bin/" && strip --strip-unneeded "$PACK_DIR/stage/bin/$(basename "$b")"
  done
  local libs
  libs=$(for b in "${BINARIES[@]}"; do ldd "$build/$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
  for l in $libs; do
    basename "$l" | grep -Eq "$SYSTEM_LIBS_RE" && continue
    cp -L "$l" "$PACK_DIR/stage/lib/" && strip --strip-unneeded "$PACK_DIR/stage/lib/$(basename "$l")" 2>/dev/null
  done
  local count
  count=$(ls "$PACK_DIR/stage/lib" | wc -l)
  scripts/mpi_runtime.sh pack "$PACK_DIR/stage/mpi" || exit 2  # for part 5 where there is no mpirun
  tar -C "$PACK_DIR/stage" -cJf "$PACK_DIR/pack.tar.xz" bin lib mpi
  rm -rf "$PACK_DIR/stage"
  local size
  size=$(stat -c %s "$PACK_DIR/pack.tar.xz")
  echo "pack: $PACK_DIR/pack.tar.xz, $((size / 1048576)) MiB: ${#BINARIES[@]} binaries, $count libraries"
  [ "$size" -le $((60 * 1048576)) ] || { echo "pack: over 60 MiB"; exit 2; }
}

# Directories holding each of MACHINE_LIBS on this machine, one per line.
machine_lib_dirs() {
  local roots=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/lib
               /usr/lib/x86_64-linux-gnu /usr/local/lib)
  local site
  site=$(python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
  for s in $site; do [ -d "$s/nvidia" ] && roots+=("$s/nvidia"); [ -d "$s/torch/lib" ] && roots+=("$s/torch/lib"); done
  for lib in "${MACHINE_LIBS[@]}"; do
    local found=""
    for r in "${roots[@]}"; do
      [ -d "$r" ] || continue
      found=$(find -L "$r" -maxdepth 4 -name "$lib" -print -quit 2>/dev/null)
      [ -n "$found" ] && break
    done
    [ -n "$found" ] && dirname "$found" || echo "MISSING:$lib"
  done | awk '!seen[$0]++'
}

# Runs test binary $2 with a time limit; a test that crashes or hangs is named, and the binary is
# run again without it (at most 8 times), so one fault does not hide the other tests' results.
# Then checks the JSON report: nothing failed, nothing skipped on a GPU machine (two-GPU tests
# excepted where there is one GPU).
run_tests() {
  local work="$1" t="$2" gpus="$3" filter="" lost=() attempt rc=0 last
  for attempt in 1 2 3 4 5 6 7 8; do
    PT_CUDA_FIGURES="$work/kernels_${t}_$attempt.csv" timeout -k 5 "${PT_TEST_TIMEOUT:-300}" \
      env LD_LIBRARY_PATH="$PT_LIB_PATH" "$PT_BIN/$t" --gtest_output="json:$work/${t}_$attempt.json" \
      ${filter:+--gtest_filter="-$filter"} >"$work/${t}_$attempt.log" 2>&1
    rc=$?
    grep -E '^\[  FAILED  \] [A-Za-z]' "$work/${t}_$attempt.log" | head -20 | sed 's/^/    /'
    [ -s "$work/${t}_$attempt.json" ] && break
    # No report: the binary died (a signal, an abort) or hung; its last started test is named.
    last=$(grep -E '^\[ RUN      \]' "$work/${t}_$attempt.log" | tail -1 | awk '{print $4}')
    if [ -z "$last" ]; then
      echo "    $t: no test started (exit $rc)"; tail -5 "$work/${t}_$attempt.log" | sed 's/^/    /'; return 1
    fi
    if ((rc == 124 || rc == 137)); then echo "    $t: $last hung (killed at the time limit)"
    else echo "    $t: $last crashed (exit $rc):"; fi
    grep -v -E '^\[' "$work/${t}_$attempt.log" | tail -4 | sed 's/^/      /'
    lost+=("$last")
    filter="${filter:+$filter:}$last"
  done
  cat "$work/${t}"_*.log >"$work/$t.log"
  python3 - "$t" "$gpus" "${#lost[@]}" "$work/${t}_$attempt.json" <<'EOF'
import json, sys
name, gpus, lost = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    report = json.load(open(sys.argv[4]))
except (OSError, ValueError):
    report = {"testsuites": []}
cases = [c for s in report["testsuites"] for c in s["testsuite"]]
failed = [c["name"] for c in cases if c.get("failures")]
skipped = [f"{c['classname']}.{c['name']}" for c in cases if c.get("result") == "SKIPPED"]
allowed = [s for s in skipped if gpus < 2 and "TwoGpus" in s]
bad = [s for s in skipped if s not in allowed]
print(f"  {name}: {len(cases) + lost} tests, {len(failed) + lost} failed"
      + (f" ({lost} crashed or hung)" if lost else "") + f", {len(skipped)} skipped"
      + (f" ({len(allowed)} need two GPUs)" if allowed else ""))
for s in bad[:10]:
    print(f"    skipped on a GPU machine: {s}")
sys.exit(1 if failed or bad or lost else 0)
EOF
}

part() { printf '\n==== %s\n' "$*"; }

run() {
  [ -f "$PACK_DIR/pack.tar.xz" ] || { echo "run: $PACK_DIR/pack.tar.xz missing (scripts/gpu_check.sh pack, then carry $PACK_DIR)"; exit 2; }
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  local work
  work=$(mktemp -d /tmp/gpu_check.XXXXXX)
  tar -C "$work" -xJf "$PACK_DIR/pack.tar.xz"
  local dirs missing
  dirs=$(machine_lib_dirs)
  missing=$(echo "$dirs" | grep '^MISSING:' | cut -d: -f2 | tr '\n' ' ')
  [ -z "$missing" ] || { echo "run: not found on this machine: $missing"; exit 2; }
  local lib_path="$work/lib:$(echo "$dirs" | paste -sd:)"
  echo "libraries: $lib_path"
  export PT_BIN="$work/bin" PT_LIB_PATH="$lib_path"
  bin() {
    local b="$1"
    shift
    LD_LIBRARY_PATH="$PT_LIB_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PT_BIN/$b" "$@"
  }
  if ! bin cuda_kernels_test --gtest_list_tests >/dev/null 2>"$work/ldd.err"; then
    echo "run: the binaries do not start here:"; cat "$work/ldd.err"; ldd --version | head -1; exit 2
  fi
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  [ "${gpus:-0}" -ge 1 ] || { echo "run: no GPU"; exit 2; }
  local failed=()

  local parts="${*:-1 2 3 4 5}"
  # Whatever happens, the logs go to $PT_GPU_OUT when it is set (the device tool's $OUT).
  GPU_CHECK_WORK="$work"
  trap '[ -n "${PT_GPU_OUT:-}" ] && tar -C "$GPU_CHECK_WORK" -czf "$PT_GPU_OUT/gpu_check_logs.tar.gz" --exclude=bin --exclude=lib --exclude="*.onnx" . 2>/dev/null' EXIT

  if [[ " $parts " == *" 1 "* ]]; then
  part "1. CUDA kernels against the CPU kernels, backend, comms ($gpus GPU(s))"
  for t in cuda_kernels_test cuda_backend_test cuda_model_test gpu_comm_test cuda_executor_test; do
    run_tests "$work" "$t" "$gpus" || failed+=("$t")
  done
  cat "$work"/kernels_*.csv 2>/dev/null | awk 'NR == 1 || !/^case,/' >"$work/kernels.csv"
  if [ -s "$work/kernels.csv" ]; then
    python3 - "$work/kernels.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
worst = max(rows, key=lambda r: float(r["worst_error_fraction"]))
print(f"  {len(rows)} kernel cases; worst error {float(worst['worst_error_fraction']):.3f} of the "
      f"allowed in {worst['case']}")
print(f"  {'case':48s} {'error/allowed':>13s} {'cpu us':>9s} {'cuda us':>9s}")
for r in sorted(rows, key=lambda r: -float(r["worst_error_fraction"]))[:15]:
    print(f"  {r['case']:48s} {float(r['worst_error_fraction']):13.3f} {float(r['cpu_us']):9.1f} "
          f"{float(r['cuda_us']):9.1f}")
EOF
  fi
  fi

  if [[ " $parts " == *" 4 "* ]]; then
  part "4. training step against PyTorch eager on this GPU (bench/gpu_train.py)"
  timeout -k 5 "${PT_TRAIN_BENCH_TIMEOUT:-240}" env LD_LIBRARY_PATH="$PT_LIB_PATH" PYTHONUNBUFFERED=1 \
    python3 bench/gpu_train.py --pipetrain "$PT_BIN/pipetrain" --json "$work/gpu_train.json" ${PT_TRAIN_PROFILE:+--profile} || failed+=(gpu_train)
  fi

  if [[ " $parts " == *" 2 "* ]]; then
  part "2. kernels at model sizes (bench/gpu_bench)"
  timeout -k 5 120 env LD_LIBRARY_PATH="$PT_LIB_PATH" "$PT_BIN/gpu_bench" --runs 10 || failed+=(gpu_bench)
  fi

  if [[ " $parts " == *" 3 "* ]]; then
  part "3. pipetrain train: CUDA against CPU (3 steps, synthetic data)"
  printf '  %-8s %-22s %10s  %s\n' model run "s/step" "trained model"
  train_all "$work" || failed+=(train)
  fi

  if [[ " $parts " == *" 5 "* ]]; then
  part "5. pipetrain train across 2 processes (mpirun): $([ "$gpus" -ge 2 ] && echo "GPUs 0 and 1, NCCL" || echo "sharing GPU 0, MPI")"
  # The packed runtime, whatever MPI the machine has: the binaries link this Open MPI's libmpi.
  eval "$(scripts/mpi_runtime.sh env "$work/mpi")"
  PT_MPI_DIR="$work/mpi"
  printf '  %-8s %-22s %10s  %s\n' model run "s/step" "trained model"
  ranks_all "$work" || failed+=(ranks)
  fi

  part "summary"
  if ((${#failed[@]})); then echo "FAIL: ${failed[*]}"; exit 1; fi
  echo "PASS"
}

# sample: batch micro_batches loss optimizer (as tests/oracle/train_vs_torch.py's SAMPLES)
declare -A SAMPLE=(
  [mlp]="2 4 cross_entropy {kind: adamw, lr: 0.01, weight_decay: 0.1, clip_grad_norm: 0.5}"
  [resnet]="2 4 cross_entropy {kind: sgd, lr: 0.01, momentum: 0.9, nesterov: true, weight_decay: 5.0e-4}"
  [gpt]="1 4 cross_entropy {kind: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.01, clip_grad_norm: 0.5}"
  [vit]="1 4 mse {kind: sgd, lr: 0.01, momentum: 0.9, weight_decay: 0.01}"
)

# precision: bf16 (GEMM inputs rounded to bf16, 8 significant bits, fp32 accumulation) against
# fp32 after 3 steps: the updates may differ by this fraction (gpu_compare.py --update-from);
# fp16 (11 significant bits) is held to the same. AdamW (the mlp sample) takes a step of about lr
# per element whatever its gradient's size, so an element whose gradient lies within the
# rounding of 0 changes sign: its update error grows with the rounding (H200, 3 steps: fp16
# 0.012, bf16 0.111), and the mlp's bf16 run is held to BF16_ADAMW_UPDATE_TOL.
BF16_UPDATE_TOL=0.05
BF16_ADAMW_UPDATE_TOL=0.15

train_all() {
  local work="$1" ok=0
  for s in mlp resnet gpt vit; do
    read -r batch mb loss optimizer <<<"${SAMPLE[$s]}"
    write_config "$work" "$s"
    train_one "$work" "$s" cpu "device=cpu" || { ok=1; continue; }
    printf '  %-8s %-22s %10s  (reference)\n' "$s" cpu "$RUN_SECONDS"
    train_one "$work" "$s" cuda1 "device=cuda" && compare "$work" "$s" cuda1 cpu --tol 1e-3 || ok=1
    local bf16_tol=$BF16_UPDATE_TOL
    [[ "$optimizer" == *adamw* ]] && bf16_tol=$BF16_ADAMW_UPDATE_TOL
    train_one "$work" "$s" cuda_bf16 "device=cuda" "precision=bf16" &&
      compare "$work" "$s" cuda_bf16 cuda1 --update-from "samples/$s/$s.onnx" --tol "$bf16_tol" || ok=1
    train_one "$work" "$s" cuda_fp16 "device=cuda" "precision=fp16" &&
      compare "$work" "$s" cuda_fp16 cuda1 --update-from "samples/$s/$s.onnx" --tol "$BF16_UPDATE_TOL" || ok=1
    train_one "$work" "$s" cuda2 "device=cuda" "pipeline.stages=2" &&
      compare "$work" "$s" cuda2 cuda1 --exact || ok=1
    train_one "$work" "$s" cuda_zbv "device=cuda:0" "pipeline.stages=2" "pipeline.chunks=2" "pipeline.schedule=zb-v" &&
      compare "$work" "$s" cuda_zbv cuda1 --exact || ok=1
  done
  # The optimizer's state lives on the GPU (device updates): 2 steps with checkpoints, then
  # --resume to the third give the bits of 3 steps in one run.
  rm -rf "$work/ckpt_gpt"
  train_one "$work" gpt cuda_resume "device=cuda" "steps=2" "checkpoint.dir=$work/ckpt_gpt" "checkpoint.every=1" &&
    RESUME=1 train_one "$work" gpt cuda_resume "device=cuda" "checkpoint.dir=$work/ckpt_gpt" "checkpoint.every=1" &&
    compare "$work" gpt cuda_resume cuda1 --exact || ok=1
  return $ok
}

# The 3-step config of sample $2 ($batch $mb $loss $optimizer from SAMPLE) as $1/$2.yaml.
write_config() {
  local work="$1" s="$2"
  read -r batch mb loss optimizer <<<"${SAMPLE[$s]}"
  cat >"$work/$s.yaml" <<EOF
model: samples/$s/$s.onnx
dims: {batch: $batch}
loss: {kind: $loss}
data: {kind: synthetic, samples: $((batch * mb * 2)), shuffle: false}
optimizer: $optimizer
pipeline: {stages: 1, chunks: 1, micro_batches: $mb, schedule: 1f1b}
device: cpu
threads: 4
seed: 0
steps: 3
EOF
}

# Part 5: per sample, one process with 2 stages on GPU 0, then 2 ranks (one stage each, both on
# GPU 0, messages through host memory and MPI): the same bits; 2 data-parallel replicas against
# one process running both replicas' micro-batches.
ranks_all() {
  local work="$1" ok=0
  for s in mlp gpt; do
    read -r batch mb loss optimizer <<<"${SAMPLE[$s]}"
    [ -f "$work/$s.yaml" ] || write_config "$work" "$s"
    train_one "$work" "$s" cuda2 "device=cuda:0" "pipeline.stages=2" || { ok=1; continue; }
    printf '  %-8s %-22s %10s  (reference)\n' "$s" "cuda2" "$RUN_SECONDS"
    RANKS=2 train_one "$work" "$s" ranks2 "device=cuda" "pipeline.stages=2" &&
      compare "$work" "$s" ranks2 cuda2 --exact || ok=1
    train_one "$work" "$s" cuda_mb2 "device=cuda:0" "pipeline.micro_batches=$((mb * 2))" || { ok=1; continue; }
    RANKS=2 train_one "$work" "$s" data2 "device=cuda" "parallel.data=2" &&
      compare "$work" "$s" data2 cuda_mb2 --tol 1e-5 || ok=1
  done
  return $ok
}

# Trains sample $2 as run $3 with the --set overrides after it; prints the time per step.
# RANKS=N: under mpirun -n N; RESUME=1: with --resume.
train_one() {
  local work="$1" s="$2" name="$3"
  shift 3
  # Under mpirun the packed Open MPI's libraries come first: the machine's own (hwloc, libevent,
  # PMIx of other versions) must not stand in for them.
  local libs="$PT_LIB_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" launch=()
  if [ -n "${RANKS:-}" ]; then
    libs="$PT_MPI_DIR/lib:$libs"
    launch=(mpirun --oversubscribe -n "$RANKS" -x LD_LIBRARY_PATH)
  fi
  local args=()
  for o in "$@"; do args+=(--set "$o"); done
  local t0 t1
  t0=$(date +%s.%N)
  if ! LD_LIBRARY_PATH="$libs" timeout -k 5 120 "${launch[@]}" "$PT_BIN/pipetrain" train "$work/$s.yaml" --quiet \
      ${RESUME:+--resume} "${args[@]}" --set "output.model=$work/$s.$name.onnx" >"$work/$s.$name.log" 2>&1; then
    printf '  %-8s %-22s %10s  ERROR %s\n' "$s" "$name" - "$(tail -1 "$work/$s.$name.log")"
    grep -m 6 -iE 'error|signal|fault|failed|#[0-9]' "$work/$s.$name.log" | sed 's/^/      /'
    return 1
  fi
  t1=$(date +%s.%N)
  RUN_SECONDS=$(python3 -c "print(f'{($t1 - $t0) / 3:.3f}')")
}

compare() {
  local work="$1" s="$2" have="$3" want="$4"
  shift 4
  local verdict
  verdict=$(python3 bench/gpu_compare.py "$work/$s.$have.onnx" "$work/$s.$want.onnx" "$@")
  local rc=$?
  printf '  %-8s %-22s %10s  vs %s: %s\n' "$s" "$have" "$RUN_SECONDS" "$want" "$verdict"
  return $rc
}

case "${1:-}" in
  pack) pack "${2:-}" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,35p' "$0"; exit 2 ;;
esac
