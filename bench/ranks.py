#!/usr/bin/env python3
"""The pipeline in one process against the same pipeline on MPI ranks (charlm, the main job's model).

For each layout (stages x ranks): `pipetrain train samples/charlm/train.yaml` for --steps steps
with one thread per stage, and the median step time it reports (metrics summary, steps after
the first); the share of the devices' time in sends and receives (the Chrome trace's "comm"
spans over the steps after the first, against devices x step); the simulator's step on the
measured costs, the measured transfer time between devices included (the "simulated on measured
costs" of its summary line). The trained models of the one-process and the multi-process runs
must be byte-identical (it says so). On a 2-core machine 4 ranks are oversubscribed: the figures
then say what the transport costs, not what 4 machines would give.

Usage: .venv/bin/python bench/ranks.py [--pipetrain build/pipetrain] [--steps 12]
"""
import argparse
import filecmp
import json
import os
import re
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(binary, out, steps, stages, kind, ranks, tcp=False):
    """(median step s, comm share, simulated step s) of one run."""
    os.makedirs(out, exist_ok=True)
    args = [binary, "train", "samples/charlm/train.yaml", "-q", "--set", f"steps={steps}", "--set", "eval_every=0",
            "--set", "checkpoint.dir=", "--set", f"output.trace={out}/trace.json", "--set", "output.timeline=",
            "--set", f"output.model={out}/m.onnx", "--set", f"output.metrics={out}/m.jsonl",
            "--set", f"pipeline.stages={stages}", "--set", f"pipeline.schedule={kind}", "--set", "threads=1"]
    if ranks > 1:
        mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
        args = [mpirun, "--oversubscribe", "--allow-run-as-root", "-n", str(ranks)] + \
               (["--mca", "btl", "self,tcp"] if tcp else []) + args
    printed = subprocess.run(args, check=True, cwd=ROOT, stdout=subprocess.PIPE, text=True).stdout
    simulated = re.search(r"simulated on measured costs ([0-9.]+) ms", printed)
    with open(f"{out}/m.jsonl") as f:
        median = next(json.loads(line)["summary"]["step_s_median"] for line in f if "summary" in line)
    return median, comm_share(f"{out}/trace.json"), float(simulated.group(1)) / 1e3 if simulated else float("nan")


def comm_share(trace):
    """Time in sends and receives over devices x step time, for the traced steps after the first."""
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X" and e["tid"] < 1000]
    later = [e for e in events if e["args"]["step"] > 0]
    devices = len({e["tid"] for e in later})
    steps = {}
    for e in later:
        lo, hi = steps.get(e["args"]["step"], (e["ts"], e["ts"] + e["dur"]))
        steps[e["args"]["step"]] = (min(lo, e["ts"]), max(hi, e["ts"] + e["dur"]))
    wall = sum(hi - lo for lo, hi in steps.values())
    comm = sum(e["dur"] for e in later if e["cat"] == "comm")
    return comm / (devices * wall) if wall else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", default=os.path.join(ROOT, "build", "pipetrain"))
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pt_bench_ranks_")
    print("| stages | schedule | layout | step ms (median) | in sends and receives | simulated step ms | trained model |")
    print("|---|---|---|---|---|---|---|")
    for stages, kind in ((2, "1f1b"), (2, "zb-h1"), (4, "1f1b")):
        runs = [(1, False)] + [(stages, False), (stages, True)]
        for ranks, tcp in runs:
            out = f"{tmp}/r{ranks}{'tcp' if tcp else ''}"
            t, share, sim = train(a.pipetrain, out, a.steps, stages, kind, ranks, tcp)
            if ranks == 1:
                layout, same = f"1 process, {stages} device threads", "(reference)"
            else:
                layout = f"{ranks} ranks{' over TCP' if tcp else ' (shared memory)'}"
                same = "byte-identical" if filecmp.cmp(f"{tmp}/r1/m.onnx", f"{out}/m.onnx", shallow=False) else "DIFFERENT"
            print(f"| {stages} | {kind} | {layout} | {1e3 * t:.1f} | {100 * share:.1f}% | {1e3 * sim:.1f} | {same} |",
                  flush=True)

if __name__ == "__main__":
    main()
