#!/usr/bin/env bash
# The planner's figures of docs/measured.md (`pipetrain plan`, cli/planner.h):
#  1. planning time: a generated 991-node transformer-like model at 8 devices, a loose and a
#     tight memory cap (64 and 8 MiB);
#  2. charlm at 2 devices under a 24 MiB cap: the plan and the best hand-made plan (a kind x one
#     policy for every device), each with its simulated step, then trained for 8 steps: the
#     measured step (median) and the peak kept bytes, measured against planned.
# Run after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out/bench
.venv/bin/python samples/synthetic/make_synthetic.py --layers 30 --hidden 64 --seq 16 \
  --out out/bench/synthetic_1k.onnx
for cap in 64MiB 8MiB; do
  start=$(date +%s.%N)
  ./build/pipetrain plan out/bench/synthetic_1k.onnx --devices 8 --memory "$cap" --json \
    > out/bench/plan_1k.json
  end=$(date +%s.%N)
  .venv/bin/python - "$cap" "$start" "$end" <<'PY'
import json, sys
j = json.load(open("out/bench/plan_1k.json"))
b = j["best"]
print(f"991 nodes, 8 devices, cap {sys.argv[1]}: {j['searched']} plans in {j['seconds']:.2f} s "
      f"(command {float(sys.argv[3]) - float(sys.argv[2]):.2f} s); best {b['kind']}, "
      f"{b['chunks']} chunks, recompute {','.join(b['recompute'])}")
PY
done
plan=out/bench/charlm_plan
./build/pipetrain plan samples/charlm/charlm.onnx --devices 2 --memory 24MiB -b 8 \
  --global-batch 64 --json --write "$plan.yaml" > "$plan.json"
train() {  # $1: metrics file; the rest: --set overrides
  local metrics=$1
  shift
  ./build/pipetrain train "$plan.yaml" -q --set steps=8 --set output.metrics="$metrics" "$@" > /dev/null
}
grid=$(.venv/bin/python -c "
import json; g = json.load(open('$plan.json'))['best_grid']
print(g['kind'], g['chunks'], ','.join(g['recompute']))")
read -r kind chunks recompute <<< "$grid"
for round in 1 2 3 4 5; do  # in turns: the machine's speed drifts between runs
  train "$plan.best.$round.jsonl"
  train "$plan.grid.$round.jsonl" --set pipeline.schedule="$kind" --set pipeline.chunks="$chunks" \
    --set pipeline.recompute="$recompute"
done
.venv/bin/python - "$plan" <<'PY'
import json, statistics, sys
plan = sys.argv[1]
j = json.load(open(plan + ".json"))
print("| plan | kind | simulated step ms | measured step ms, median of 5 turns (least-most) | "
      "peak kept MiB per device, measured | planned |")
print("|---|---|---|---|---|---|")
for label, key, tag in (("plan", "best", "best"), ("best hand-made", "best_grid", "grid")):
    c = j[key]
    runs = [[json.loads(l) for l in open(f"{plan}.{tag}.{r}.jsonl") if '"summary"' in l][-1]["summary"]
            for r in range(1, 6)]
    steps = sorted(1e3 * s["step_s_median"] for s in runs)
    rec = c["recompute"][0] if len(set(c["recompute"])) == 1 else ",".join(c["recompute"])
    kept = runs[-1]["peak_kept_bytes_measured"]
    print(f"| {label} | {c['kind']}, {c['chunks']} chunk(s), recompute {rec} | "
          f"{1e3 * c['step_s']:.1f} | {statistics.median(steps):.1f} ({steps[0]:.1f}-{steps[-1]:.1f}) | "
          f"{' / '.join(f'{b / 2**20:.2f}' for b in kept)} | "
          f"{' / '.join(f'{b / 2**20:.2f}' for b in c['kept_bytes'])} |")
PY
