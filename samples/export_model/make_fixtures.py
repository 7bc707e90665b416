#!/usr/bin/env python3
"""The committed fixtures of tests/oracle/export_model_vs_torch.py: modules.py's modules, seeded,
exported by samples/export_model.py (default exporter, optimize=False, eval mode, metadata).

    .venv-export/bin/python samples/export_model/make_fixtures.py [--out samples/export_model]

writes NAME.onnx and NAME.onnx.data per module. The start weights are the file's own: the test
rebuilds the module's state_dict from the file through its metadata.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from export_model import export_for_pipetrain  # noqa: E402
from modules import MODULES, SHAPES  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    print(f"torch {torch.__version__}")
    for name, cls in MODULES.items():
        torch.manual_seed(0)
        module = cls()
        example = torch.randn(SHAPES[name], generator=torch.Generator().manual_seed(1))
        export_for_pipetrain(module, example, os.path.join(args.out, f"{name}.onnx"))
        print(f"{name}.onnx: {sum(p.numel() for p in module.parameters())} parameters")


if __name__ == "__main__":
    main()
