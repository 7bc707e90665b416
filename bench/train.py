#!/usr/bin/env python3
"""Training figures of docs/measured.md, on the charlm sample (samples/charlm/train.yaml).

  1. p = 2 (one thread per stage): every schedule kind trained for a few steps; the measured bubble
     and step time (mean of the steps after the first) beside the simulator's prediction on the
     chunk costs measured in the same run.
  2. p = 4 and 8: each chunk's F, B and W measured alone (GPipe with one micro-batch runs one action
     at a time, so no two stages share the cores), then every kind simulated on those costs.

The step against PyTorch is bench/cpu_step.py's (PyPI's torch, in the bench venv).

Usage: .venv/bin/python bench/train.py [--pipetrain build/pipetrain] [--steps 12]
"""

import argparse
import json
import os
import subprocess
import tempfile

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
    return summary_of(metrics)


def summary_of(metrics):
    """The summary line of a run's output.metrics (bench/cpu_step.py and gpu_train.py use it too)."""
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", default=os.path.join(ROOT, "build", "pipetrain"))
    ap.add_argument("--steps", type=int, default=12)
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


if __name__ == "__main__":
    main()
