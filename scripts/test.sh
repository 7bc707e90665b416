#!/usr/bin/env bash
# Set-up (scripts/setup.sh), then the whole test suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 1500
