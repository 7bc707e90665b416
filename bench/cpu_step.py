#!/usr/bin/env python3
"""Training step on the CPU against the PyTorch users train with (PyPI's, MKL and oneDNN inside).

The charlm model (samples/charlm/make_charlm.py) at three sizes, made and exported to ONNX by the
same PyTorch, then trained for a few steps by each contender on the same batching: 8 micro-batches
of 8 windows, AdamW, clipping at 1.0, the loss the mean over the global batch.

  - PyTorch eager: forward and backward of every micro-batch (gradient accumulation), clipping,
    AdamW; torch.set_num_threads(T).
  - torch.compile (--compile): the same with the model compiled by inductor (its first steps,
    which compile, are not timed).
  - pipetrain on one stage with T threads, and on two stages (zb-h1) with T/2 threads each.

The contenders run in turns, A B C A B C ..., each turn a fresh process running --steps steps
and reporting the median of the steps after the first; a figure is the median over --rounds turns,
with the least and the most. Each row also gives the achieved FLOP rate as a share of the MKL
sgemm rate measured by the same torch at T threads on a 1024 x 1024 x 1024 product (the median
of one measurement per turn). --split then profiles one step of eager (torch.profiler) and of
pipetrain (train --profile) per row: the products' time against the rest of each step.

Usage, in the export venv of samples/README.md (PyPI's torch; CI does not need it):
    .venv-export/bin/python bench/cpu_step.py [--sizes 64,256,512] [--threads 1,2] [--rounds 5]
        [--steps 5] [--compile] [--split] [--pipetrain build/pipetrain] [--out DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from machine import cpu_name  # bench/machine.py
from train import summary_of  # bench/train.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "samples", "charlm"))
import make_charlm  # noqa: E402  (imports torch)

CONFIG = make_charlm.CONFIG  # the hyperparameters samples/charlm/train.yaml uses
TEXT = os.path.join(ROOT, "samples", "charlm", "gpl3.txt")
MICRO_BATCH, MICRO_BATCHES = 8, 8
# d_model -> (blocks, context): the sizes issue 15 names.
SIZES = {64: (4, 64), 256: (4, 128), 512: (8, 128)}


def charlm(d, seed=0):
    """The charlm module at width d (heads of 64, at least 4), its blocks and context per SIZES."""
    import torch
    layers, context = SIZES[d]
    torch.manual_seed(seed)
    return make_charlm.CharLM(context, d, max(4, d // 64), layers)


def step_flops(d):
    """Matmul FLOPs of one training step (forward x 3): the linear layers and the attention's two
    products (the whole T x T square, as both implementations compute it)."""
    layers, T = SIZES[d]
    tokens = MICRO_BATCH * MICRO_BATCHES * T
    per_token = 2 * (layers * 12 * d * d + d * 256) + layers * 2 * 2 * T * d
    return 3 * per_token * tokens


def export(d, path):
    import torch
    model = charlm(d)
    model.eval()
    example = torch.randint(0, 256, (MICRO_BATCH, SIZES[d][1]), dtype=torch.long)
    torch.onnx.export(model, (example,), path, input_names=["input"], output_names=["output"])


def torch_step(d, threads, compiled):
    """One training step of the charlm module at width d as a function (eager or compiled)."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    model = charlm(d)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=CONFIG["lr"], betas=CONFIG["betas"],
                            weight_decay=CONFIG["weight_decay"])
    forward = torch.compile(model) if compiled else model
    T = SIZES[d][1]
    g = torch.Generator().manual_seed(0)
    xs = torch.randint(0, 256, (MICRO_BATCHES, MICRO_BATCH, T), generator=g)
    ys = torch.randint(0, 256, (MICRO_BATCHES, MICRO_BATCH, T), generator=g)

    def step():
        opt.zero_grad()
        for m in range(MICRO_BATCHES):
            loss = F.cross_entropy(forward(xs[m]).reshape(-1, 256), ys[m].reshape(-1),
                                   reduction="sum") / (MICRO_BATCHES * ys[m].numel())
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CONFIG["clip"])
        opt.step()
    return step


def torch_worker(d, threads, steps, compiled):
    """Runs in its own process: prints the median step seconds after the first (or after compiling)."""
    step = torch_step(d, threads, compiled)
    warm = 2 if compiled else 1
    times = []
    for _ in range(steps + warm - 1):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step_s": statistics.median(times[warm:])}))


# The ops that run eager's products (their self time is the product's kernel).
TORCH_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def split_worker(d, threads):
    """Runs in its own process: one eager step after a warm-up under torch.profiler; prints the
    step and the self time of its products (TORCH_PRODUCTS) against everything else."""
    from torch.profiler import ProfilerActivity, profile
    step = torch_step(d, threads, False)
    step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        t0 = time.perf_counter()
        step()
        seconds = time.perf_counter() - t0
    events = p.key_averages()
    products = sum(e.self_cpu_time_total for e in events if e.key in TORCH_PRODUCTS) * 1e-6
    busy = sum(e.self_cpu_time_total for e in events) * 1e-6
    print(json.dumps({"step_s": seconds, "products_s": products, "rest_s": busy - products}))


def pipetrain_split(binary, config, steps):
    """pipetrain train --profile: the measured step and the kernel time of its products (MatMul
    and Gemm rows) against the rest of its kernels, per step."""
    text = subprocess.run([binary, "train", config, "--set", f"steps={steps}", "--profile"],
                          check=True, capture_output=True, text=True).stdout
    step = products = kernels = None
    for line in text.splitlines():
        if line.startswith("schedule "):
            step = float(line.split("measured step ")[1].split(" ms")[0]) * 1e-3
        elif line.startswith("kernel time per step"):
            kernels = float(line.rsplit(": ", 1)[1].split(" ms")[0]) * 1e-3
            products = 0.0
        elif products is not None and len(line.split()) == 5 and line.split()[1] in ("MatMul", "Gemm"):
            products += float(line.split()[3]) * 1e-3
    return {"step_s": step, "products_s": products, "rest_s": kernels - products}


def sgemm_worker(threads):
    import torch
    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(3):
        a @ b
    reps, t0 = 20, time.perf_counter()
    for _ in range(reps):
        a @ b
    print(json.dumps({"flops_per_s": reps * 2 * 1024 ** 3 / (time.perf_counter() - t0)}))


def config_for(d, model_path, out, stages, threads):
    """A train.yaml for pipetrain: charlm's hyperparameters, no warm-up, nothing written but metrics."""
    metrics = os.path.join(out, "metrics.jsonl")
    text = f"""model: {model_path}
dims: {{batch: {MICRO_BATCH}}}
loss: {{kind: cross_entropy, output: output}}
data: {{kind: tokens, file: {TEXT}, shuffle: true}}
optimizer:
  kind: adamw
  lr: {CONFIG["lr"]}
  betas: [{CONFIG["betas"][0]}, {CONFIG["betas"][1]}]
  weight_decay: {CONFIG["weight_decay"]}
  clip_grad_norm: {CONFIG["clip"]}
pipeline: {{stages: {stages}, chunks: 1, micro_batches: {MICRO_BATCHES}, schedule: {"zb-h1" if stages > 1 else "1f1b"}}}
parameters: {{frozen: [mask]}}
threads: {threads}
eval_every: 0
output: {{metrics: {metrics}}}
"""
    path = os.path.join(out, f"d{d}_p{stages}_t{threads}.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path, metrics


def pipetrain_step(binary, config, metrics, steps):
    if os.path.exists(metrics):
        os.remove(metrics)
    subprocess.run([binary, "train", config, "-q", "--set", f"steps={steps}"], check=True,
                   stdout=subprocess.DEVNULL)
    return summary_of(metrics)["step_s_median"]


def worker(*args):
    out = subprocess.run([sys.executable, __file__, "--worker", *map(str, args)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def fmt(xs):
    return f"{1e3 * statistics.median(xs):.0f} ({1e3 * min(xs):.0f}-{1e3 * max(xs):.0f})"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, rest = sys.argv[2], [int(x) for x in sys.argv[3:]]
        if kind == "sgemm":
            sgemm_worker(*rest)
        elif kind == "split":
            split_worker(*rest)
        else:
            torch_worker(rest[0], rest[1], rest[2], kind == "compile")
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", default=os.path.join(ROOT, "build", "pipetrain"))
    ap.add_argument("--sizes", default="64,256,512")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    ap.add_argument("--split", action="store_true", help="after the table, one profiled step "
                    "each of eager (torch.profiler) and pipetrain (--profile) per row: the "
                    "products' time against the rest")
    ap.add_argument("--out", help="keep the exported models and pipetrain configs here (for "
                    "bench/ab_step.sh) instead of in a fresh temporary folder")
    a = ap.parse_args()
    import torch
    out = a.out or tempfile.mkdtemp(prefix="pt_bench_cpu_step_")
    os.makedirs(out, exist_ok=True)
    load = os.getloadavg()[0]
    print(f"{cpu_name()}; PyTorch {torch.__version__}, {os.cpu_count()} cores, load average {load:.2f} at the start\n")
    print("| d x blocks x context | threads | PyTorch eager ms | torch.compile ms | pipetrain 1 stage ms "
          "| pipetrain / eager | pipetrain 2 stages ms | MKL sgemm GFLOP/s | eager, pipetrain: share of sgemm |")
    print("|---|---|---|---|---|---|---|---|---|")
    eager = {}  # (d, threads) -> eager's median step seconds
    for d in [int(x) for x in a.sizes.split(",")]:
        model_path = os.path.join(out, f"charlm_d{d}.onnx")
        export(d, model_path)
        for T in [int(x) for x in a.threads.split(",")]:
            arms = {"eager": lambda: worker("eager", d, T, a.steps)["step_s"]}
            if a.compile:
                arms["compile"] = lambda: worker("compile", d, T, a.steps)["step_s"]
            one = config_for(d, model_path, out, 1, T)
            arms["pt1"] = lambda: pipetrain_step(a.pipetrain, *one, a.steps)
            if T % 2 == 0:
                two = config_for(d, model_path, out, 2, T // 2)
                arms["pt2"] = lambda: pipetrain_step(a.pipetrain, *two, a.steps)
            # The sgemm rate takes its turn too: measured once after the turns, on a loaded
            # machine, it came out below the step's own rate.
            arms["sgemm"] = lambda: worker("sgemm", T)["flops_per_s"]
            times = {k: [] for k in arms}
            for _ in range(a.rounds):
                for k, run in arms.items():
                    times[k].append(run())
            gemm = statistics.median(times.pop("sgemm"))
            flops = step_flops(d)
            med = {k: statistics.median(v) for k, v in times.items()}
            eager[(d, T)] = med["eager"]
            layers, context = SIZES[d]
            print(f"| {d} x {layers} x {context} | {T} | {fmt(times['eager'])} | "
                  f"{fmt(times['compile']) if 'compile' in times else '-'} | {fmt(times['pt1'])} | "
                  f"{med['pt1'] / med['eager']:.2f} | {fmt(times['pt2']) if 'pt2' in times else '-'} | "
                  f"{gemm / 1e9:.0f} | {flops / med['eager'] / gemm:.0%}, {flops / med['pt1'] / gemm:.0%} |",
                  flush=True)
    print(f"\n(medians over {a.rounds} turns of {a.steps} steps, least-most in brackets; load average "
          f"{os.getloadavg()[0]:.2f} at the end)")
    if a.split:
        print_split(a, out, eager)


def print_split(a, out, eager):
    """--split: where each contender's step goes, from one profiled step of each per row."""
    print("\n| d x blocks x context | threads | eager step ms | eager products ms | eager rest ms "
          "| pipetrain step ms | pipetrain products ms | pipetrain rest ms | 0.8 x the table's eager ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in [int(x) for x in a.sizes.split(",")]:
        for T in [int(x) for x in a.threads.split(",")]:
            e = worker("split", d, T)
            p = pipetrain_split(a.pipetrain, config_for(d, os.path.join(out, f"charlm_d{d}.onnx"), out, 1, T)[0],
                                max(a.steps, 3))
            layers, context = SIZES[d]
            print(f"| {d} x {layers} x {context} | {T} | {e['step_s'] * 1e3:.0f} | {e['products_s'] * 1e3:.0f} | "
                  f"{e['rest_s'] * 1e3:.0f} | {p['step_s'] * 1e3:.0f} | {p['products_s'] * 1e3:.0f} | "
                  f"{p['rest_s'] * 1e3:.0f} | {0.8 * eager[(d, T)] * 1e3:.0f} |", flush=True)
    print("\n(eager: torch.profiler's self time of aten::mm, addmm and bmm against every other op's, "
          "in one step after a warm-up (the profiler slows the step; the rest leaves out Python's own "
          "time); pipetrain: `train --profile`, each kernel timed alone, steps "
          "after the first; products = MatMul and Gemm)")


if __name__ == "__main__":
    main()
