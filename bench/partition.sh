#!/usr/bin/env bash
# The partition figures of the README:
#  1. scale: a generated 10,000+-node transformer-like graph cut into 8 stages;
#  2. balance: imbalance of each strategy on the GPT sample at 4 stages.
# Run after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out/bench
.venv/bin/python samples/synthetic/make_synthetic.py --layers 320 --hidden 64 --seq 16 \
  --out out/bench/synthetic_10k.onnx
./build/bench/partition_bench out/bench/synthetic_10k.onnx 8 5
for strategy in balanced params uniform; do
  printf "gpt 4 stages %-9s imbalance " "$strategy"
  ./build/pipetrain partition samples/gpt/gpt.onnx --stages 4 --micro-batch 8 \
    --strategy "$strategy" --json | .venv/bin/python -c "import json,sys; print(round(json.load(sys.stdin)['imbalance'], 3))"
done
