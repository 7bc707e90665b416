"""`pipetrain train` against PyTorch, and every schedule against one stage.

For each sample in SAMPLES (micro-batch rows B, micro-batches M, loss and optimizer given there):
deterministic npy data of 2*B*M rows (so step 2 wraps around to step 0's rows; cross-entropy
targets have every 7th one ignored), a config YAML, then `pipetrain train` for STEPS steps with
every schedule kind at 1, 2 and 4 stages (2 chunks per device for the interleaved and V-shaped
kinds); a stage count the model cannot be cut into (as `pipetrain partition` says) is skipped.

Checks, each a failure of the run that breaks it:
  (a) every run's trained initializers are bit-identical (np.array_equal, same names, dtypes
      and shapes) to those of the 1-stage 1f1b run;
  (b) the 1-stage 1f1b run equals torch_train.py's float64 reference: for every float
      initializer, its update (trained minus the file's value) equals torch's within --tol
      (1e-4) relative to max|torch's update|, plus float32's rounding at the tensor's magnitude
      (export_model_vs_torch.update_error: a parameter that training barely moves would pass any
      bound relative to its value with a zero gradient); and its metrics lines give every step's
      loss and gradient norm (before clipping) within --tol relative and the learning rate within
      1e-9 relative.
float32 against float64 is only meaningful where float32's rounding cannot change the path the
computation takes. A ReLU input nearer zero than that rounding (about 1e-6 after a BatchNorm)
takes the other branch in one of the two, and in resnet that one element moves the next step's
conv weight gradients by a few percent. So the driver also checks the data itself: the reference
records the smallest |ReLU input| it saw, which must stay above KINK_MARGIN, and torch run in
float32 must be within tol/10 of float64 on the same update check (tol/2 for the AdamW sample:
see SAMPLES). Each sample's data seed was chosen so (resnet's is the seed of 0..39 with the
widest margin); a failure there is the test's data, not pipetrain.

Prints one table per sample ('ref' the 1-stage 1f1b run, '=' bit-identical to it, 'DIFF',
'ERR' pipetrain failed, '-' not cut that way) and the torch comparison; exits 1 on a failure.

Usage: train_vs_torch.py --pipetrain BIN --samples DIR [--only mlp gpt] [--tol 1e-4]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import torch
import yaml
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(__file__))
import onnx_torch  # noqa: E402
import torch_train  # noqa: E402
from export_model_vs_torch import update_error  # noqa: E402

STEPS = 3
STAGES = [1, 2, 4]
KINDS = ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "v-zb", "v-half", "v-min", "dualpipev"]
TWO_CHUNKS = {"interleaved", "zb-v", "v-zb", "v-half", "v-min", "dualpipev"}  # schedule/generators.h
BASELINE = ("1f1b", 1)
KINK_MARGIN = 1e-6
IGNORE = -100

# One sample each: SGD with momentum (plain, Nesterov, with clipping, with warm-up + cosine) and
# AdamW with clipping, warm-up and cosine; cross-entropy with ignored targets and mse;
# BatchNorm in training mode (resnet). AdamW is on the MLP only: Adam divides by |gradient|, so
# float32 rounding in a near-zero gradient (attention key biases have an exact zero one) moves a
# parameter by up to lr, and a 1e-4 check would measure that instead of pipetrain. resnet has
# B = 2 so that BatchNorm's statistics span samples, and a small lr: at 0.05 its 3 steps already
# amplify float32 rounding past 1e-4.
# `guard` is the float32-against-float64 check's share of --tol (default 1/10). The MLP's is 1/2:
# Adam scales every element's update to about lr whatever its gradient, so an element whose
# gradient is small carries that gradient's relative float32 rounding into an lr-sized update.
# Its eps is 1e-5 for the same reason: Adam's first step is lr * g / (|g| + eps), a full-sized
# step of the gradient's sign, and since the warm-up's first step runs at lr / W rather than 0
# (train/optimizer.h) that step moves the parameters; at eps 1e-8 the elements whose gradient is
# float32 rounding around zero moved float32 and float64 PyTorch 12x the guard's bound apart
# (seeds 0-3 alike). With 1e-5 they stay at 0.46 of it, and pipetrain at 0.25 of the full bound.
# Its warm-up of 2 steps runs step 0 at half the rate; vit's of 1 and cosine reach min_lr.
SAMPLES = {
    "mlp": dict(batch=2, micro_batches=4, seed=0, loss="cross_entropy", guard=0.5,
                optimizer=dict(kind="adamw", lr=0.01, betas=[0.9, 0.999], eps=1e-5,
                               weight_decay=0.1, clip_grad_norm=0.5, warmup_steps=2,
                               schedule="cosine", min_lr=0.001)),
    "resnet": dict(batch=2, micro_batches=4, seed=21, loss="cross_entropy",
                   optimizer=dict(kind="sgd", lr=0.01, momentum=0.9, nesterov=True,
                                  weight_decay=5e-4)),
    "gpt": dict(batch=1, micro_batches=4, seed=0, loss="cross_entropy",
                optimizer=dict(kind="sgd", lr=0.1, momentum=0.9, weight_decay=0.01,
                               clip_grad_norm=0.5)),
    "vit": dict(batch=1, micro_batches=4, seed=0, loss="mse",
                optimizer=dict(kind="sgd", lr=0.01, momentum=0.9, weight_decay=0.01,
                               warmup_steps=1, schedule="cosine", min_lr=0.001)),
}


def vocab_size(model, name):
    """Rows of the initializer an integer input indexes through Gather (16 if none)."""
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and n.input[1] == name and n.input[0] in inits:
            return int(inits[n.input[0]].dims[0])
    return 16


def make_data(model, sample, rows, rng):
    """Inputs by name and targets, `rows` samples each, fitting the model's input and output."""
    inits = {t.name for t in model.graph.initializer}
    inputs = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        shape = [rows] + [d.dim_value for d in dims[1:]]
        if vi.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            inputs[vi.name] = rng.integers(0, vocab_size(model, vi.name), size=shape).astype(np.int64)
        else:
            inputs[vi.name] = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        out = list(onnx_torch.run(model, {k: v[:1] for k, v in inputs.items()},
                                  onnx_torch.parameters(model)).values())[0]
    if sample["loss"] == "mse":
        return inputs, rng.standard_normal((rows,) + tuple(out.shape[1:])).astype(np.float32)
    targets = rng.integers(0, out.shape[-1], size=(rows,) + tuple(out.shape[1:-1])).astype(np.int64)
    targets.reshape(-1)[::7] = IGNORE
    return inputs, targets


def write_case(tmp, model_path, sample, inputs, targets):
    """The npy files and the config; returns (config path, config as a dict)."""
    files = {}
    for name, value in inputs.items():
        files[name] = os.path.join(tmp, f"input_{torch_train.npy_file_name(name)}")
        np.save(files[name], value)
    np.save(os.path.join(tmp, "targets.npy"), targets)
    cfg = {
        "model": os.path.abspath(model_path),
        "dims": {"batch": sample["batch"]},
        "loss": {"kind": sample["loss"], "ignore_index": IGNORE},
        "data": {"kind": "npy", "inputs": files, "targets": os.path.join(tmp, "targets.npy"),
                 "shuffle": False, "eval_fraction": 0.0},
        "optimizer": dict(sample["optimizer"]),
        "pipeline": {"stages": 1, "chunks": 1, "micro_batches": sample["micro_batches"],
                     "schedule": "1f1b", "partition": "balanced", "recompute": "none"},
        "device": "cpu",
        "threads": 1,
        "seed": 0,
        "steps": STEPS,
        "output": {"model": os.path.join(tmp, "trained.onnx")},
    }
    path = os.path.join(tmp, "train.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path, cfg


def reference(model, inputs, targets, cfg):
    """torch_train's float64 result and history, the smallest |ReLU input| that run saw, and
    torch_train's float32 result."""
    margin = [np.inf]
    relu = onnx_torch.OPS["Relu"]

    def watched(a, i):
        margin[0] = min(margin[0], float(i[0].detach().abs().min()))
        return relu(a, i)

    onnx_torch.OPS["Relu"] = watched
    try:
        onnx_torch.FLOAT = torch.float64
        after, history = torch_train.train(model, inputs, targets, cfg)
    finally:
        onnx_torch.OPS["Relu"] = relu
    try:
        onnx_torch.FLOAT = torch.float32
        after32, _ = torch_train.train(model, inputs, targets, cfg)
    finally:
        onnx_torch.FLOAT = torch.float64
    return after, history, margin[0], after32


def can_cut(args, model_path, batch, stages, chunks):
    res = subprocess.run([args.pipetrain, "partition", model_path, "--micro-batch", str(batch),
                          "--stages", str(stages), "--chunks-per-stage", str(chunks), "--json"],
                         capture_output=True, text=True)
    return res.returncode == 0


def train_run(args, cfg_path, tmp, kind, stages, chunks):
    """(trained initializers by name, the metrics lines of the steps), or an error string."""
    out = os.path.join(tmp, f"trained_{kind}_{stages}.onnx")
    metrics = os.path.join(tmp, f"metrics_{kind}_{stages}.jsonl")
    cmd = [args.pipetrain, "train", cfg_path, "--quiet", "--set", f"pipeline.stages={stages}",
           "--set", f"pipeline.schedule={kind}", "--set", f"pipeline.chunks={chunks}",
           "--set", f"output.model={out}", "--set", f"output.metrics={metrics}"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {args.run_timeout} s"
    if res.returncode != 0:
        lines = (res.stderr.strip() or res.stdout.strip() or "no output").splitlines()
        return f"exit {res.returncode}: {lines[-1]}"
    if not os.path.exists(out):
        return f"no {os.path.basename(out)} written"
    trained = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    with open(metrics) as f:
        steps = [line for line in map(json.loads, f) if "loss" in line]
    os.remove(out)
    return trained, steps


def differs(have, want):
    """None when bit-identical, else the first difference."""
    if have.keys() != want.keys():
        return f"initializers {sorted(have.keys() ^ want.keys())[:3]} in one only"
    for name, w in want.items():
        h = have[name]
        if h.dtype != w.dtype or h.shape != w.shape:
            return f"{name}: {h.dtype}{h.shape} != {w.dtype}{w.shape}"
        if not np.array_equal(h, w):
            return f"{name}: max |diff| {float(np.max(np.abs(h.astype(np.float64) - w))):.3g}"
    return None


def metrics_against_torch(steps, history, tol):
    """None, or the first step whose loss, grad_norm or lr is off."""
    if [m.get("step") for m in steps] != list(range(1, len(history) + 1)):
        return f"metrics has steps {[m.get('step') for m in steps]}, want 1..{len(history)}"
    for m, h in zip(steps, history):
        for key, t in (("loss", tol), ("grad_norm", tol), ("lr", 1e-9)):
            if abs(m[key] - h[key]) > t * max(abs(h[key]), 1e-30):
                return f"step {m['step']}: {key} {m[key]:.8g}, torch {h[key]:.8g}"
    return None


def against_torch(trained, ref, start, updates, tol):
    """(error or None, worst error / bound, where): each tensor's update from `start` (the file's
    initializers) against the reference's (update_error), `updates[name]` roundings deep."""
    worst, where, detail = 0.0, "", ""
    for name, want in ref.items():
        if name not in trained:
            return f"{name} missing from the trained model", worst, where
        have = trained[name].astype(np.float64)
        if have.shape != want.shape:
            return f"{name}: shape {have.shape} != {want.shape}", worst, where
        err, bound, scale = update_error(have, want, start[name], updates[name], tol)
        if err / bound > worst:
            worst, where = err / bound, name
            detail = f"differs by {err:.3g} > {bound:.3g} (tol {tol:g} of its update {scale:.3g} + float32 rounding)"
    return (None if worst <= 1 else f"{where}: {detail}"), worst, where


def update_counts(model, ref, sample):
    """How many times training rounds each tensor: once per step, and a BatchNorm running
    statistic once per micro-batch of every step."""
    stats = torch_train.running_stats(model)
    return {name: STEPS * (sample["micro_batches"] if name in stats else 1) for name in ref}


def describe(sample):
    o = sample["optimizer"]
    parts = [o["kind"], f"lr {o['lr']:g}"]
    if o.get("momentum"):
        parts.append(f"momentum {o['momentum']:g}" + (" nesterov" if o.get("nesterov") else ""))
    if o.get("weight_decay"):
        parts.append(f"wd {o['weight_decay']:g}")
    if o.get("clip_grad_norm"):
        parts.append(f"clip {o['clip_grad_norm']:g}")
    if o.get("warmup_steps"):
        parts.append(f"warm-up {o['warmup_steps']}")
    if o.get("schedule", "constant") != "constant":
        parts.append(f"{o['schedule']} to {o['min_lr']:g}")
    return (f"B={sample['batch']} M={sample['micro_batches']} {sample['loss']}, "
            + ", ".join(parts) + f", {STEPS} steps")


def check_sample(args, name, sample):
    """Prints the sample's table; returns the list of failures."""
    t0 = time.time()
    model_path = os.path.join(args.samples, name, f"{name}.onnx")
    model = onnx.load(model_path)
    rows = 2 * sample["batch"] * sample["micro_batches"]
    inputs, targets = make_data(model, sample, rows, np.random.default_rng(sample["seed"]))
    failures = []
    print(f"{name}: {describe(sample)}")
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path, cfg = write_case(tmp, model_path, sample, inputs, targets)
        t_ref = time.time()
        ref, history, margin, ref32 = reference(model, inputs, targets, cfg)
        t_ref = time.time() - t_ref
        if margin < KINK_MARGIN:
            failures.append(f"{name}: test data puts a ReLU input {margin:.2g} from the kink "
                            f"(< {KINK_MARGIN:g}); choose another seed in SAMPLES")
        start = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        updates = update_counts(model, ref, sample)
        guard = sample.get("guard", 0.1)
        noise = against_torch(ref32, ref, start, updates, args.tol * guard)
        if noise[0]:
            failures.append(f"{name}: test data too sensitive to rounding: torch float32 against "
                            f"float64: {noise[0]}; choose another seed in SAMPLES")
        results, cuts = {}, {}
        for stages in STAGES:
            for kind in KINDS:
                chunks = 2 if kind in TWO_CHUNKS else 1
                if (stages, chunks) not in cuts:
                    cuts[(stages, chunks)] = can_cut(args, model_path, sample["batch"], stages, chunks)
                if not cuts[(stages, chunks)]:
                    results[(kind, stages)] = "-"
                else:
                    results[(kind, stages)] = train_run(args, cfg_path, tmp, kind, stages, chunks)
    base = results[BASELINE]
    base_steps = base[1] if isinstance(base, tuple) else None
    base = base[0] if isinstance(base, tuple) else base
    print("  stages " + " ".join(f"{k:>11}" for k in KINDS))
    for stages in STAGES:
        cells = []
        for kind in KINDS:
            r = results[(kind, stages)]
            r = r[0] if isinstance(r, tuple) else r
            if (kind, stages) == BASELINE:
                cell = "ref" if isinstance(r, dict) else "ERR"
            elif isinstance(r, str):
                cell = "-" if r == "-" else "ERR"
            elif not isinstance(base, dict):
                cell = "?"
            else:
                diff = differs(r, base)
                cell = "=" if diff is None else "DIFF"
                if diff:
                    failures.append(f"{name} {kind} stages={stages}: not bit-identical to 1 stage: {diff}")
            if cell == "ERR":
                failures.append(f"{name} {kind} stages={stages}: {r}")
            cells.append(cell)
        print(f"  {stages:>6} " + " ".join(f"{c:>11}" for c in cells))
    margin_text = f"; min |ReLU input| {margin:.2g}" if np.isfinite(margin) else ""
    print(f"  torch float32 vs float64 (bound at {guard:g} tol): worst error / bound {noise[1]:.2f} ({noise[2]}){margin_text}")
    if isinstance(base, dict):
        err, worst, where = against_torch(base, ref, start, updates, args.tol)
        print(f"  torch float64 vs 1 stage: worst error / bound {worst:.2f} ({where}), tol {args.tol:g} of "
              f"each update: {'FAIL' if err else 'ok'}")
        if err:
            failures.append(f"{name} against torch: {err}")
        err = metrics_against_torch(base_steps, history, args.tol)
        losses = " ".join(f"{h['loss']:.5f}" for h in history)
        norms = " ".join(f"{h['grad_norm']:.4f}" for h in history)
        print(f"  metrics vs torch (loss, grad_norm, lr of {len(history)} steps): "
              f"{'FAIL' if err else 'ok'}; losses {losses}, grad norms {norms}")
        if err:
            failures.append(f"{name} metrics against torch: {err}")
    else:
        print("  torch float64: not compared (the 1-stage run failed)")
    print(f"  {time.time() - t0:.1f} s (torch reference {t_ref:.1f} s)")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--samples", required=True, help="the samples/ folder")
    ap.add_argument("--only", nargs="+", choices=sorted(SAMPLES), help="these samples only")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--run-timeout", type=int, default=300, help="seconds per pipetrain run")
    args = ap.parse_args()
    torch.set_num_threads(1)  # two cores, and pipetrain runs between the references
    failures = []
    for name in args.only or SAMPLES:
        failures += check_sample(args, name, SAMPLES[name])
    for f in failures:
        print(f"FAIL {f}")
    print(f"{len(failures)} failures" if failures else "all passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
