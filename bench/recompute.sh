#!/usr/bin/env bash
# The recompute figures of docs/measured.md: per sample and policy, kept activation bytes per
# micro-batch (summed over 4 stages, micro-batch 8) and the extra FLOPs recompute costs.
# Run after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
./build/bench/recompute_bench 4 8 samples/{gpt,bert,vit,mlp,resnet,mobilenet}/*.onnx
