#!/usr/bin/env python3
"""Fits the cost model's fixed parts (partition/cost_model.h: a kernel's launch by what runs it;
plan/chunk_costs.h: an action's, and a received action's) to the per-chunk table of
bench/chunk_costs.py, and prints the constants beside the ones the headers have.

The runs are chunk_costs.py's (every sample and, with --exports, the exported fixtures, at 1, 2 and
4 stages). Each is run once with --profile, whose metrics summary lists every node with what the
model counts for it (FLOPs, bytes, cached bytes, launch): summed per chunk and pass, these are the
features of each F, B and W cell; its chunk_devices say which F and B received their input from
another device. Then each run is repeated unprofiled (--repeat, the runs taking turns) and each
cell's measured time is its median. A cell's ratio is its measured share of its
run over its modelled share, as in chunk_costs.py; the fit minimises the sum of squared log
ratios over every cell (Levenberg-Marquardt on the constants' logs). FLOPs and bytes keep their
prices (a FLOP 1, a byte 4, a cached byte 2): the fixed parts are what is fitted.

Usage: .venv/bin/python bench/fit_costs.py [--exports] [--repeat 5] [--steps 10]   (needs numpy)
"""

import argparse
import os
import re
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chunk_costs as cc  # noqa: E402

# (feature, header constant); a node's launch value says which kernel kind it is.
LAUNCHES = [("conv", "kFlopsPerConvolution"), ("conv_grad_input", "kFlopsPerConvolutionGradInput"),
            ("conv_grad_weight", "kFlopsPerConvolutionGradWeight"), ("product", "kFlopsPerProduct"),
            ("library", "kFlopsPerLibraryCall"), ("kernel", "kFlopsPerKernel")]
ACTIONS = [("action", "kFlopsPerAction"), ("received", "kFlopsPerReceivedAction")]
NAMES = ["work"] + [n for n, _ in LAUNCHES + ACTIONS]


def header_constants():
    """Every constexpr int64_t kFlopsPer... of the two headers, by name."""
    out = {}
    for path in ("partition/cost_model.h", "plan/chunk_costs.h"):
        with open(os.path.join(cc.ROOT, path)) as f:
            for m in re.finditer(r"constexpr int64_t (kFlopsPer\w+) = ([0-9']+);", f.read()):
                out[m.group(1)] = int(m.group(2).replace("'", ""))
    return out


def node_features(n, k):
    """A node's row: its work (FLOPs and bytes at their prices) and a 1 in its launch's column (a
    convolution's: its own kind's, or a product's or a plain kernel's where it runs as one)."""
    x = np.zeros(len(NAMES))
    stream = n["bytes_read"] + n["bytes_written"] - n["cached_bytes"]
    x[0] = n["flops"] + k["kFlopsPerByte"] * stream + k["kFlopsPerCachedByte"] * n["cached_bytes"]
    kind = {"Conv": "conv", "ConvGradInput": "conv_grad_input", "ConvGradWeight": "conv_grad_weight"}.get(n["op"])
    for i, (name, const) in enumerate(LAUNCHES):
        if n["launch"] > 0 and n["launch"] == k[const] and (kind is None or name in (kind, "product", "kernel")):
            x[1 + i] = 1
            break
    return x


def cells(profiled, measured, k):
    """Per cell of one run (F, B, W per chunk; B+W fused at 1 stage): its feature row and measured seconds."""
    devices, sched = profiled["chunk_devices"], profiled["schedule"]
    nch = len(devices)
    x = np.zeros((nch, 3, len(NAMES)))
    for n in profiled["profile"]:
        x[n["chunk"], "FBW".index(n["pass"])] += node_features(n, k)
    launches = slice(1, 1 + len(LAUNCHES))
    for c in range(nch):
        for p in range(3):
            if x[c, p, launches].sum() > 0:
                x[c, p, NAMES.index("action")] = 1
        if c > 0 and devices[c - 1] != devices[c] and x[c, 0, launches].sum() > 0:
            x[c, 0, NAMES.index("received")] = 1
        if c + 1 < nch and devices[c + 1] != devices[c] and x[c, 1, launches].sum() > 0:
            x[c, 1, NAMES.index("received")] = 1
    m = np.array(cc.spent(measured))
    rows = []
    for c in range(nch):
        if sched in ("gpipe", "1f1b", "interleaved"):
            rows += [(x[c, 0], m[c, 0]), (x[c, 1] + x[c, 2], m[c, 1] + m[c, 2])]
        else:
            rows += [(x[c, p], m[c, p]) for p in range(3)]
    rows = [(r, s) for r, s in rows if r[NAMES.index("action")] > 0]
    return np.array([r for r, _ in rows]), np.array([s for _, s in rows])


def ratios(runs, w):
    out = []
    for x, y in runs:
        p = x @ w
        out.append(y / (p * y.sum() / p.sum()))
    return np.concatenate(out)


def fit(runs, w0):
    """The constants (all but work's price, fixed at 1) minimising the squared log ratios."""
    th = np.log(w0[1:])
    resid = lambda t: np.log(ratios(runs, np.concatenate([[1.0], np.exp(t)])))
    lam = 1e-3
    for _ in range(100):
        r0 = resid(th)
        jac = np.stack([(resid(th + d) - r0) / 1e-6 for d in np.eye(len(th)) * 1e-6], 1)
        step = np.linalg.solve(jac.T @ jac + lam * np.eye(len(th)), -jac.T @ r0)
        if np.sum(resid(th + step) ** 2) < np.sum(r0 ** 2):
            th, lam = th + step, lam / 3
        else:
            lam *= 10
    return np.concatenate([[1.0], np.exp(th)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", default=os.path.join(cc.ROOT, "build", "pipetrain"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--exports", action="store_true")
    a = ap.parse_args()
    k = header_constants()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = cc.jobs_for(dict(cc.SAMPLES, **(cc.EXPORTS if a.exports else {})), tmp)
        profiled = [cc.run(a.pipetrain, config, 3, sets, sys.stderr, ["--profile"]) for _, config, sets in jobs]
        measured = cc.run_in_turns(a.pipetrain, jobs, a.steps, a.repeat, sys.stderr)
    runs = [cells(p, m, k) for p, m in zip(profiled, measured) if p and m]
    now = np.array([1.0] + [k[c] for _, c in LAUNCHES + ACTIONS], dtype=float)
    best = fit(runs, now)
    for label, w in (("headers", now), ("fitted", best)):
        r = ratios(runs, w)
        print(f"{label:8s} cells outside 25%: {int(np.sum(np.abs(r - 1) > 0.25))} of {len(r)}, "
              f"rms log ratio {np.sqrt(np.mean(np.log(r) ** 2)):.4f}")
    for (name, const), h, f in zip(LAUNCHES + ACTIONS, now[1:], best[1:]):
        print(f"  {const:32s} {int(h):>9,d}  fitted {int(round(f, -3)):>9,d}")


if __name__ == "__main__":
    main()
