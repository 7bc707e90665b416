#!/usr/bin/env python3
"""The weights pipetrain trains load back into the transformers module with strict=True.

For each NAME (default: every fixture but MobileNetV3, whose reference trains in eval mode), trains samples/exports/NAME_noopt.onnx (made
by samples/export_model.py, with its record of the module's state_dict), and NAME.onnx (the
no-flags export, with output.start_state: NAME.start.safetensors; not for ResNet and the
BatchNorm convnet, whose no-flags file fused BatchNorm into its convolutions) for the reference's 3
SGD-momentum steps on 4 stages under zb-v, loads the safetensors file pipetrain writes into a
fresh module built as make_exports.py builds it with `load_state_dict(strict=True)`, and compares
that module's output on the held-out input with the PyTorch-trained module's (probe_trained).
CI has no transformers, so this runs by hand with the export venv (oracle.exports_pytorch checks
the same keys and values in CI):

    .venv-export/bin/python samples/exports/check_strict_load.py [--names gpt2 bert ...]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "samples", "exports"))
sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))
import make_exports as me  # noqa: E402
from export_model_vs_torch import read_safetensors  # noqa: E402

NAMES = ["nanogpt", "gpt2", "llama", "qwen2", "qwen3", "mistral", "phi3", "bert", "vit", "convnext", "resnet", "bnconv"]
CONFIG = """model: {model}
dims: {{batch: {batch}}}
loss: {{kind: cross_entropy}}
data: {{kind: npy, inputs: {{input: {tmp}/x.npy}}, targets: {tmp}/y.npy, shuffle: false, eval_fraction: 0}}
optimizer: {{kind: sgd, lr: {lr}, momentum: {momentum}}}
pipeline: {{stages: 4, micro_batches: {micro}, schedule: zb-v}}
steps: {steps}
eval_every: 0
checkpoint: {{dir: "", every: 0}}
output: {{model: {tmp}/trained.onnx, metrics: "", trace: "", timeline: ""{start}}}
"""
FUSED = {"resnet", "bnconv"}


def check(name, variant, tmp):
    model_path = os.path.join(ROOT, "samples", "exports", f"{name}{variant}.onnx")
    ref = np.load(os.path.join(ROOT, "samples", "exports", f"{name}{variant}.npz"))
    start = os.path.join(ROOT, "samples", "exports", f"{name}.start.safetensors")
    np.save(os.path.join(tmp, "x.npy"), ref["x"])
    np.save(os.path.join(tmp, "y.npy"), ref["y"])
    cfg = os.path.join(tmp, "train.yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(model=model_path, tmp=tmp, batch=me.BATCH, lr=me.LR, momentum=me.MOMENTUM,
                              micro=me.MICRO, steps=me.STEPS,
                              start=f", start_state: {start}" if variant == "" else ""))
    res = subprocess.run([os.path.join(ROOT, "build", "pipetrain"), "train", cfg, "-q"], capture_output=True, text=True)
    if res.returncode != 0:
        return f"pipetrain train failed: {res.stderr.strip()[:300]}"
    torch.manual_seed(0)
    module = me.Logits(me.build(name)[0])
    weights, _ = read_safetensors(os.path.join(tmp, "trained.safetensors"))
    module.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    with torch.no_grad():
        probe = torch.from_numpy(ref["probe"])
        out = module.eval()(probe).numpy()
    err = float(np.abs(out - ref["probe_trained"]).max() / np.abs(ref["probe_trained"]).max())
    return None if err <= 1e-4 else f"output differs from the PyTorch-trained module's by {err:.3g}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--names", nargs="+", default=NAMES)
    failed = 0
    cases = [(n, v) for n in ap.parse_args().names for v in ("_noopt", "") if not (v == "" and n in FUSED)]
    for name, variant in cases:
        with tempfile.TemporaryDirectory() as tmp:
            err = check(name, variant, tmp)
        print(f"{'ok  ' if err is None else 'FAIL'} {name}{variant}{': ' + err if err else ''}")
        failed += err is not None
    print(f"{len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
