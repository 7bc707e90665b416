#!/usr/bin/env bash
# Set-up (scripts/setup.sh), then the main job: the charlm sample (a byte-level GPT, samples/charlm)
# trained on the GNU GPL v3 text on the CPU, 4 pipeline stages under the zero-bubble V schedule.
# Progress, held-out loss and accuracy on the terminal; model, metrics, trace and timeline in
# out/charlm/. Extra arguments go to `pipetrain train` (e.g. --set steps=50). Each run of the main
# job starts over (--overwrite replaces the previous main job's checkpoints) unless given --resume.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
fresh=(--overwrite)
for a in "$@"; do [[ "$a" == --resume ]] && fresh=(); done
./build/pipetrain train samples/charlm/train.yaml "${fresh[@]}" "$@"
