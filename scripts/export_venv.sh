#!/usr/bin/env bash
# Makes .venv-export, the venv with PyTorch, torchvision and transformers from PyPI that
# samples/exports/make_exports.py, samples/export_model.py and bench/*.py run in (CI does not
# need it: the files it makes are committed). Needs PyPI; about 5 GB (PyPI's torch brings CUDA's
# libraries; the CPU is enough for everything here).
# Safe to rerun: makes the venv only if it has no python, installs only the packages it lacks.
#   bash scripts/export_venv.sh
# PT_EXPORT_VENV names another folder (default .venv-export, in the repository root).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${PT_EXPORT_VENV:-.venv-export}"
PACKAGES=(torch torchvision transformers onnx onnxscript onnxruntime numpy safetensors)

if [ ! -x "$VENV/bin/python" ]; then
  echo "export_venv: making $VENV (python3 -m venv)"
  python3 -m venv "$VENV" || {
    echo "export_venv: python3 -m venv failed; on Debian install python3-venv (scripts/setup.sh does)" >&2
    exit 1
  }
fi

# Each package's import name is its PyPI name.
missing=()
for p in "${PACKAGES[@]}"; do
  "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$p') is None)" \
    || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "export_venv: installing ${missing[*]} into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${missing[@]}"
else
  echo "export_venv: $VENV has ${PACKAGES[*]}"
fi
"$VENV/bin/python" -c "import torch, torchvision, transformers; print('export_venv: torch', torch.__version__, '| torchvision', torchvision.__version__, '| transformers', transformers.__version__)"
