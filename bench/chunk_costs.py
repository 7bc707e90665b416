#!/usr/bin/env python3
"""Train's measured F, B and W per chunk against the cost model's (plan/chunk_costs.h), on every
sample and a few of today's exports: the table of the README's "measured against the cost model".

Each run is `pipetrain train` for a few steps; its metrics summary holds per chunk the measured
seconds (the median action: what its thread spent, CLOCK_THREAD_CPUTIME_ID, where every device runs
one thread on the CPU, as here; its wall time otherwise) and the model's work units. As train's summary does, the units are
turned into ms at one rate fitted over the run (all measured F+B+W over all planned F+B+W), so a
ratio says how far the model's share for a chunk is from its measured share (1.00: exact). Each
run is repeated (--repeat, 3), the runs taking turns (every run once, then every run again), and
each measured cell is the median over the repeats: on shared cores one run's actions can be
preempted, and a slow spell of the machine then falls on one repeat of many runs.

Runs: charlm as its train.yaml configures it (4 stages x 2 chunks, zb-v, 8 micro-batches of 8);
every other sample (no train.yaml: a config made here, SGD, synthetic data, 4 micro-batches) at 1
stage and at 2 and 4 stages under zb-h1, which runs B and W as separate actions (1 stage runs them
fused: one B+W cell); with --exports also six of samples/exports the same way (batch 2, as they
were exported). Last, a summary per sample (the README's table): the range of each column's
ratios and the cells outside 25%.

Usage: python3 bench/chunk_costs.py [--pipetrain build/pipetrain] [--steps 10] [--repeat 3] [--only NAME ...]
       [--exports] (also the exported fixtures) [--csv FILE] (every cell, for a spreadsheet)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from machine import cpu_name  # bench/machine.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (model, batch, extra YAML lines); loss cross-entropy on the output, synthetic data.
SAMPLES = {
    "mlp": ("samples/mlp/mlp.onnx", 32, ""),
    "gpt": ("samples/gpt/gpt.onnx", 8, "parameters: {frozen: [mask]}\n"),
    "bert": ("samples/bert/bert.onnx", 8, ""),
    "vit": ("samples/vit/vit.onnx", 8, ""),
    "resnet": ("samples/resnet/resnet.onnx", 8, ""),
    "mobilenet": ("samples/mobilenet/mobilenet.onnx", 8, ""),
    "dropout-gpt2": ("samples/dropout/gpt2.onnx", 2, ""),
}
EXPORTS = {
    "x-gpt2": ("samples/exports/gpt2.onnx", 2, ""),
    "x-bert": ("samples/exports/bert.onnx", 2, ""),
    "x-llama": ("samples/exports/llama.onnx", 2, ""),
    "x-vit": ("samples/exports/vit.onnx", 2, ""),
    "x-resnet": ("samples/exports/resnet.onnx", 2, ""),
    "x-convnext": ("samples/exports/convnext.onnx", 2, ""),
}
PIPELINES = [(1, "1f1b"), (2, "zb-h1"), (4, "zb-h1")]


def run(binary, config, steps, sets, log, flags=()):
    """pipetrain train CONFIG for `steps` (and `flags`); the summary line of its metrics, or None
    (log says why)."""
    with tempfile.TemporaryDirectory() as out:
        metrics = os.path.join(out, "metrics.jsonl")
        args = [binary, "train", config, "-q", *flags, "--set", f"steps={steps}", "--set", "eval_every=0",
                "--set", "checkpoint.dir=", "--set", "output.model=", "--set", "output.safetensors=",
                "--set", "output.trace=", "--set", "output.timeline=", "--set", f"output.metrics={metrics}"]
        for k, v in sets.items():
            args += ["--set", f"{k}={v}"]
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            log.write(f"{' '.join(args)}\n  exit {p.returncode}: {p.stderr.strip()[-300:]}\n")
            return None
        with open(metrics) as f:
            for line in f:
                j = json.loads(line)
                if "summary" in j:
                    return j["summary"]
    return None


def spent(summary):
    """Per chunk the measured F, B and W: what the actions spent (thread CPU time) where the
    summary has it, their wall time from a pipetrain before it."""
    return summary.get("chunk_costs_spent_s", summary["chunk_costs_s"])


def jobs_for(models, folder, only=None):
    """The runs, as (name, config, sets): charlm as its train.yaml says, then each of `models` (name
    -> (model, batch, extra YAML)) under PIPELINES, its config written into `folder`; only those
    named in `only`, where given."""
    jobs = []
    if not only or "charlm" in only:
        jobs.append(("charlm", "samples/charlm/train.yaml", {}))
    for name, (model, batch, extra) in models.items():
        if only and name not in only:
            continue
        config = os.path.join(folder, name + ".yaml")
        with open(config, "w") as f:
            f.write(f"model: {os.path.join(ROOT, model)}\ndims: {{batch: {batch}}}\n"
                    f"loss: {{kind: cross_entropy, output: output}}\ndata: {{kind: synthetic}}\n"
                    f"optimizer: {{kind: sgd, lr: 1.0e-3}}\n{extra}")
        for stages, kind in PIPELINES:
            jobs.append((name, config, {"pipeline.stages": stages, "pipeline.schedule": kind, "pipeline.micro_batches": 4}))
    return jobs


def median_summary(summaries):
    """One summary whose measured chunk costs are each cell's median over the repeats."""
    s = dict(summaries[0])
    cells = [[sorted(spent(x)[c][k] for x in summaries)[len(summaries) // 2] for k in range(3)]
             for c in range(len(spent(s)))]
    s["chunk_costs_spent_s"] = cells
    return s


def run_in_turns(binary, jobs, steps, repeat, log):
    """Each job (name, config, sets) run `repeat` times, the jobs taking turns: every job's first
    run, then every job's second, and so on, so that a slow spell of a shared machine falls on one
    run of many jobs, which each cell's median leaves out, not on every run of a few. Per job, in
    order: its median summary, or None where no run succeeded."""
    got = [[] for _ in jobs]
    for _ in range(repeat):
        for j, (_, config, sets) in enumerate(jobs):
            s = run(binary, config, steps, sets, log)
            if s:
                got[j].append(s)
    return [median_summary(g) if g else None for g in got]


def rows_of(name, summary):
    """Per chunk: name, run, chunk, and (measured ms, model ms, ratio) for F, B, W (B+W fused at 1f1b)."""
    measured, model = spent(summary), summary["chunk_costs_model"]
    seconds = sum(sum(c) for c in measured)
    units = sum(sum(c) for c in model)
    ms_per_unit = seconds * 1e3 / units
    fused = summary["schedule"] in ("gpipe", "1f1b", "interleaved")
    run = f"{summary['stages']}x{summary['chunks']} {summary['schedule']}"
    out = []
    for c, (m, p) in enumerate(zip(measured, model)):
        cells = [(m[0], p[0])]
        cells += [(m[1] + m[2], p[1] + p[2]), None] if fused else [(m[1], p[1]), (m[2], p[2])]
        row = [name, run, c]
        for cell in cells:
            if cell is None:
                row.append(None)
                continue
            have, want = cell[0] * 1e3, cell[1] * ms_per_unit
            row.append((have, want, have / want if want > 0 else float("nan")))
        out.append(row)
    return out


def print_summary(rows):
    """Per sample: the range of the F, B (B+W where fused) and W ratios over its runs and chunks; a
    cell whose model is 0 (B of a first chunk) is left out."""
    print("| sample | runs | chunks | F ratio | B (1 stage: B+W) ratio | W ratio | cells outside 25% |")
    print("|---|---|---|---|---|---|---|")
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name]
        runs = ", ".join(dict.fromkeys(r[1] for r in mine))
        cells = []
        for k in range(3):
            v = [r[3 + k][2] for r in mine if r[3 + k] is not None and r[3 + k][1] > 0]
            cells.append(f"{min(v):.2f}-{max(v):.2f}" if v else "-")
        out = sum(1 for r in mine for c in r[3:] if c is not None and c[1] > 0 and abs(c[2] - 1) > 0.25)
        print(f"| {name} | {runs} | {len(mine)} | {cells[0]} | {cells[1]} | {cells[2]} | {out} |")


def fmt(cell):
    return "-" if cell is None else f"{cell[0]:7.3f} {cell[1]:7.3f} {cell[2]:5.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", default=os.path.join(ROOT, "build", "pipetrain"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; each cell the median")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--exports", action="store_true")
    ap.add_argument("--csv")
    a = ap.parse_args()
    models = dict(SAMPLES, **(EXPORTS if a.exports else {}))
    rows, clocks = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = jobs_for(models, tmp, a.only)
        for (name, _, _), s in zip(jobs, run_in_turns(a.pipetrain, jobs, a.steps, a.repeat, sys.stderr)):
            if s:
                rows += rows_of(name, s)
                clocks.add(s.get("chunk_costs_spent_clock", "wall"))
    print(f"{'sample':<14}{'run':<13}{'chunk':>5}  {'F ms, model, ratio':<23}  {'B ms, model, ratio':<23}  "
          f"{'W ms, model, ratio':<23}")
    for r in rows:
        b = fmt(r[4]) if r[5] is not None else fmt(r[4]) + " (B+W)"
        print(f"{r[0]:<14}{r[1]:<13}{r[2]:>5}  {fmt(r[3]):<23}  {b:<23}  {fmt(r[5]):<23}")
    worst = [r for r in rows if any(c is not None and abs(c[2] - 1) > 0.25 for c in r[3:])]
    print(f"{cpu_name()}; {len(rows)} chunks, {len(worst)} with a cell outside 25%; measured: "
          f"{', '.join(sorted(clocks))} time")
    print()
    print_summary(rows)
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("sample,run,chunk,f_ms,f_model_ms,f_ratio,b_ms,b_model_ms,b_ratio,w_ms,w_model_ms,w_ratio\n")
            for r in rows:
                cells = [",".join(f"{x:.4f}" for x in c) if c else ",," for c in r[3:]]
                f.write(f"{r[0]},{r[1]},{r[2]}," + ",".join(cells) + "\n")


if __name__ == "__main__":
    main()
