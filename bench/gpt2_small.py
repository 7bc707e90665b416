#!/usr/bin/env python3
"""Scale: a full-size GPT-2 small (124M parameters, transformers' GPT2LMHeadModel, random init)
exported by PyTorch's default exporter (opset 20, external data), through pipetrain.

  1. import (`pipetrain inspect`) and import + partition into 4 stages: wall time and peak RSS;
  2. forward (`pipetrain run`, one sequence of --context tokens, --threads threads) against
     onnxruntime on the same file and threads: median of --repeats runs each (pipetrain's run
     time is the command's wall time less its import time, measured in 1);
  3. one training step at 4 stages (1f1b, --micro-batches micro-batches of one sequence, SGD):
     the measured step time pipetrain reports, and peak RSS.

Needs the export venv (PyTorch and transformers from PyPI; samples/exports/make_exports.py says
how to make it): .venv-export/bin/python bench/gpt2_small.py [--context 1024]
The export (about 500 MB) is made once under out/bench/gpt2_small/.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def export(path, context):
    if os.path.exists(path):
        return
    import torch
    import transformers as t
    torch.manual_seed(0)
    model = t.GPT2LMHeadModel(t.GPT2Config(n_positions=max(1024, context))).eval()
    model.config.use_cache = False

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.model = m

        def forward(self, x):
            return self.model(x).logits

    ids = torch.randint(0, 50257, (1, context))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.onnx.export(Logits(model).eval(), (ids,), path, input_names=["input"], output_names=["output"],
                      dynamic_shapes=({0: torch.export.Dim("batch")},), dynamo=True)


def timed(cmd):
    """Runs cmd; returns (seconds, the command's own peak RSS in MiB, stdout)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        seconds = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {err.read().strip()[:500]}")
        return seconds, usage.ru_maxrss / 1024, out.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", default=os.path.join(ROOT, "build", "pipetrain"))
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--micro-batches", type=int, default=4)
    args = ap.parse_args()
    out = os.path.join(ROOT, "out", "bench", "gpt2_small")
    model = os.path.join(out, f"gpt2_{args.context}.onnx")
    export(model, args.context)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.startswith(f"gpt2_{args.context}"))
    print(f"GPT-2 small, context {args.context}: {model} ({size / 2**20:.0f} MiB with its data)")

    t_import, rss_import, _ = timed([args.pipetrain, "inspect", model])
    t_part, rss_part, _ = timed([args.pipetrain, "partition", model, "--stages", "4", "--micro-batch", "1"])
    print(f"import: {t_import:.1f} s, peak RSS {rss_import:.0f} MiB; import + partition (4 stages): "
          f"{t_part:.1f} s, peak RSS {rss_part:.0f} MiB")

    ids = np.random.default_rng(0).integers(0, 50257, (1, args.context)).astype(np.int64)
    np.save(os.path.join(out, "ids.npy"), ids)
    runs = []
    for _ in range(args.repeats):
        t, rss_run, _ = timed([args.pipetrain, "run", model, "--input", f"input={out}/ids.npy",
                               "--output", os.path.join(out, "run"), "--threads", str(args.threads)])
        runs.append(t - t_import)
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    ort_runs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        want = sess.run(None, {"input": ids})[0]
        ort_runs.append(time.perf_counter() - t0)
    have = np.load(os.path.join(out, "run", "output.npy"))
    err = float(np.max(np.abs(have - want)) / np.max(np.abs(want)))
    print(f"forward, 1 x {args.context} tokens, {args.threads} threads: pipetrain {statistics.median(runs):.2f} s "
          f"(min {min(runs):.2f}, max {max(runs):.2f}; peak RSS {rss_run:.0f} MiB), onnxruntime "
          f"{statistics.median(ort_runs):.2f} s (min {min(ort_runs):.2f}, max {max(ort_runs):.2f}); "
          f"outputs agree within {err:.1e} of the largest")

    y = np.random.default_rng(1).integers(0, 50257, (args.micro_batches, args.context)).astype(np.int64)
    x = np.random.default_rng(2).integers(0, 50257, (args.micro_batches, args.context)).astype(np.int64)
    np.save(os.path.join(out, "x.npy"), x)
    np.save(os.path.join(out, "y.npy"), y)
    cfg = os.path.join(out, "train.yaml")
    metrics = os.path.join(out, "metrics.jsonl")
    with open(cfg, "w") as f:
        f.write(f"""model: {model}
dims: {{batch: 1}}
loss: {{kind: cross_entropy}}
data: {{kind: npy, inputs: {{input: {out}/x.npy}}, targets: {out}/y.npy, shuffle: false, eval_fraction: 0}}
optimizer: {{kind: sgd, lr: 0.01}}
pipeline: {{stages: 4, micro_batches: {args.micro_batches}, schedule: 1f1b}}
threads: 1
steps: 1
eval_every: 0
checkpoint: {{dir: "", every: 0}}
output: {{model: "", metrics: {metrics}, trace: "", timeline: ""}}
""")
    t_train, rss_train, _ = timed([args.pipetrain, "train", cfg, "-q"])
    s = [json.loads(line) for line in open(metrics)][-1]["summary"]
    kept = ", ".join(f"{b / 2**30:.2f}" for b in s["peak_kept_bytes_measured"])
    print(f"training step, 4 stages (1f1b, {args.micro_batches} micro-batches of 1 x {args.context}, 1 thread "
          f"each): {s['measured_makespan_s']:.1f} s (simulated on the measured chunk costs "
          f"{s['simulated_makespan_s']:.1f} s), bubble measured {100 * s['measured_bubble']:.0f}% / simulated "
          f"{100 * s['simulated_bubble']:.0f}%; kept activations per stage {kept} GiB; whole command "
          f"{t_train:.1f} s, peak RSS {rss_train / 1024:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
