#!/usr/bin/env bash
# Set-up (scripts/setup.sh), then the main job. Until `pipetrain train` lands, the main job is
# partitioning the GPT sample into 4 balanced stages and exporting them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
./build/pipetrain partition samples/gpt/gpt.onnx --stages 4 --micro-batch 8 --export out/gpt_stages
