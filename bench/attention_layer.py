#!/usr/bin/env python3
"""One causal attention layer (x @ Wq, Wk, Wv, heads, softmax(q k^T / sqrt(d)) v, as the exporters
write it: tests/oracle/attention_vs_torch.py's model) at nanoGPT's width (6 heads of 64) and a
given context, one `pipetrain grad` step (forward, backward, the gradients written) per run: wall
time and peak RSS (/usr/bin/time) of each binary given, in turns, and the median of --rounds.
A binary from before issue 43 runs the attention unfused (the T x T scores kept per head); one
after runs FusedAttention. With --forward, each run is `pipetrain run --repeats 20` instead (the
layer's forward alone, in process, with the attention fused at any context): the median forward
of each run, and the median and least of --rounds.

Usage: bench/attention_layer.py --pipetrain OLD NEW [--context 1024] [--rounds 5] [--threads 2] [--forward]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "oracle"))
import attention_vs_torch as layer  # noqa: E402
from machine import cpu_name  # noqa: E402  (bench/machine.py)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pipetrain", nargs="+", required=True)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--forward", action="store_true", help="time the forward in process (pipetrain run --repeats)")
    args = p.parse_args()
    layer.B, layer.H, layer.D = 1, 6, 64
    layer.E = layer.H * layer.D
    t = args.context
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "layer.onnx")
        onnx.save(layer.model(t, "causal", 1.0 / np.sqrt(layer.D), np.tril(np.ones((t, t), dtype=bool))), path)
        rng = np.random.default_rng(0)
        np.save(os.path.join(tmp, "x.npy"), rng.standard_normal((1, t, layer.E)).astype(np.float32))
        np.save(os.path.join(tmp, "t.npy"), rng.integers(0, layer.E, (1, t)).astype(np.int64))
        if args.forward:
            return forward_turns(args, path, tmp)
        runs = {b: [] for b in args.pipetrain}
        for _ in range(args.rounds):
            for b in args.pipetrain:
                res = subprocess.run(["/usr/bin/time", "-f", "%e %M", b, "grad", path, "-i", f"X={tmp}/x.npy",
                                      "--target", f"{tmp}/t.npy", "--threads", str(args.threads), "-o", f"{tmp}/out"],
                                     capture_output=True, text=True, check=True)
                wall, rss = res.stderr.strip().splitlines()[-1].split()
                runs[b].append((float(wall), int(rss)))
        print(f"{cpu_name()}; context {t}, 6 heads of 64, batch 1, {args.threads} threads, load average {os.getloadavg()[0]:.1f}")
        for b, r in runs.items():
            walls = [w for w, _ in r]
            print(f"  {b}: {statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f}), "
                  f"peak RSS {max(m for _, m in r) / 1024:.0f} MiB")


# The layer's forward alone: `pipetrain run --repeats 20` per binary, in turns, each printing its
# median forward; their median and least over the rounds.
def forward_turns(args, path, tmp):
    turns = {b: [] for b in args.pipetrain}
    for _ in range(args.rounds):
        for b in args.pipetrain:
            res = subprocess.run([b, "run", path, "-i", f"X={tmp}/x.npy", "-o", f"{tmp}/out", "--threads",
                                  str(args.threads), "--repeats", "20", "--fuse-attention-from", "1"],
                                 capture_output=True, text=True, check=True)
            turns[b].append(float(re.search(r"forward ([\d.]+) ms", res.stdout).group(1)))
    print(f"{cpu_name()}; context {args.context}, 6 heads of 64, batch 1, {args.threads} threads, forward only, "
          f"load average {os.getloadavg()[0]:.1f}")
    for b, ms in turns.items():
        print(f"  {b}: {statistics.median(ms):.2f} ms (least {min(ms):.2f})")


if __name__ == "__main__":
    main()
