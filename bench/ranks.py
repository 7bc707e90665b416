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

With --memory MODEL: memory instead of time. MODEL (made by --export-memory-model with
.venv-export, a nanoGPT of 117M parameters, d 1024, 8 layers, context 128, vocab 8192, untied
head, its 470 MB of weights in MODEL.data) trains 3 AdamW steps of 4 micro-batches of 2 on 4
stages (1f1b), in one process and on 4 ranks (one stage each), writing the trained model and
safetensors; the table gives each process's peak RSS (/usr/bin/time) and the import alone
(`pipetrain inspect MODEL`: what every rank does first). Each --pipetrain binary (before and
after a change) is one row pair; the trained files of every run must be byte-identical. With
--eval-every N the runs also evaluate 8 held-out samples every N steps and after the last.

Usage: .venv/bin/python bench/ranks.py [--pipetrain build/pipetrain] [--steps 12]
       .venv-export/bin/python bench/ranks.py --export-memory-model out/nanogpt117m.onnx
       .venv/bin/python bench/ranks.py --memory out/nanogpt117m.onnx --pipetrain A --pipetrain B [--eval-every 2]
"""
import argparse
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
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


MEMORY_CONFIG = """model: {model}
dims: {{batch: 2}}
loss: {{kind: cross_entropy}}
data: {{kind: synthetic, samples: 64, eval_fraction: {eval_fraction}}}
optimizer: {{kind: adamw, lr: 1.0e-4}}
pipeline: {{stages: 4, chunks: 1, micro_batches: 4, schedule: 1f1b}}
threads: 1
seed: 0
steps: 3
eval_every: {eval_every}
output: {{model: {out}/trained.onnx, safetensors: {out}/trained.safetensors, metrics: {out}/m.jsonl}}
"""


def export_memory_model(path):
    """The 117M nanoGPT (samples/exports/make_exports.py's NanoGPT, untied), by export_model.py."""
    subprocess.run([sys.executable, "samples/export_model.py", "--module", "samples/exports/make_exports.py:NanoGPT",
                    "--kwargs", json.dumps({"d": 1024, "heads": 16, "layers": 8, "vocab": 8192, "tie": False}),
                    "--input-dtype", "int64", "--vocab", "8192", "--input-shape", "2,128", "-o", path],
                   check=True, cwd=ROOT)


def timed(args, out, ranks=1):
    """Each process's (peak RSS MiB, wall s) of `args`, rank by rank."""
    os.makedirs(out, exist_ok=True)
    report = f"{out}/rss" + (".$OMPI_COMM_WORLD_RANK" if ranks > 1 else ".0")
    inner = ["sh", "-c", f'exec /usr/bin/time -f "%M %e" -o "{report}" "$@"', "sh"] + args
    if ranks > 1:
        mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
        inner = [mpirun, "--oversubscribe", "--allow-run-as-root", "-n", str(ranks)] + inner
    subprocess.run(inner, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    out_list = []
    for r in range(ranks):
        with open(f"{out}/rss.{r}") as f:
            kib, wall = f.read().split()[-2:]
        out_list.append((int(kib) / 1024, float(wall)))
    return out_list


def memory(model, binaries, eval_every=0):
    tmp = tempfile.mkdtemp(prefix="pt_bench_memory_")
    print("| binary | run | peak RSS MiB per process | largest / one process | sum / one process | import s (inspect) | import peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    reference = None
    for i, binary in enumerate(binaries):
        inspect = timed([binary, "inspect", model], f"{tmp}/b{i}_inspect")[0]
        one = None
        for ranks in (1, 4):
            out = f"{tmp}/b{i}_r{ranks}"
            os.makedirs(out, exist_ok=True)
            config = f"{out}/train.yaml"
            with open(config, "w") as f:
                f.write(MEMORY_CONFIG.format(model=os.path.abspath(model), out=out, eval_every=eval_every,
                                             eval_fraction=0.125 if eval_every else 0))
            rss = [m for m, _ in timed([binary, "train", "-q", config], out, ranks)]
            one = one or rss[0]
            same = []
            for name in ("trained.onnx", "trained.safetensors"):
                if reference is None:
                    continue
                same.append(filecmp.cmp(f"{reference}/{name}", f"{out}/{name}", shallow=False))
            reference = reference or out
            run = "1 process" if ranks == 1 else f"{ranks} ranks"
            print(f"| {binary} | {run}{'' if all(same) else ' (trained files DIFFER)'} | "
                  f"{' / '.join(f'{m:,.0f}' for m in rss)} | {max(rss) / one:.2f}x | {sum(rss) / one:.2f}x | "
                  f"{inspect[1]:.2f} | {inspect[0]:,.0f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", action="append")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--memory", metavar="MODEL", help="peak RSS and import of MODEL instead of step times")
    ap.add_argument("--export-memory-model", metavar="PATH", help="export the 117M nanoGPT to PATH and stop")
    ap.add_argument("--eval-every", type=int, default=0, help="--memory: evaluate 8 held-out samples every N steps")
    a = ap.parse_args()
    if a.export_memory_model:
        return export_memory_model(a.export_memory_model)
    binaries = a.pipetrain or [os.path.join(ROOT, "build", "pipetrain")]
    if a.memory:
        return memory(a.memory, binaries, a.eval_every)
    a.pipetrain = binaries[0]
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
