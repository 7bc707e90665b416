"""Forward latency of pipetrain's CPU backend against onnxruntime, same model, batch and thread
count, in one run. Prints a table: median ms of each and the ratio pipetrain / onnxruntime.

    .venv/bin/python bench/forward.py [--batch 8] [--threads 2] [--repeats 50]
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "oracle"))
from stage_chain import make_inputs  # noqa: E402

SAMPLES = ["mlp", "gpt", "bert", "vit", "resnet", "mobilenet"]


def ort_ms(model, feeds, threads, repeats):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    s = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    for _ in range(3):
        s.run(None, feeds)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        s.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--bench", default="build/bench/forward_bench")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"batch {args.batch}, {args.threads} threads, median of {args.repeats}")
    print(f"{'model':10} {'pipetrain ms':>13} {'onnxruntime ms':>15} {'ratio':>7}")
    for name in SAMPLES:
        model = f"samples/{name}/{name}.onnx"
        out = subprocess.run([args.bench, model, str(args.batch), str(args.threads), str(args.repeats)],
                             capture_output=True, text=True, check=True).stdout.split()
        pt_ms = float(out[0])
        ref = ort_ms(model, make_inputs(model, args.batch, rng), args.threads, args.repeats)
        print(f"{name:10} {pt_ms:13.3f} {ref:15.3f} {pt_ms / ref:7.2f}")


if __name__ == "__main__":
    main()
