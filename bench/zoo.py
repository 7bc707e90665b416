#!/usr/bin/env python3
"""The torchvision classifiers people fine-tune, exported as samples/export_model.py exports them
(default exporter, optimize=False, eval mode, dynamic batch), through pipetrain on the CPU:

  1. import (`pipetrain inspect`): wall time, trained parameters, what import reports;
  2. a 4-stage partition (`pipetrain partition --stages 4`): the imbalance it prints;
  3. 2 training steps on 4 stages (SGD with momentum, synthetic data, 2 micro-batches of
     --batch images) under 1f1b and under zb-v: the measured step time of the last step, and
     whether the two schedules' trained weights (the safetensors files) are bit-identical.

Needs the export venv (torch and torchvision from PyPI):
    .venv-export/bin/python bench/zoo.py [--models resnet18 ...] [--image 32] [--batch 2]
Prints one table row per model (markdown); exports go to out/bench/zoo/.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torchvision

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "samples"))
from export_model import export_for_pipetrain  # noqa: E402

MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
          "convnext_tiny", "regnet_y_400mf", "vit_b_16"]
BIN = os.path.join(ROOT, "build", "pipetrain")


def sh(*argv):
    start = time.perf_counter()
    res = subprocess.run([BIN, *argv], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError((res.stderr or res.stdout).strip().splitlines()[-1][:200])
    return res.stdout, time.perf_counter() - start


def build(name, image):
    kw = {"num_classes": 10}
    if name.startswith("vit"):
        kw["image_size"] = image
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(**kw)


def train(path, out, schedule, batch):
    cfg = os.path.join(out, f"train_{schedule}.yaml")
    with open(cfg, "w") as f:
        f.write(f"""model: {path}
dims: {{batch: {batch}}}
loss: {{kind: cross_entropy}}
data: {{kind: synthetic, samples: 64, shuffle: false, eval_fraction: 0}}
optimizer: {{kind: sgd, lr: 0.01, momentum: 0.9}}
pipeline: {{stages: 4, micro_batches: 2, schedule: {schedule}}}
steps: 2
eval_every: 0
checkpoint: {{dir: "", every: 0}}
output: {{model: {out}/trained_{schedule}.onnx, metrics: {out}/metrics_{schedule}.jsonl, trace: "", timeline: ""}}
""")
    sh("train", cfg, "-q")
    with open(os.path.join(out, f"metrics_{schedule}.jsonl")) as f:
        steps = [json.loads(line) for line in f if '"step"' in line]
    with open(os.path.join(out, f"trained_{schedule}.safetensors"), "rb") as f:
        return steps[-1]["step_s"], f.read()


def row(name, args):
    out = os.path.join(ROOT, "out", "bench", "zoo", name)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.onnx")
    module = build(name, args.image).eval()
    if not os.path.exists(path):
        export_for_pipetrain(module, torch.randn(args.batch, 3, args.image, args.image), path)
    params = sum(p.numel() for p in module.parameters())
    try:
        text, import_s = sh("inspect", path, "--micro-batch", str(args.batch))
        trained = next(line for line in text.splitlines() if line.startswith("initializers:")).split()[1]
        part, _ = sh("partition", path, "--stages", "4", "--micro-batch", str(args.batch))
        imbalance = next(line for line in part.splitlines() if line.startswith("imbalance")).split()[1]
        step_1f1b, w_1f1b = train(path, out, "1f1b", args.batch)
        step_zbv, w_zbv = train(path, out, "zb-v", args.batch)
        same = "yes" if w_1f1b == w_zbv else "NO"
        return (f"| {name} | {params / 1e6:.1f}M | {import_s:.2f} s, {trained} trained | {imbalance} | "
                f"{step_1f1b * 1e3:.0f} ms | {step_zbv * 1e3:.0f} ms | {same} |")
    except RuntimeError as e:
        return f"| {name} | {params / 1e6:.1f}M | stops: {e} | | | | |"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--image", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}; {args.image}x{args.image} "
          f"images, 2 micro-batches of {args.batch}, 4 stages, {os.cpu_count()} cores")
    print("| model | parameters | import | 4-stage imbalance | step, 1f1b | step, zb-v | 1f1b = zb-v (bits) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        print(row(name, args), flush=True)


if __name__ == "__main__":
    main()
