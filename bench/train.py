#!/usr/bin/env python3
"""Training figures of the README, on the charlm sample (samples/charlm/train.yaml).

  1. p = 2 (one thread per stage): every schedule kind trained for a few steps; the measured bubble
     and step time (mean of the steps after the first) beside the simulator's prediction on the
     chunk costs measured in the same run.
  2. p = 4 and 8: each chunk's F, B and W measured alone (GPipe with one micro-batch runs one action
     at a time, so no two stages share the cores), then every kind simulated on those costs.
  3. One training step (8 micro-batches of 8 windows of 64 bytes, AdamW) against PyTorch eager on
     the same model and thread count: pipetrain on one stage with T threads, pipelined on 2 stages
     with T/2 threads each, and torch with T threads (gradient accumulation over the same
     micro-batches). Goal: pipetrain's step is faster.

Usage: .venv/bin/python bench/train.py [--pipetrain build/pipetrain] [--steps 12] [--threads 2]
Debian's torch must be importable (the .venv made by scripts/setup.sh sees it).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "samples", "charlm", "train.yaml")
KINDS = ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "v-zb", "v-half", "v-min"]
CHUNKS = {"interleaved": 2, "zb-v": 2, "v-zb": 2, "v-half": 2, "v-min": 2}


def train(binary, out, steps, **sets):
    """Runs pipetrain train on the sample with overrides; returns the summary line of its metrics."""
    metrics = os.path.join(out, "metrics.jsonl")
    args = [binary, "train", CONFIG, "-q",
            "--set", f"steps={steps}", "--set", "eval_every=0",
            "--set", "optimizer.warmup_steps=0", "--set", "checkpoint.dir=", "--set", "output.model=", "--set", "output.trace=",
            "--set", "output.timeline=", "--set", f"output.metrics={metrics}"]
    for key, value in sets.items():
        args += ["--set", f"{key.replace('__', '.')}={value}"]
    subprocess.run(args, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if "summary" in j:
                return j["summary"]
    raise RuntimeError("no summary in " + metrics)


def simulate(binary, kind, stages, micro_batches, stage_costs):
    costs = ",".join(f"{x * 1e3:.6f}" for fbw in stage_costs for x in fbw)  # milliseconds
    args = [binary, "schedule", "--kind", kind, "--stages", str(stages),
            "--micro-batches", str(micro_batches), "--costs", costs, "--json"]
    if kind in CHUNKS:
        args += ["--chunks", str(CHUNKS[kind])]
    j = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return j["bubble"], j["makespan"]


def torch_step_seconds(threads, steps, micro_batch, micro_batches):
    """Median seconds of one torch training step of the same model and batching."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "samples", "charlm"))
    import make_charlm
    torch.set_num_threads(threads)
    cfg = make_charlm.CONFIG
    model = make_charlm.make_model(seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=cfg["betas"],
                            weight_decay=cfg["weight_decay"], foreach=False)
    g = torch.Generator().manual_seed(0)
    xs = torch.randint(0, 256, (micro_batches, micro_batch, cfg["context"]), generator=g)
    ys = torch.randint(0, 256, (micro_batches, micro_batch, cfg["context"]), generator=g)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        for m in range(micro_batches):
            logits = model(xs[m])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), ys[m].reshape(-1),
                                                     reduction="sum") / (micro_batches * ys[m].numel())
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", default=os.path.join(ROOT, "build", "pipetrain"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="pt_bench_train_")
    M = 8

    print("## measured bubble at p = 2 (charlm, 8 micro-batches of 8, 1 thread per stage)\n")
    print("| schedule | measured bubble | simulated bubble | measured step ms | simulated step ms |")
    print("|---|---|---|---|---|")
    for kind in KINDS:
        sets = {"pipeline__stages": 2, "pipeline__schedule": kind, "threads": 1,
                "pipeline__micro_batches": M, "pipeline__chunks": CHUNKS.get(kind, 1)}
        s = train(a.pipetrain, out, a.steps, **sets)
        print(f"| {kind} | {100 * s['measured_bubble']:.1f}% | {100 * s['simulated_bubble']:.1f}% | "
              f"{1e3 * s['measured_makespan_s']:.1f} | {1e3 * s['simulated_makespan_s']:.1f} |", flush=True)

    for p in (4, 8):
        s = train(a.pipetrain, out, 4, pipeline__stages=p, pipeline__schedule="gpipe",
                  pipeline__micro_batches=1, pipeline__chunks=1, threads=1)
        stage_costs = s["chunk_costs_s"]
        total = sum(sum(c) for c in stage_costs)
        print(f"\n## p = {p}: simulated on chunk costs measured alone "
              f"(F+B+W of one micro-batch over all stages: {1e3 * total:.1f} ms)\n")
        print("| schedule | simulated bubble | simulated step ms (8 micro-batches) |")
        print("|---|---|---|")
        for kind in KINDS:
            bubble, makespan = simulate(a.pipetrain, kind, p, M, stage_costs)
            print(f"| {kind} | {100 * bubble:.1f}% | {makespan:.1f} |", flush=True)

    import torch
    print("\n## training step against PyTorch eager (charlm, 8 micro-batches of 8 windows, AdamW)\n")
    print("| threads in all | PyTorch eager step ms | pipetrain 1 stage ms | pipetrain 2 stages (zb-h1) ms |")
    print("|---|---|---|---|")
    for T in sorted({1, a.threads}):
        torch_s = torch_step_seconds(T, a.steps, 8, M)
        one = train(a.pipetrain, out, a.steps, pipeline__stages=1, pipeline__schedule="1f1b",
                    pipeline__chunks=1, pipeline__micro_batches=M, threads=T)
        two = "-"
        if T >= 2:
            s2 = train(a.pipetrain, out, a.steps, pipeline__stages=2, pipeline__schedule="zb-h1",
                       pipeline__chunks=1, pipeline__micro_batches=M, threads=T // 2)
            two = f"{1e3 * s2['step_s_median']:.1f}"
        print(f"| {T} | {1e3 * torch_s:.1f} | {1e3 * one['step_s_median']:.1f} | {two} |", flush=True)
    print(f"\n(PyTorch {torch.__version__}; step = forward and backward of every micro-batch, clipping "
          "and the optimizer step; median over the steps after the first)")


if __name__ == "__main__":
    import torch  # noqa: F401  (fail early when torch is missing)
    main()
