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
after a change) is one row pair; the trained files of every run must be byte-identical (their
sha256; they are removed after each run). With --eval-every N the runs also evaluate 8 held-out
samples every N steps and after the last. `--export-memory-model PATH --size 1b` makes a GPT of
1.04B parameters (d 2048, 20 layers; 4.2 GB of weights), trained with --memory-steps 2.

With --plan-memory MODEL (the same model): 2 AdamW steps of 4 micro-batches of 2 (1f1b) on 1
stage, on 4 stages in one process, and on 4 ranks; each process's peak RSS after the last step
(train's summary) against the host memory train planned for it (plan/memory.h) and against issue
42's bound, 1.25 x (4 x parameter bytes + planned peak activations) + 300 MiB.

Usage: .venv/bin/python bench/ranks.py [--pipetrain build/pipetrain] [--steps 12]
       .venv-export/bin/python bench/ranks.py --export-memory-model out/nanogpt117m.onnx
       .venv/bin/python bench/ranks.py --memory out/nanogpt117m.onnx --pipetrain A --pipetrain B [--eval-every 2]
       .venv-export/bin/python bench/ranks.py --export-memory-model out/gpt1b.onnx --size 1b
       .venv/bin/python bench/ranks.py --memory out/gpt1b.onnx --memory-steps 2
       .venv/bin/python bench/ranks.py --plan-memory out/nanogpt117m.onnx [--layouts 1x1,4x1,4x4]
"""
import argparse
import filecmp
import hashlib
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
steps: {steps}
eval_every: {eval_every}
output: {{model: {out}/trained.onnx, safetensors: {out}/trained.safetensors, metrics: {out}/m.jsonl}}
"""


# The generated GPTs (samples/exports/make_exports.py's NanoGPT, untied head, context 128, vocab
# 8192): 117M parameters (470 MB of weights) and 1.04B (4.2 GB).
SIZES = {"117m": {"d": 1024, "heads": 16, "layers": 8}, "1b": {"d": 2048, "heads": 16, "layers": 20}}


def export_memory_model(path, size):
    """A generated nanoGPT of `size` (SIZES), by export_model.py: nothing downloaded."""
    subprocess.run([sys.executable, "samples/export_model.py", "--module", "samples/exports/make_exports.py:NanoGPT",
                    "--kwargs", json.dumps(dict(SIZES[size], vocab=8192, tie=False)),
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


def digests(out):
    """sha256 of each trained file in `out` (the model, its external data, the safetensors), which
    are then removed: a 1B model's outputs are 8 GB a run."""
    found = {}
    for name in sorted(os.listdir(out)):
        if name.startswith("trained."):
            h = hashlib.sha256()
            with open(f"{out}/{name}", "rb") as f:
                for block in iter(lambda: f.read(1 << 24), b""):
                    h.update(block)
            found[name] = h.hexdigest()
            os.remove(f"{out}/{name}")
    return found


def memory(model, binaries, steps, eval_every=0):
    tmp = tempfile.mkdtemp(prefix="pt_bench_memory_")
    data = model + ".data"
    weights_mib = os.path.getsize(data if os.path.exists(data) else model) / 2**20  # inline: the .onnx
    print(f"weights {weights_mib:,.0f} MiB; AdamW holds 4x: {4 * weights_mib:,.0f} MiB; {steps} steps")
    print("| binary | run | peak RSS MiB per process | largest / one process | sum / one process | "
          "one process / (4 x weights + 300 MiB) | import s (inspect) | import peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    reference = None
    for i, binary in enumerate(binaries):
        inspect = timed([binary, "inspect", model], f"{tmp}/b{i}_inspect")[0]
        one = None
        for ranks in (1, 4):
            out = f"{tmp}/b{i}_r{ranks}"
            os.makedirs(out, exist_ok=True)
            config = f"{out}/train.yaml"
            with open(config, "w") as f:
                f.write(MEMORY_CONFIG.format(model=os.path.abspath(model), out=out, steps=steps, eval_every=eval_every,
                                             eval_fraction=0.125 if eval_every else 0))
            rss = [m for m, _ in timed([binary, "train", "-q", config], out, ranks)]
            one = one or rss[0]
            files = digests(out)
            same = reference is None or files == reference
            reference = reference or files
            run = "1 process" if ranks == 1 else f"{ranks} ranks"
            print(f"| {binary} | {run}{'' if same else ' (trained files DIFFER)'} | "
                  f"{' / '.join(f'{m:,.0f}' for m in rss)} | {max(rss) / one:.2f}x | {sum(rss) / one:.2f}x | "
                  f"{one / (4 * weights_mib + 300):.2f} | {inspect[1]:.2f} | {inspect[0]:,.0f} |", flush=True)


PLAN_CONFIG = """model: {model}
dims: {{batch: 2}}
loss: {{kind: cross_entropy}}
data: {{kind: synthetic, samples: 64, eval_fraction: 0}}
optimizer: {{kind: adamw, lr: 1.0e-4}}
pipeline: {{stages: {stages}, chunks: 1, micro_batches: 4, schedule: 1f1b}}
threads: 1
seed: 0
steps: 2
eval_every: 0
"""

UNITS = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40}


def mib(text):
    """'3.39 GiB' -> 3471.4 (MiB)."""
    value, unit = text.split()
    return float(value) * UNITS[unit] / 2 ** 20


def plan_memory(model, binary, layouts=((1, 1), (4, 1), (4, 4))):
    """Issue 42: each process's peak RSS (train's summary, after the last step) against the host
    memory train planned (plan/memory.h) and against the issue's bound, 1.25 x (4 x parameter
    bytes + planned peak activations) + 300 MiB per process."""
    tmp = tempfile.mkdtemp(prefix="pt_bench_plan_memory_")
    print("| layout | process | peak RSS MiB | planned MiB (arena included) | RSS / planned | 4 x params + activations + 300 MiB | RSS / that | within the bound |")
    print("|---|---|---|---|---|---|---|---|")
    arenas = []  # train's "programs' arena per device, allocated / planned" line, per layout
    for stages, ranks in layouts:
        config = f"{tmp}/s{stages}r{ranks}.yaml"
        with open(config, "w") as f:
            f.write(PLAN_CONFIG.format(model=os.path.abspath(model), stages=stages))
        args = [binary, "train", "-q", config]
        if ranks > 1:
            mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
            args = [mpirun, "--oversubscribe", "--allow-run-as-root", "-n", str(ranks)] + args
        printed = subprocess.run(args, check=True, cwd=ROOT, stdout=subprocess.PIPE, text=True).stdout
        # "  device d: parameters + gradients + optimizer state + activations + arena = total": the
        # bound counts the first four (4 x parameter bytes under AdamW, and the activations).
        size = r"([0-9.]+ \w+)"
        rows = re.finditer(rf"^  device \d+: {size} \+ {size} \+ {size} \+ {size} \+ {size} = {size}$", printed, re.M)
        devices = [sum(mib(m.group(i)) for i in range(1, 5)) for m in rows]
        peaks = re.findall(r"^  (process|rank \d+): ([0-9.]+ \w+) / ([0-9.]+ \w+) \(", printed, re.M)
        layout = f"{stages} stage(s), " + ("1 process" if ranks == 1 else f"{ranks} ranks")
        arenas += [f"{layout}: {m.group(1)}" for m in re.finditer(r"^programs' arena per device, allocated / planned[^:]*: (.*)$", printed, re.M)]
        for i, (who, rss, planned) in enumerate(peaks):
            held = devices if ranks == 1 else devices[i * stages // ranks:(i + 1) * stages // ranks]
            issue = sum(held) + 300
            bound = 1.25 * sum(held) + 300
            print(f"| {layout} | {who} | {mib(rss):,.0f} | {mib(planned):,.0f} | {mib(rss) / mib(planned):.2f}x | "
                  f"{issue:,.0f} | {mib(rss) / issue:.2f}x | {'yes' if mib(rss) <= bound else 'no'} |", flush=True)
    print("\nprograms' arena per device, allocated / planned:")
    for line in arenas:
        print(f"  {line}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", action="append")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--memory", metavar="MODEL", help="peak RSS and import of MODEL instead of step times")
    ap.add_argument("--memory-steps", type=int, default=3, help="AdamW steps of --memory (3; 2 for the 1B model)")
    ap.add_argument("--export-memory-model", metavar="PATH", help="export a generated nanoGPT to PATH and stop")
    ap.add_argument("--size", choices=sorted(SIZES), default="117m", help="of --export-memory-model")
    ap.add_argument("--plan-memory", metavar="MODEL", help="peak RSS of MODEL's training against train's planned memory")
    ap.add_argument("--layouts", default="1x1,4x1,4x4",
                    help="--plan-memory: STAGESxRANKS runs, comma-separated (1x1,4x1,4x4)")
    ap.add_argument("--eval-every", type=int, default=0, help="--memory: evaluate 8 held-out samples every N steps")
    a = ap.parse_args()
    if a.export_memory_model:
        return export_memory_model(a.export_memory_model, a.size)
    binaries = a.pipetrain or [os.path.join(ROOT, "build", "pipetrain")]
    if a.memory:
        return memory(a.memory, binaries, a.memory_steps, a.eval_every)
    if a.plan_memory:
        layouts = [tuple(int(n) for n in x.split("x")) for x in a.layouts.split(",")]
        return plan_memory(a.plan_memory, binaries[0], layouts)
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
