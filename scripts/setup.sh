#!/usr/bin/env bash
# Installs what pipetrain needs on Debian 12 (apt packages, a Python venv with onnx and
# onnxruntime beside Debian's torch), then configures and builds into build/.
# Safe to rerun: installs only what is missing, rebuilds incrementally.
#   bash scripts/setup.sh                  install, then build into build/
#   bash scripts/setup.sh --deps-only      install only (scripts/sanitize.sh, scripts/fuzz.sh)
# PT_EXTRA_APT names more packages to install (the fuzz build adds clang's).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake ninja-build pkg-config
  libonnx-dev libonnx-testdata libprotobuf-dev protobuf-compiler
  libcli11-dev libyaml-cpp-dev libgtest-dev libgmock-dev libdnnl-dev ocl-icd-opencl-dev nlohmann-json3-dev
  libopenmpi-dev openmpi-bin iproute2 procps
  python3 python3-venv python3-numpy python3-torch python3-torchvision ${PT_EXTRA_APT:-})

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's python3 carries torch; the venv sees it and adds onnx and onnxruntime from PyPI.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import onnxruntime, onnx, numpy, torch" 2>/dev/null; then
  echo "setup: making .venv (Debian's python3 with torch, plus onnx and onnxruntime)"
  /usr/bin/python3 -m venv --system-site-packages .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check "numpy<2" onnx onnxruntime
fi

# The CUDA backend (built where nvcc is found) composes attention with cuDNN's frontend, whose
# headers come from PyPI.
CUDNN_FRONTEND=nvidia-cudnn-frontend==1.32.0
if command -v nvcc >/dev/null && ! .venv/bin/python -m pip show -q nvidia-cudnn-frontend 2>/dev/null; then
  echo "setup: adding $CUDNN_FRONTEND's headers to .venv (the CUDA backend's attention)"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "$CUDNN_FRONTEND"
fi

[ "${1:-}" = "--deps-only" ] && exit 0

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPT_PYTHON="$PWD/.venv/bin/python" >/dev/null
cmake --build build -j "$(nproc)"
