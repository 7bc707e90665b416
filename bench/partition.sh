#!/usr/bin/env bash
# The partition figures of docs/measured.md:
#  1. scale: a generated 10,000+-node transformer-like graph cut into 8 stages, transfers free
#     and priced (the cpu and tcp links);
#  2. balance: imbalance of each strategy on the GPT sample at 4 stages (transfers free, so the
#     strategies compare on compute alone);
#  3. links: where the GPT sample's cuts fall at 4 stages under each link, and the slowest stage
#     with links included; the unpriced cuts priced over tcp for comparison.
# Run after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out/bench
.venv/bin/python samples/synthetic/make_synthetic.py --layers 320 --hidden 64 --seq 16 \
  --out out/bench/synthetic_10k.onnx
for link in none cpu tcp; do
  ./build/bench/partition_bench out/bench/synthetic_10k.onnx 8 5 "$link"
done
for strategy in balanced params uniform; do
  printf "gpt 4 stages %-9s imbalance " "$strategy"
  ./build/pipetrain partition samples/gpt/gpt.onnx --stages 4 --micro-batch 8 --link none \
    --strategy "$strategy" --json | .venv/bin/python -c "import json,sys; print(round(json.load(sys.stdin)['imbalance'], 3))"
done
summary='import json, sys
j = json.load(sys.stdin)
rate = j["link"]["device_flops"]
slowest = max(s["cost"] + (s["link_in_s"] + s["link_out_s"]) * rate for s in j["stages"])
print("tensors per cut", [len(s["outputs"]) for s in j["stages"][:-1]],
      "largest share %.1f%%" % (100 * max(s["share"] for s in j["stages"])),
      "slowest stage %.0f us" % (1e6 * slowest / rate),
      "last nodes", ",".join(s["last_node"] for s in j["stages"][:-1]))'
gpt() { ./build/pipetrain partition samples/gpt/gpt.onnx --stages 4 --micro-batch 8 --json "$@"; }
for link in none cpu tcp; do
  printf "gpt 4 stages link %-4s " "$link"
  gpt --link "$link" | .venv/bin/python -c "$summary"
done
cuts=$(gpt --link none | .venv/bin/python -c \
  "import json,sys; print(','.join(s['last_node'] for s in json.load(sys.stdin)['stages'][:-1]))")
printf "gpt 4 stages, the none cuts over tcp "
gpt --link tcp --strategy manual --cut-after "$cuts" | .venv/bin/python -c "$summary"
