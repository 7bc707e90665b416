"""Forward latency of pipetrain's CPU backend against onnxruntime, same model, batch and thread
count. The two take turns, pipetrain, onnxruntime, pipetrain, ... (--rounds turns each, a turn
being the median of --repeats forwards after three warm-up ones), so a change in the machine's
load falls on both; the table gives the median turn and, in brackets, the least and the most.

    .venv/bin/python bench/forward.py [--batch 8] [--threads 2] [--repeats 50] [--rounds 5]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "oracle"))
from stage_chain import make_inputs  # noqa: E402
from machine import cpu_name  # noqa: E402  (bench/machine.py)

SAMPLES = ["mlp", "gpt", "bert", "vit", "resnet", "mobilenet"]


def ort_ms(session, feeds, repeats):
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def pipetrain_ms(bench, model, batch, threads, repeats):
    out = subprocess.run([bench, model, str(batch), str(threads), str(repeats)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0])


def fmt(xs):
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bench", default="build/bench/forward_bench")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{cpu_name()}; onnxruntime {ort.__version__}; batch {args.batch}, {args.threads} threads; "
          f"{args.rounds} turns each of the median of {args.repeats} forwards; "
          f"load average {os.getloadavg()[0]:.2f} at the start\n")
    print("| model | pipetrain ms | onnxruntime ms | pipetrain / onnxruntime |")
    print("|---|---|---|---|")
    for name in SAMPLES:
        model = f"samples/{name}/{name}.onnx"
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        feeds = make_inputs(model, args.batch, rng)
        pt, ref = [], []
        for _ in range(args.rounds):
            pt.append(pipetrain_ms(args.bench, model, args.batch, args.threads, args.repeats))
            ref.append(ort_ms(session, feeds, args.repeats))
        ratio = statistics.median(pt) / statistics.median(ref)
        print(f"| {name} | {fmt(pt)} | {fmt(ref)} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
