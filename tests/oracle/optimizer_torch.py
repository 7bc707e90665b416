"""Optimizer updates against torch.optim.

Writes random float32 parameters (five tensors, one above the C++ parallel threshold) and five
gradient sets as .npy, runs optimizer_replay (tests/train/optimizer_replay.cc) with the parameters
in two groups (as two pipeline stages), and compares the parameters after every step with
torch.optim.SGD / torch.optim.AdamW over two param groups (foreach=False), with
torch.nn.utils.clip_grad_norm_ over all parameters before each step and a LambdaLR warm-up +
cosine schedule stepped after it, all in float32.

Usage: optimizer_torch.py --replay BIN [--tol 1e-6]
Prints one line per case and closes with 'N passed, M failed'.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from stage_chain import report  # noqa: E402

SHAPES = [(64, 33), (7,), (300, 400), (3, 5), (1,)]
GROUPS = [2, 3]  # consecutive parameters per group
STEPS = 5
# Gradient set s is standard normal times GRAD_SCALES[s]; clipping at half the first set's norm
# clips the large sets and leaves the small ones alone.
GRAD_SCALES = [1.0, 0.05, 2.0, 0.1, 1.0]

# Each case: label and the replay flags; torch is set up from the same values.
CASES = [
    ("sgd momentum 0.9 wd 0.01",
     dict(kind="sgd", lr=0.05, momentum=0.9, nesterov=0, weight_decay=0.01)),
    ("sgd nesterov momentum 0.9 wd 0.01",
     dict(kind="sgd", lr=0.05, momentum=0.9, nesterov=1, weight_decay=0.01)),
    ("sgd nesterov clip warm-up 2 cosine, reload after 2",
     dict(kind="sgd", lr=0.05, momentum=0.9, nesterov=1, weight_decay=0.01, clip="half",
          warmup=2, schedule="cosine", total_steps=5, min_lr=0.005, reload_at=2)),
    ("adamw wd 0.1",
     dict(kind="adamw", lr=0.01, weight_decay=0.1)),
    ("adamw wd 0.1 clip warm-up 2 cosine",
     dict(kind="adamw", lr=0.01, weight_decay=0.1, clip="half", warmup=2, schedule="cosine",
          total_steps=5, min_lr=0.001)),
    ("adamw wd 0.1 betas 0.8,0.99 eps 1e-6 clip cosine, reload after 3",
     dict(kind="adamw", lr=0.01, weight_decay=0.1, beta1=0.8, beta2=0.99, eps=1e-6, clip="half",
          schedule="cosine", total_steps=5, min_lr=0.0, reload_at=3)),
]


def lr_factor(case, t):
    """The schedule of train/optimizer.h: warm-up (t + 1)/W, then constant or cosine down to min_lr."""
    w = case.get("warmup", 0)
    if t < w:
        return (t + 1) / w
    if case.get("schedule", "constant") == "constant":
        return 1.0
    r = case["min_lr"] / case["lr"]
    q = min(1.0, (t - w) / max(1.0, case["total_steps"] - 1.0 - w))
    return r + (1.0 - r) * 0.5 * (1.0 + math.cos(math.pi * q))


def torch_reference(case, params, grads, max_norm):
    """Parameters after each step, as numpy arrays: [step][param]."""
    tensors = [torch.tensor(p).requires_grad_(True) for p in params]
    groups, first = [], 0
    for n in GROUPS:
        groups.append({"params": tensors[first:first + n]})
        first += n
    if case["kind"] == "sgd":
        opt = torch.optim.SGD(groups, lr=case["lr"], momentum=case["momentum"],
                              nesterov=bool(case["nesterov"]),
                              weight_decay=case["weight_decay"], foreach=False)
    else:
        opt = torch.optim.AdamW(groups, lr=case["lr"],
                                betas=(case.get("beta1", 0.9), case.get("beta2", 0.999)),
                                eps=case.get("eps", 1e-8), weight_decay=case["weight_decay"],
                                foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: lr_factor(case, t))
    out = []
    for step_grads in grads:
        for t, g in zip(tensors, step_grads):
            t.grad = torch.tensor(g)
        if max_norm:
            torch.nn.utils.clip_grad_norm_(tensors, max_norm)
        opt.step()
        sched.step()
        out.append([t.detach().numpy().copy() for t in tensors])
    return out


def replay_flags(case, max_norm):
    flags = {"kind": case["kind"], "lr": case["lr"], "weight-decay": case["weight_decay"],
             "groups": ",".join(map(str, GROUPS)), "steps": STEPS}
    for key in ("momentum", "nesterov", "beta1", "beta2", "eps", "warmup", "schedule",
                "min_lr", "total_steps", "reload_at"):
        if key in case:
            flags[key.replace("_", "-")] = case[key]
    if max_norm:
        flags["clip"] = max_norm
    return [x for k, v in flags.items() for x in (f"--{k}", repr(v) if isinstance(v, float)
                                                  else str(v))]


def check_case(args, case, params, grads, max_norm):
    want = torch_reference(case, params, grads, max_norm)
    with tempfile.TemporaryDirectory() as tmp:
        for k, p in enumerate(params):
            np.save(os.path.join(tmp, f"param_{k}.npy"), p)
        for s, step_grads in enumerate(grads):
            for k, g in enumerate(step_grads):
                np.save(os.path.join(tmp, f"grad_{s}_{k}.npy"), g)
        res = subprocess.run([args.replay, tmp] + replay_flags(case, max_norm),
                             capture_output=True, text=True)
        if res.returncode != 0:
            return f"optimizer_replay failed: {res.stderr.strip()}"
        # Error of a tensor: largest difference over its largest magnitude. float32 rounds at
        # 6e-8 relative; torch's vectorised kernels fuse multiply-adds and sum norms in another
        # order than ours, so the two differ by a few ulps a step. 1e-6 (16 ulps) covers five
        # steps of that; a wrong formula (bias correction, L2 vs decoupled decay, schedule step,
        # clip factor) is off by 1e-4 or more.
        worst, where = 0.0, ""
        for s in range(STEPS):
            for k, ref in enumerate(want[s]):
                got = np.load(os.path.join(tmp, f"out_{s}_{k}.npy"))
                if got.shape != ref.shape or got.dtype != np.float32:
                    return f"step {s} param {k}: {got.dtype}{got.shape}, want float32{ref.shape}"
                err = float(np.max(np.abs(got.astype(np.float64) - ref))) / max(
                    float(np.max(np.abs(ref))), 1e-30)
                if err > worst:
                    worst, where = err, f"step {s} param {k}"
        if worst > args.tol:
            return f"max relative error {worst:.3g} at {where} > {args.tol}"
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", required=True)
    ap.add_argument("--tol", type=float, default=1e-6)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[(rng.standard_normal(s) * scale).astype(np.float32) for s in SHAPES]
             for scale in GRAD_SCALES]
    norms = [math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in gs)) for gs in grads]
    half = 0.5 * norms[0]
    clipped = sum(n > half for n in norms)
    results = []
    for label, case in CASES:
        max_norm = half if case.get("clip") == "half" else 0.0
        if max_norm:
            label += f" ({clipped}/{STEPS} steps clipped)"
        results.append((label, check_case(args, case, params, grads, max_norm)))
    report(results)


if __name__ == "__main__":
    main()
