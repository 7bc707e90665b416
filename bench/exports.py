#!/usr/bin/env python3
"""Time of today's exports (samples/exports) through pipetrain, for the fixture table of docs/measured.md.

For each fixture NAME (the no-flags export and NAME_noopt):
  - forward: `pipetrain run --repeats N` on one micro-batch (2 rows) with 1 thread (the median
    forward pass it prints, compiled before the first), against onnxruntime's
    InferenceSession.run on the same file and input with 1 thread (median of N after one warm-up);
  - step: `pipetrain train` on 4 stages under 1f1b, 2 micro-batches of 2, SGD with momentum,
    --steps steps: the median measured step time from its metrics, steps after the first.
These models are tiny (tens of thousands of parameters): the times are per-call overheads more
than arithmetic, which is what a user of such a model sees; bench/gpt2_small.py and bench/zoo.py
time real sizes.

Usage: .venv/bin/python bench/exports.py [--names gpt2 ...] [--repeats 50] [--steps 6]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

from machine import cpu_name  # bench/machine.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "pipetrain")
DIR = os.path.join(ROOT, "samples", "exports")
NAMES = ["gpt2", "llama", "qwen3", "bert", "vit", "convnext", "mobilenetv3"]


def pipetrain(*argv):
    res = subprocess.run([BIN, *argv], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError((res.stderr or res.stdout).strip()[:200])
    return res.stdout


def forward(path, probe, tmp, repeats):
    np.save(os.path.join(tmp, "probe.npy"), probe)
    out = pipetrain("run", path, "--input", f"input={tmp}/probe.npy", "--output", f"{tmp}/run", "--threads", "1",
                    "--repeats", str(repeats))
    ours = float(next(line for line in out.splitlines() if line.startswith("forward ")).split()[1]) / 1e3
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    sess.run(None, {"input": probe})
    ort_s = []
    for _ in range(repeats):
        start = time.perf_counter()
        sess.run(None, {"input": probe})
        ort_s.append(time.perf_counter() - start)
    return ours, statistics.median(ort_s)


def step(path, ref, tmp, steps):
    np.save(os.path.join(tmp, "x.npy"), np.concatenate([ref["x"]] * steps))
    np.save(os.path.join(tmp, "y.npy"), np.concatenate([ref["y"]] * steps))
    cfg = os.path.join(tmp, "t.yaml")
    with open(cfg, "w") as f:
        f.write(f"""model: {path}
dims: {{batch: 2}}
loss: {{kind: cross_entropy}}
data: {{kind: npy, inputs: {{input: {tmp}/x.npy}}, targets: {tmp}/y.npy, shuffle: false, eval_fraction: 0}}
optimizer: {{kind: sgd, lr: 0.1, momentum: 0.9}}
pipeline: {{stages: 4, micro_batches: 2, schedule: 1f1b}}
steps: {steps}
eval_every: 0
checkpoint: {{dir: "", every: 0}}
output: {{model: "", safetensors: "", metrics: {tmp}/m.jsonl, trace: "", timeline: ""}}
""")
    pipetrain("train", cfg, "-q")
    with open(os.path.join(tmp, "m.jsonl")) as f:
        times = [json.loads(line)["step_s"] for line in f if '"step_s"' in line and '"step"' in line]
    return statistics.median(times[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--names", nargs="+", default=NAMES)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    print(f"{cpu_name()}; {os.cpu_count()} cores; forward: 2 rows, 1 thread; step: 4 stages, 1f1b, 2 micro-batches of 2")
    print("| fixture | forward, pipetrain | forward, onnxruntime | 4-stage step |")
    print("|---|---|---|---|")
    for name in args.names:
        for variant in ("", "_noopt"):
            path = os.path.join(DIR, f"{name}{variant}.onnx")
            if not os.path.exists(path):
                continue
            ref = np.load(os.path.join(DIR, f"{name}{variant}.npz"))
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    fwd, ort_fwd = forward(path, ref["probe"], tmp, args.repeats)
                    st = step(path, ref, tmp, args.steps)
                    print(f"| {name}{variant} | {fwd * 1e3:.3f} ms | {ort_fwd * 1e3:.3f} ms | {st * 1e3:.1f} ms |",
                          flush=True)
                except RuntimeError as e:
                    print(f"| {name}{variant} | stops: {e} | | |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
