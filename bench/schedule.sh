#!/usr/bin/env bash
# The schedule figures of docs/measured.md: every kind at 64 stages x 1024 micro-batches generated,
# validated (compute-only and lowered) and simulated; `auto` at 16 x 128 with uneven costs.
# Builds nothing: run after building the schedule_bench target (BUILD defaults to build/).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
"$BUILD/bench/schedule_bench" 64 1024 16 128
