"""Whole-model gradients against PyTorch autograd, and the portable backward in onnxruntime.

For each sample: random inputs and targets (some targets ignored) make a global batch split into
micro-batches. The reference is made here with Debian's python3-torch: the ONNX graph run with
torch ops in float64 (tests/oracle/onnx_torch.py; its forward is first checked against
onnxruntime on the original model), loss = cross-entropy summed over the global batch divided by
the counted targets, gradients by torch.autograd with gradient accumulation over micro-batches.

Then:
  * `pipetrain grad` (CPU kernels, F/B/W graphs per stage) for each --stages and --recompute;
  * `pipetrain partition --backward --portable --export`, with the exported F, B and W graphs of
    every stage chained in onnxruntime, micro-batch by micro-batch, gradients accumulated by W.
Each must give the loss and every parameter gradient within --tol relative to the reference
(max |ours - torch| / max |torch| per parameter, see compare()), and the same set of parameters
with gradients.

Usage: torch_grads.py --pipetrain BIN --model M.onnx [...] [--stages 1 3] [--recompute none]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import onnx_torch  # noqa: E402
from stage_chain import make_inputs, report, session  # noqa: E402

IGNORE = -100


def split(array, micro_batches):
    return np.split(array, micro_batches, axis=0)


def reference(model, inputs, target, micro_batches):
    """Loss and gradients by torch autograd (float64), accumulated over micro-batches."""
    params = onnx_torch.parameters(model)
    count = int(np.sum(target != IGNORE))
    total = 0.0
    for mb_in, mb_t in zip(zip(*[split(v, micro_batches) for v in inputs.values()]),
                           split(target, micro_batches)):
        feeds = dict(zip(inputs.keys(), mb_in))
        logits = list(onnx_torch.run(model, feeds, params).values())[0]
        c = logits.shape[-1]
        loss = F.cross_entropy(logits.reshape(-1, c), torch.from_numpy(mb_t.reshape(-1)),
                               ignore_index=IGNORE, reduction="sum") / count
        loss.backward()
        total += float(loss)
    grads = {n: p.grad.numpy() for n, p in params.items() if p.is_floating_point() and p.grad is not None}
    return total, grads


def forward_matches_onnxruntime(path, model, inputs, micro_batches):
    feeds = {k: v[0] for k, v in ((k, split(v, micro_batches)) for k, v in inputs.items())}
    want = session(path).run(None, feeds)[0]
    with torch.no_grad():
        have = list(onnx_torch.run(model, feeds, onnx_torch.parameters(model)).values())[0].numpy()
    err = float(np.max(np.abs(have - want))) / max(1.0, float(np.max(np.abs(want))))
    return None if err < 1e-5 else f"torch oracle forward differs from onnxruntime by {err:.3g}"


def compare(loss, grads, ref_loss, ref_grads, tol):
    if abs(loss - ref_loss) > tol * max(1.0, abs(ref_loss)):
        return f"loss {loss:.8g} != {ref_loss:.8g}", 0.0
    # Parameters torch gives a zero gradient (or none) may be absent on our side: nothing reaches them.
    missing = [n for n, g in ref_grads.items() if n not in grads and np.any(g != 0)]
    extra = [n for n in grads if n not in ref_grads]
    if missing or extra:
        return f"gradients missing for {missing[:3]}, unexpected for {extra[:3]}", 0.0
    worst, where = 0.0, ""
    # Relative to each parameter's largest gradient; a parameter whose exact gradient is zero
    # (attention key biases: softmax ignores a shift shared by a row) is measured against 1e-4
    # of the largest gradient in the model instead.
    floor = 1e-4 * max(float(np.max(np.abs(g))) for g in ref_grads.values())
    for name, have in grads.items():
        want = ref_grads[name]
        if have.shape != want.shape:
            return f"{name}: shape {have.shape} != {want.shape}", 0.0
        err = float(np.max(np.abs(have - want))) / max(float(np.max(np.abs(want))), floor)
        if err > worst:
            worst, where = err, name
    return (None if worst <= tol else f"{where}: relative error {worst:.3g} > {tol}"), worst


def outcome(case, compared):
    err, worst = compared
    return (f"{case} (worst relative error {worst:.1e})", err)


def npy_name(name):
    return "".join("_" if ch in "/:\\ " else ch for ch in name) + ".npy"


def ours(args, path, inputs_path, target_path, names, stages, recompute, micro_batches, tmp):
    out = os.path.join(tmp, f"grad_{stages}_{recompute.replace(':', '_')}")
    cmd = [args.pipetrain, "grad", path, "--target", target_path, "--stages", str(stages),
           "--micro-batches", str(micro_batches), "--recompute", recompute, "--output", out,
           "--threads", "2"] + sum((["--input", f"{k}={v}"] for k, v in inputs_path.items()), [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"pipetrain grad failed: {res.stderr.strip()}")
    loss = float(np.load(os.path.join(out, "loss.npy")))
    grads = {n: np.load(os.path.join(out, npy_name(n))) for n in names
             if os.path.exists(os.path.join(out, npy_name(n)))}
    return loss, grads


def portable(args, path, inputs, target, stages, recompute, micro_batches, tmp):
    """The exported standard-op F, B, W graphs of every stage, chained in onnxruntime."""
    out = os.path.join(tmp, f"portable_{stages}")
    rows = target.shape[0] // micro_batches
    cmd = [args.pipetrain, "partition", path, "--stages", str(stages), "--micro-batch", str(rows),
           "--backward", "--portable", "--recompute", recompute, "--export", out]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"pipetrain partition failed: {res.stderr.strip()}")
    sess = {(k, part): session(os.path.join(out, f"stage_{k}_{part}.onnx"))
            for k in range(stages) for part in ("fwd", "bwd_input", "bwd_weight")}
    scale = np.float32(1.0 / np.sum(target != IGNORE))
    acc, loss = {}, 0.0
    for m in range(micro_batches):
        env = {k: split(v, micro_batches)[m] for k, v in inputs.items()}
        env["target"] = split(target, micro_batches)[m]
        env["loss_scale"] = np.array(scale, dtype=np.float32)
        for k in range(stages):
            run_into(sess[(k, "fwd")], env)
        loss += float(env["loss"])
        for k in reversed(range(stages)):
            run_into(sess[(k, "bwd_input")], env)
            w = sess[(k, "bwd_weight")]
            for i in w.get_inputs():
                if i.name.startswith("grad_acc."):
                    p = i.name[len("grad_acc."):]
                    env[i.name] = acc.get(p, np.zeros([d for d in i.shape], np.float32))
            for o, v in zip(w.get_outputs(), w.run(None, {i.name: env[i.name] for i in w.get_inputs()})):
                acc[o.name[len("grad."):]] = v
    return loss, acc


def run_into(s, env):
    # grad.<y>@next (a tensor the stage reads and passes on) is the next stage's grad.<y>.
    outs = s.run(None, {i.name: env[i.name[:-len("@next")] if i.name.endswith("@next") else i.name]
                        for i in s.get_inputs()})
    for o, v in zip(s.get_outputs(), outs):
        env[o.name] = v


def targets_for(path, inputs, rng):
    logits = session(path).run(None, inputs)[0]
    classes = logits.shape[-1]
    t = rng.integers(0, classes, size=logits.shape[:-1]).astype(np.int64)
    flat = t.reshape(-1)
    flat[rng.choice(flat.size, size=max(1, flat.size // 8), replace=False)] = IGNORE
    return t


def check_model(args, path, rng):
    model = onnx.load(path)
    global_batch = args.micro_batch * args.micro_batches
    inputs = make_inputs(path, global_batch, rng)
    for name, value in inputs.items():
        if value.dtype == np.int64:  # token ids: anywhere in the vocabulary the model has
            inputs[name] = rng.integers(0, 64, size=value.shape).astype(np.int64)
    target = targets_for(path, inputs, rng)
    results = []
    label = os.path.basename(path)
    err = forward_matches_onnxruntime(path, model, inputs, args.micro_batches)
    if err:
        return [(label, err)]
    ref_loss, ref_grads = reference(model, inputs, target, args.micro_batches)
    with tempfile.TemporaryDirectory() as tmp:
        inputs_path = {}
        for name, value in inputs.items():
            inputs_path[name] = os.path.join(tmp, f"in_{name}.npy")
            np.save(inputs_path[name], value)
        target_path = os.path.join(tmp, "target.npy")
        np.save(target_path, target)
        for stages in args.stages:
            for recompute in args.recompute:
                case = f"{label} grad stages={stages} recompute={recompute}"
                try:
                    loss, grads = ours(args, path, inputs_path, target_path, ref_grads.keys(),
                                       stages, recompute, args.micro_batches, tmp)
                    results.append(outcome(case, compare(loss, grads, ref_loss, ref_grads, args.tol)))
                except RuntimeError as e:
                    results.append((case, str(e)))
        for stages in args.portable_stages:
            case = f"{label} portable onnxruntime stages={stages} recompute={args.portable_recompute}"
            try:
                loss, grads = portable(args, path, inputs, target, stages, args.portable_recompute,
                                       args.micro_batches, tmp)
                results.append(outcome(case, compare(loss, grads, ref_loss, ref_grads, args.tol)))
            except RuntimeError as e:
                results.append((case, str(e)))
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--stages", type=int, nargs="*", default=[1, 3])
    ap.add_argument("--recompute", nargs="+", default=["none"])
    ap.add_argument("--portable-stages", type=int, nargs="*", default=[2])
    ap.add_argument("--portable-recompute", default="selective")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    results = []
    for path in args.model:
        results += check_model(args, path, rng)
    report(results)


if __name__ == "__main__":
    main()
