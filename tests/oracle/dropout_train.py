"""Training-mode exports with dropout and stochastic depth: `pipetrain train` bit-identical across
schedules, stage counts and recompute, changed by the dropout, and `dropout: off` equal to the
eval-mode export.

The fixtures (samples/dropout/, made by make_dropout.py with PyTorch 2.15): GPT-2 and BERT with
every dropout 0.1 from the default exporter (optimizer on and off) and the legacy one; torchvision
ConvNeXt and EfficientNet with stochastic depth (RandomUniformLike + Less + Cast, rewritten as a
Bernoulli draw at import) from the default exporter (optimizer on and off) and the legacy
one; an MLP masked by torch.bernoulli (ONNX Bernoulli from both exporters); and each module
but EfficientNet and the MLP exported in eval() mode. Per model, on the npy data of data.npz, STEPS steps of SGD with momentum over
MICRO micro-batches of BATCH rows, seed SEED:

  (a) every run of KINDS x STAGES x RECOMPUTE gives trained initializers np.array_equal to the
      1-stage 1f1b run without recompute (the masks are drawn from (seed, step, micro-batch,
      node), so every schedule, cut and recompute draws the same ones);
  (b) with `dropout: off` (every Dropout the identity, every stochastic-depth draw its expected
      value) the trained initializers differ from (a)'s: the dropout changes training; for the
      MLP they are the same bits, since torch.bernoulli draws whatever the mode (in `run` too);
  (c) with `dropout: off`, the trained parameters equal bit for bit those that the eval()-mode
      export of the same module trains to. The exporters name generated initializers (pre-
      transposed weights val_N) differently in the two files, so each trained initializer is
      matched to the one of the other file holding the same initial value;
  (d) `pipetrain run` of the training-mode file (Dropout the identity, each draw its expected
      value) equals onnxruntime on the eval-mode export within 1e-5 of the largest output.
Exits 1 on a failure, after printing one table per model.

Usage: dropout_train.py --pipetrain BIN --fixtures samples/dropout [--only gpt2 convnext]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import yaml
from onnx import numpy_helper

STEPS, MICRO, BATCH, SEED = 2, 4, 2, 7
KINDS = ["gpipe", "1f1b", "zb-v", "v-half"]
TWO_CHUNKS = {"zb-v", "v-half"}
STAGES = [2, 4]
RECOMPUTE = ["none", "full"]
# model file -> (input array, target array, eval-mode export by the same exporter and options;
# none for EfficientNet, whose BatchNorm differs between the modes)
MODELS = {
    "gpt2": ("x_tokens", "y_lm", "gpt2_eval"),
    "gpt2_noopt": ("x_tokens", "y_lm", "gpt2_noopt_eval"),
    "gpt2_legacy": ("x_tokens", "y_lm", "gpt2_legacy_eval"),
    "bert": ("x_tokens", "y_class", "bert_eval"),
    "bert_noopt": ("x_tokens", "y_class", "bert_noopt_eval"),
    "bert_legacy": ("x_tokens", "y_class", "bert_legacy_eval"),
    "convnext": ("x_image", "y_image", "convnext_eval"),
    "convnext_noopt": ("x_image", "y_image", "convnext_noopt_eval"),
    "convnext_legacy": ("x_image", "y_image", "convnext_legacy_eval"),
    "effnet": ("x_image", "y_image", None),
    "effnet_legacy": ("x_image", "y_image", None),
    "bernoulli": ("x_image", "y_image", None),
    "bernoulli_legacy": ("x_image", "y_image", None),
}


def write_config(tmp, model_path, x, y):
    np.save(os.path.join(tmp, "x.npy"), x)
    np.save(os.path.join(tmp, "y.npy"), y)
    cfg = {
        "model": os.path.abspath(model_path),
        "dims": {"batch": BATCH},
        "loss": {"kind": "cross_entropy"},
        "data": {"kind": "npy", "inputs": {"input": os.path.join(tmp, "x.npy")},
                 "targets": os.path.join(tmp, "y.npy"), "shuffle": False, "eval_fraction": 0.0},
        "optimizer": {"kind": "sgd", "lr": 0.1, "momentum": 0.9},
        "pipeline": {"stages": 1, "chunks": 1, "micro_batches": MICRO, "schedule": "1f1b",
                     "recompute": "none"},
        "threads": 1,
        "seed": SEED,
        "steps": STEPS,
        "output": {"model": os.path.join(tmp, "trained.onnx")},
    }
    path = os.path.join(tmp, "train.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


def train(args, cfg, tmp, tag, sets):
    """The trained initializers by name, or an error string."""
    out = os.path.join(tmp, f"trained_{tag}.onnx")
    cmd = [args.pipetrain, "train", cfg, "--quiet", "--set", f"output.model={out}"]
    for s in sets:
        cmd += ["--set", s]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "timed out"
    if res.returncode != 0:
        lines = (res.stderr.strip() or res.stdout.strip() or "no output").splitlines()
        return f"exit {res.returncode}: {lines[-1]}"
    trained = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    os.remove(out)
    return trained


def differs(have, want):
    """None when bit-identical, else the first difference."""
    if have.keys() != want.keys():
        return f"initializers {sorted(have.keys() ^ want.keys())[:3]} in one only"
    for name, w in want.items():
        h = have[name]
        if h.dtype != w.dtype or h.shape != w.shape or not np.array_equal(h, w):
            return f"{name} differs"
    return None


def initial(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def against_eval(args, trained, start, eval_trained, eval_start):
    """None when every initializer that training changed equals, bit for bit, the eval export's
    initializer that started from the same value; else the first mismatch."""
    # A parameter import gave back under the module's name (a position table's rows the exporter
    # folded into a constant) is in neither file: both give it back under that name.
    for name in [n for n in trained if n not in start]:
        if name not in eval_trained or not np.array_equal(trained[name], eval_trained[name]):
            return f"{name}: given back, and not equal to the eval export's"
    changed = [n for n in trained if n in start and not np.array_equal(trained[n], start[n])]
    if not changed:
        return "training changed no initializer"
    for name in changed:
        same = [e for e, v in eval_start.items()
                if v.dtype == start[name].dtype and v.shape == start[name].shape
                and np.array_equal(v, start[name])]
        if len(same) != 1:
            return f"{name}: {len(same)} initializers of the eval export start equal to it"
        if not np.array_equal(trained[name], eval_trained[same[0]]):
            diff = np.max(np.abs(trained[name].astype(np.float64) - eval_trained[same[0]]))
            return f"{name} (eval export's {same[0]}): max |diff| {diff:.3g}"
    return None


def run_vs_ort(args, path, eval_path, x, tmp):
    """None when `pipetrain run` of `path` equals onnxruntime on `eval_path` (1e-5 of the
    largest output), else what differs."""
    import onnxruntime as ort
    np.save(os.path.join(tmp, "probe.npy"), x)
    res = subprocess.run([args.pipetrain, "run", path, "--input", f"input={os.path.join(tmp, 'probe.npy')}",
                          "--output", os.path.join(tmp, "run")], capture_output=True, text=True)
    if res.returncode != 0:
        return f"pipetrain run: {(res.stderr.strip() or 'failed').splitlines()[-1]}"
    have = np.load(os.path.join(tmp, "run", "output.npy"))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # no warnings on the CastLike nodes optimize=False leaves
    want = ort.InferenceSession(eval_path, opts, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    if have.shape != want.shape:
        return f"shape {have.shape} != {want.shape}"
    err = float(np.max(np.abs(have - want))) / max(float(np.max(np.abs(want))), 1e-30)
    return None if err <= 1e-5 else f"relative error {err:.3g}"


def check_model(args, name, data):
    t0 = time.time()
    x_key, y_key, eval_name = MODELS[name]
    path = os.path.join(args.fixtures, f"{name}.onnx")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = write_config(tmp, path, data[x_key], data[y_key])
        base = train(args, cfg, tmp, "base", [])
        if isinstance(base, str):
            print(f"{name}: 1 stage failed: {base}")
            return [f"{name} 1 stage: {base}"]
        print(f"{name}: {STEPS} steps, {MICRO} micro-batches of {BATCH}; 1 stage 1f1b is the reference")
        print("  stages recompute " + " ".join(f"{k:>7}" for k in KINDS))
        for stages in STAGES:
            for policy in RECOMPUTE:
                cells = []
                for kind in KINDS:
                    chunks = 2 if kind in TWO_CHUNKS else 1
                    r = train(args, cfg, tmp, f"{kind}_{stages}_{policy}",
                              [f"pipeline.stages={stages}", f"pipeline.schedule={kind}",
                               f"pipeline.chunks={chunks}", f"pipeline.recompute={policy}"])
                    if isinstance(r, str):
                        cells.append("ERR")
                        failures.append(f"{name} {kind} stages={stages} recompute={policy}: {r}")
                        continue
                    d = differs(r, base)
                    cells.append("=" if d is None else "DIFF")
                    if d:
                        failures.append(f"{name} {kind} stages={stages} recompute={policy}: "
                                        f"not bit-identical to 1 stage: {d}")
                print(f"  {stages:>6} {policy:>9} " + " ".join(f"{c:>7}" for c in cells))
        off = train(args, cfg, tmp, "off", ["dropout=off"])
        if isinstance(off, str):
            failures.append(f"{name} dropout off: {off}")
        else:
            same = differs(off, base) is None
            if name.startswith("bernoulli"):
                # torch.bernoulli draws in eval() too: `dropout: off` leaves the module's own draws.
                print(f"  dropout: off keeps the module's torch.bernoulli draws: {'yes' if same else 'no (FAIL)'}")
                if not same:
                    failures.append(f"{name}: dropout off changed the draws of torch.bernoulli")
            else:
                print(f"  dropout: off changes the trained model: {'no (FAIL)' if same else 'yes'}")
                if same:
                    failures.append(f"{name}: dropout off trains to the same initializers as dropout on")
            off2 = train(args, cfg, tmp, "off_2", ["dropout=off", "pipeline.stages=2"])
            if isinstance(off2, str) or differs(off2, off):
                failures.append(f"{name} dropout off at 2 stages: not bit-identical to 1 stage")
            if eval_name:
                eval_path = os.path.join(args.fixtures, f"{eval_name}.onnx")
                ev = train(args, cfg, tmp, "eval", [f"model={os.path.abspath(eval_path)}"])
                err = ev if isinstance(ev, str) else against_eval(args, off, initial(path), ev,
                                                                 initial(eval_path))
                print(f"  dropout: off equals {eval_name}.onnx trained: "
                      f"{'yes' if err is None else 'no: ' + err}")
                if err:
                    failures.append(f"{name} dropout off against {eval_name}: {err}")
                err = run_vs_ort(args, path, eval_path, data[x_key][-BATCH:], tmp)
                print(f"  run equals onnxruntime on {eval_name}.onnx: {'yes' if err is None else 'no: ' + err}")
                if err:
                    failures.append(f"{name} run against onnxruntime: {err}")
    print(f"  {time.time() - t0:.1f} s")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--fixtures", required=True, help="the samples/dropout folder")
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS))
    args = ap.parse_args()
    data = dict(np.load(os.path.join(args.fixtures, "data.npz")))
    failures = []
    for name in args.only or MODELS:
        failures += check_model(args, name, data)
    for f in failures:
        print(f"FAIL {f}")
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
