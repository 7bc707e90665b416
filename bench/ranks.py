#!/usr/bin/env python3
"""The pipeline in one process against the same pipeline on MPI ranks (charlm, the main job's model).

For each layout (stages x ranks): `pipetrain train samples/charlm/train.yaml` for --steps steps
with one thread per stage, and the median step time it reports (metrics summary, steps after
the first); the trained models of the one-process and the multi-process runs must be
byte-identical (it says so). On a 2-core machine 4 ranks are oversubscribed: the figures then
say what the transport costs, not what 4 machines would give.

Usage: .venv/bin/python bench/ranks.py [--pipetrain build/pipetrain] [--steps 12]
"""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(binary, out, steps, stages, kind, ranks, tcp=False):
    os.makedirs(out, exist_ok=True)
    args = [binary, "train", "samples/charlm/train.yaml", "-q", "--set", f"steps={steps}", "--set", "eval_every=0",
            "--set", "checkpoint.dir=", "--set", "output.trace=", "--set", "output.timeline=",
            "--set", f"output.model={out}/m.onnx", "--set", f"output.metrics={out}/m.jsonl",
            "--set", f"pipeline.stages={stages}", "--set", f"pipeline.schedule={kind}", "--set", "threads=1"]
    if ranks > 1:
        mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
        args = [mpirun, "--oversubscribe", "--allow-run-as-root", "-n", str(ranks)] + \
               (["--mca", "btl", "self,tcp"] if tcp else []) + args
    subprocess.run(args, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    with open(f"{out}/m.jsonl") as f:
        for line in f:
            j = json.loads(line)
            if "summary" in j:
                return j["summary"]["step_s_median"]
    raise RuntimeError("no summary")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", default=os.path.join(ROOT, "build", "pipetrain"))
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pt_bench_ranks_")
    print("| stages | schedule | layout | step ms (median) | trained model |")
    print("|---|---|---|---|---|")
    for stages, kind in ((2, "1f1b"), (2, "zb-h1"), (4, "1f1b")):
        base = train(a.pipetrain, f"{tmp}/one", a.steps, stages, kind, 1)
        print(f"| {stages} | {kind} | 1 process, {stages} device threads | {1e3 * base:.1f} | (reference) |", flush=True)
        for ranks, tcp in ((stages, False), (stages, True)):
            out = f"{tmp}/r{ranks}{'tcp' if tcp else ''}"
            t = train(a.pipetrain, out, a.steps, stages, kind, ranks, tcp)
            same = "byte-identical" if filecmp.cmp(f"{tmp}/one/m.onnx", f"{out}/m.onnx", shallow=False) else "DIFFERENT"
            print(f"| {stages} | {kind} | {ranks} ranks{' over TCP' if tcp else ' (shared memory)'} | "
                  f"{1e3 * t:.1f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
