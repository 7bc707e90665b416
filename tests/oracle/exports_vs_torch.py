"""Today's exports (samples/exports, made by PyTorch 2.15's torch.onnx.export) against PyTorch.

For every fixture NAME (NAME.onnx from the default exporter, NAME_legacy.onnx from the opset-17
legacy exporter where it still works, NAME_opset23.onnx from the default exporter at opset 23) and its reference NAME.npz (samples/exports/make_exports.py):
  - `pipetrain run` on the held-out probe equals the PyTorch module's output (float64) within
    --tol relative to the output's largest value (a training-mode export, whose BatchNorm uses
    the batch's statistics, is held to onnxruntime's output on the same file instead);
  - `pipetrain train` for the reference's 3 SGD steps (momentum 0.9, lr 0.1, 2 micro-batches of 2)
    gives the reference's losses and, for every parameter and BatchNorm buffer the reference
    trained, its update (trained minus the start: the file's initializer, or for one pipetrain
    gives back under a name the file does not hold, `start.<name>` of NAME[_VARIANT].grads.npz)
    within --tol of the reference's update relative to that update's own scale, plus float32's
    rounding (export_model_vs_torch.update_error); at 1 stage and at
    4 stages under gpipe, 1f1b, zb-h1 and zb-v, the trained initializers bit-identical across all;
    the model trained on 4 stages under zb-v, run on the held-out probe, gives the PyTorch-trained
    module's output (eval mode; not for training-mode exports, whose BatchNorm runs on the batch);
    and the safetensors file it writes holds every module parameter the reference trained under
    the module's name, with PyTorch's values (the whole module for NAME_noopt and NAME_legacy).
Prints one line per case and closes with 'N passed, M failed'.

Usage: exports_vs_torch.py --pipetrain BIN --dir samples/exports [--names gpt2 ...] [--tol 1e-4]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from export_model_vs_torch import read_safetensors, update_error  # noqa: E402
from stage_chain import report  # one line per case, then 'N passed, M failed'

NAMES = ["nanogpt", "gpt2", "llama", "qwen2", "qwen3", "mistral", "phi3", "bert", "vit", "convnext", "mobilenetv3",
         "resnet", "bnconv"]
TRAINING_MODE_EXPORTS = {"resnet", "bnconv"}
# Trained, and compared across schedules, but not with PyTorch: the default exporter's optimizer
# drops BatchNorm from a training-mode export and both exporters fuse an eval-mode BatchNorm into
# the convolution before it, so those files do not hold the module PyTorch trains (the _noopt
# files hold it and are compared); MobileNetV3's 2-sample BatchNorm in training mode is too
# ill-conditioned for 1e-4 (make_exports.py: float32 and float64 PyTorch differ by 2e-2).
FUSED = "schedules only: the exporter dropped or fused BatchNorm"
ILL = "schedules only: 2-sample BatchNorm in training mode is ill-conditioned"
NOT_COMPARED = {("resnet", ""): FUSED, ("bnconv", ""): FUSED, ("mobilenetv3", ""): FUSED,
                ("mobilenetv3", "_legacy"): FUSED, ("mobilenetv3", "_noopt"): ILL}
# A tensor that stays near zero is held to this absolute scale: an attention key bias has a zero
# gradient in exact arithmetic (softmax ignores a shift shared by every key), so from a zero start
# it only collects rounding noise, about 1e-9 in float32 against 1e-17 in float64.
KEY_BIAS_FLOOR = 1e-3
# The same for an update: one that is zero in exact arithmetic (the key bias again) is held to
# UPDATE_FLOOR times --tol in absolute terms, above float32's noise in it and far below any update
# the fixtures make (the smallest nonzero one, BERT's query weights, moves 6.6e-7; the rounding
# floor of update_error, not this, decides how small an update is still checked).
UPDATE_FLOOR = 1e-5
STEPS, MICRO = 3, 2
RUNS = [(1, "1f1b"), (4, "gpipe"), (4, "1f1b"), (4, "zb-h1"), (4, "zb-v")]


def pipetrain(args, *argv):
    res = subprocess.run([args.pipetrain, *argv], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"pipetrain {argv[0]} failed: {(res.stderr or res.stdout).strip()[:400]}")
    return res.stdout


def relative_error(have, want, floor=1e-12):
    scale = max(float(np.max(np.abs(want))), floor) if want.size else 1.0
    return float(np.max(np.abs(have.astype(np.float64) - want.astype(np.float64)))) / scale


def check_run(args, name, path, ref, tmp):
    np.save(os.path.join(tmp, "probe.npy"), ref["probe"])
    out = os.path.join(tmp, "run")
    pipetrain(args, "run", path, "--input", f"input={os.path.join(tmp, 'probe.npy')}", "--output", out)
    have = np.load(os.path.join(out, "output.npy"))
    if name in TRAINING_MODE_EXPORTS:
        want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": ref["probe"]})[0]
    else:
        want = ref["probe_out"]
    err = relative_error(have, want)
    return None if err <= args.tol else f"output differs by {err:.3g} > {args.tol}"


def start_state(path):
    """NAME.start.safetensors (the module's state_dict before training) for a file without
    samples/export_model.py's record that holds the module (not one with BatchNorm fused into its
    convolutions, which is another module), else None."""
    name, variant = os.path.basename(path).split(".")[0], ""
    for v in ("_noopt", "_legacy", "_opset23"):
        if name.endswith(v):
            name, variant = name[:-len(v)], v
    start = os.path.join(os.path.dirname(path), f"{name}.start.safetensors")
    if NOT_COMPARED.get((name, variant)) == FUSED or recorded_state_dict(path) is not None:
        return None
    return start if os.path.exists(start) else None


def write_config(tmp, path, stages, schedule, trained):
    cfg = os.path.join(tmp, f"t_{stages}_{schedule}.yaml")
    start = start_state(path)
    with open(cfg, "w") as f:
        f.write(f"""model: {path}
dims: {{batch: 2}}
loss: {{kind: cross_entropy}}
data: {{kind: npy, inputs: {{input: {tmp}/x.npy}}, targets: {tmp}/y.npy, shuffle: false, eval_fraction: 0}}
optimizer: {{kind: sgd, lr: 0.1, momentum: 0.9}}
pipeline: {{stages: {stages}, micro_batches: {MICRO}, schedule: {schedule}}}
steps: {STEPS}
eval_every: 0
checkpoint: {{dir: {tmp}/ckpt_{stages}_{schedule}, every: 0}}
output: {{model: {trained}, metrics: {trained}.jsonl, trace: "", timeline: ""{f", start_state: {start}" if start else ""}}}
""")
    return cfg


def initializers(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def check_train(args, name, path, ref, tmp, compare, compared):
    """The training checks; error or None. Appends to `compared` a line on the closest parameter."""
    np.save(os.path.join(tmp, "x.npy"), ref["x"])
    np.save(os.path.join(tmp, "y.npy"), ref["y"])
    np.save(os.path.join(tmp, "probe.npy"), ref["probe"])
    results = {}
    for stages, schedule in RUNS:
        trained = os.path.join(tmp, f"trained_{stages}_{schedule}.onnx")
        pipetrain(args, "train", write_config(tmp, path, stages, schedule, trained), "-q")
        results[(stages, schedule)] = trained
    first = initializers(results[RUNS[0]])
    for run, trained in results.items():
        other = initializers(trained)
        for k, v in first.items():
            if v.tobytes() != other[k].tobytes():
                return f"{run[0]} stages {run[1]}: '{k}' differs from the 1-stage run"
    if not compare:
        return check_safetensors(args, results[RUNS[0]], None, path)
    with open(results[RUNS[0]] + ".jsonl") as f:
        losses = [json.loads(line)["loss"] for line in f if '"step"' in line and '"loss"' in line]
    for s, (have, want) in enumerate(zip(losses, ref["losses"])):
        if abs(have - want) > args.tol * max(1.0, abs(want)):
            return f"step {s + 1}: loss {have:.6f}, PyTorch {want:.6f}"
    start = initializers(path)
    grads_file = os.path.splitext(path)[0] + ".grads.npz"
    if os.path.exists(grads_file):  # the start of what pipetrain gives back under a new name
        given_back = np.load(grads_file)
        start.update({k.split(".", 1)[1]: given_back[k] for k in given_back.files if k.startswith("start.")})
    worst, where = (0.0, 0.0, 0.0, 1.0), ""
    for key in ref.files:
        if not key.startswith(("param.", "buffer.")):
            continue
        init = key.split(".", 1)[1]
        if init not in first:
            return f"'{init}' is not in the trained model"
        if init not in start:
            return f"'{init}': no start in the file or in {os.path.basename(grads_file)}"
        # A parameter moves once per step; a BatchNorm statistic once per micro-batch.
        updates = STEPS if key.startswith("param.") else STEPS * MICRO
        err, bound, scale = update_error(first[init], ref[key], start[init], updates, args.tol, UPDATE_FLOOR)
        if err / bound > worst[0]:
            worst, where = (err / bound, err, bound, scale), init
    if worst[0] > 1:
        return (f"'{where}' differs from PyTorch's by {worst[1]:.3g} > {worst[2]:.3g} (tol {args.tol:g} of "
                f"its update {worst[3]:.3g} + float32 rounding)")
    compared.append(f"worst error / bound {worst[0]:.2f} ('{where}', update {worst[3]:.2g})")
    # Training-mode exports run BatchNorm on the batch's statistics; the small fixture of
    # make_noopt_min.py has no trained output.
    if name not in TRAINING_MODE_EXPORTS and "probe_trained" in ref.files:
        err = check_trained_output(args, results[RUNS[-1]], ref, tmp)
        if err:
            return err
    return check_safetensors(args, results[RUNS[0]], ref, path)


def check_trained_output(args, trained, ref, tmp):
    """The model trained on 4 stages (the last run) on the held-out probe, against the
    PyTorch-trained module's output in eval mode."""
    out = os.path.join(tmp, "run_trained")
    pipetrain(args, "run", trained, "--input", f"input={os.path.join(tmp, 'probe.npy')}", "--output", out)
    err = relative_error(np.load(os.path.join(out, "output.npy")), ref["probe_trained"])
    return None if err <= args.tol else f"the trained model's output differs from PyTorch's by {err:.3g}"


def recorded_state_dict(path):
    """The module's state_dict keys samples/export_model.py recorded in the file, or None."""
    meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    return [e["key"] for e in json.loads(meta["pipetrain.state_dict"])] if "pipetrain.state_dict" in meta else None


def check_safetensors(args, trained, ref, path):
    """The trained weights as `train` writes them for PyTorch: every module parameter the
    reference trained is there under its module name (or a tied twin's) with PyTorch's value; for
    a file that holds the whole module (optimize=False, legacy) that is every parameter of
    module_params; and where the file carries samples/export_model.py's record (NAME_noopt), its
    keys are exactly the module's state_dict keys, so load_state_dict(strict=True) takes it; for
    any other file, trained with output.start_state (NAME.start.safetensors), its keys and shapes
    are exactly the start's. `ref` None: keys and shapes only."""
    weights, _ = read_safetensors(os.path.splitext(trained)[0] + ".safetensors")
    keys, shapes = recorded_state_dict(path), None
    if start_state(path):
        start, _ = read_safetensors(start_state(path))
        keys, shapes = list(start), {k: v.shape for k, v in start.items()}
    if keys is not None and set(weights) != set(keys):  # what load_state_dict(strict=True) needs
        missing, extra = sorted(set(keys) - set(weights)), sorted(set(weights) - set(keys))
        return f"the safetensors keys are not the module's state_dict: missing {missing[:3]}, extra {extra[:3]}"
    for k, shape in (shapes or {}).items():
        if weights[k].shape != shape:
            return f"safetensors '{k}' is {weights[k].shape}, the module's {shape}"
    if ref is None:
        return None
    worst, where = 0.0, ""
    for key in ref.files:
        if not key.startswith("state."):
            continue
        param = key.split(".", 1)[1]
        names = list(ref[f"twins.{param}"]) if f"twins.{param}" in ref.files else [param]
        have = next((weights[n] for n in names if n in weights), None)
        if have is None:
            return f"the safetensors file has no '{param}'"
        if have.shape != ref[key].shape and shapes:  # a table the file holds in part: its leading rows
            have = have.reshape(-1)[:ref[key].size].reshape(ref[key].shape)
        if have.shape != ref[key].shape:
            return f"safetensors '{param}' is {have.shape}, PyTorch's {ref[key].shape}"
        err = relative_error(have, ref[key], floor=KEY_BIAS_FLOOR)
        if err > worst:
            worst, where = err, param
    return None if worst <= args.tol else f"safetensors '{where}' differs from PyTorch's by {worst:.3g}"


def cases(args):
    """(label, error or None) for every fixture file, run then train."""
    for name in args.names:
        for variant in ("", "_noopt", "_legacy", "_opset23"):
            path = os.path.join(args.dir, f"{name}{variant}.onnx")
            if not os.path.exists(path):
                continue
            ref = np.load(os.path.join(args.dir, f"{name}{variant}.npz"))
            compare = (name, variant) not in NOT_COMPARED
            for what in ("run", "train"):
                label = f"{name}{variant} {what}"
                if what == "train" and not compare:
                    label += f" ({NOT_COMPARED[(name, variant)]})"
                compared = []
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        err = (check_run(args, name, path, ref, tmp) if what == "run"
                               else check_train(args, name, path, ref, tmp, compare, compared))
                    except RuntimeError as e:
                        err = str(e)
                yield label + "".join(f": {c}" for c in compared), err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--names", nargs="+", default=NAMES)
    ap.add_argument("--tol", type=float, default=1e-4)
    report(cases(ap.parse_args()))


if __name__ == "__main__":
    main()
