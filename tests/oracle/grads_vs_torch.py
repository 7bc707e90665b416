"""`pipetrain grad` on every exported fixture against PyTorch's autograd on the module.

For every samples/exports/NAME[_VARIANT].onnx and its NAME[_VARIANT].grads.npz (made by
samples/exports/make_exports.py --grads: PyTorch 2.15's autograd in float64, stored as float32, of
the mean cross-entropy over every target of the first micro-batch, x[:2] and y[:2] of the
fixture's training data, at the file's initial values, for every initializer pipetrain trains in
the file, the module run as pipetrain trains it: BatchNorm on the batch's statistics, or folded
into the convolutions where the exporter folded it), `pipetrain grad FILE -i input=x.npy
--target y.npy` at 1 stage and at 4 stages (one micro-batch) gives
  - the reference's loss within --tol relative;
  - a gradient for exactly the initializers the reference has, no more, no fewer;
  - each gradient within --tol of PyTorch's relative to that gradient's own scale, plus a floor:
        max|have - want| <= tol * max|want| + NOISE_FACTOR * noise,
    noise being max|float32 - float64 PyTorch| on that tensor (the file's `noise`).
    For a well-conditioned gradient the floor is a few tol's worth of nothing (noise is about
    1e-6 of the gradient). A gradient that is zero in exact arithmetic has no scale of its own:
    an attention key bias (softmax ignores a shift shared by every key, so the bias's gradient,
    the sum over keys of each query's softmax gradient, cancels to zero) or a bias before a
    training-mode BatchNorm (which subtracts the batch's mean). float64 leaves about 1e-20 of it
    and float32 the rounding of the sums that cancel, 1e-13 to 1e-8 here; the floor holds such a
    tensor to NOISE_FACTOR times what float32 PyTorch leaves, an absolute bound far below any
    nonzero gradient of its file.
A file whose nonzero gradients float32 PyTorch itself cannot give within tol/10 (MobileNetV3's
BatchNorm over 2 samples of 1x1 maps normalises each channel to about +-1 whatever its input,
so its gradients are mostly rounding) is checked for its loss and names only, and says so.
Prints one line per case and closes with 'N passed, M failed'.

Usage: grads_vs_torch.py --pipetrain BIN --dir samples/exports [--names gpt2 ...] [--tol 1e-4]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stage_chain import report  # noqa: E402  one line per case, then 'N passed, M failed'
from torch_train import npy_file_name  # noqa: E402  the file `grad` writes a gradient to

# pipetrain's float32 rounding in a cancelling sum is PyTorch's within a small factor (the
# summation orders differ); 16 leaves room for that and stays far below any real gradient.
NOISE_FACTOR = 16
STAGES = [1, 4]


def pipetrain_grad(args, path, ref, tmp, stages):
    """({initializer file name: gradient}, loss) from `pipetrain grad`."""
    x, y, out = os.path.join(tmp, "x.npy"), os.path.join(tmp, "y.npy"), os.path.join(tmp, f"grads_{stages}")
    np.save(x, ref["x"])
    np.save(y, ref["y"])
    res = subprocess.run([args.pipetrain, "grad", path, "--input", f"input={x}", "--target", y,
                          "--stages", str(stages), "--threads", "1", "--output", out],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"pipetrain grad failed: {(res.stderr or res.stdout).strip()[:400]}")
    grads = {f: np.load(os.path.join(out, f)) for f in os.listdir(out) if f != "loss.npy"}
    return grads, float(np.load(os.path.join(out, "loss.npy")))


def ill_conditioned(ref, tol):
    """The worst relative float32 noise over the file's gradients that are not zero in exact
    arithmetic (whose float64 value exceeds the noise), where it passes tol/10; else None."""
    worst = 0.0
    for name, noise in zip(ref["names"], ref["noise"]):
        scale = float(np.max(np.abs(ref[f"grad.{name}"])))
        if scale > noise:
            worst = max(worst, noise / scale)
    return worst if worst > tol / 10 else None


def check(args, path, ref, stages, compare):
    """(error or None, the worst gradient's error / bound and name)."""
    with tempfile.TemporaryDirectory() as tmp:
        grads, loss = pipetrain_grad(args, path, ref, tmp, stages)
    want_loss = float(ref["loss"])
    # float32 PyTorch's own loss error (loss_noise) where float32 cannot resolve the loss to tol.
    loss_noise = float(ref["loss_noise"]) if "loss_noise" in ref.files else 0.0
    if abs(loss - want_loss) > args.tol * max(1.0, abs(want_loss)) + NOISE_FACTOR * loss_noise:
        return f"loss {loss:.7f}, PyTorch {want_loss:.7f}", ""
    files = {npy_file_name(name): name for name in ref["names"]}
    if set(grads) != set(files):
        extra, missing = sorted(set(grads) - set(files)), sorted(files[f] for f in set(files) - set(grads))
        return f"gradients for {extra[:3]} that PyTorch has none for; none for {missing[:3]}", ""
    if not compare:
        return None, ""
    worst = (0.0, "", 0.0, 0.0)
    for (name, noise) in zip(ref["names"], ref["noise"]):
        want = ref[f"grad.{name}"].astype(np.float64)
        have = grads[npy_file_name(name)].astype(np.float64)
        if have.shape != want.shape:
            return f"'{name}' is {have.shape}, PyTorch's {want.shape}", ""
        err = float(np.max(np.abs(have - want)))
        bound = args.tol * float(np.max(np.abs(want))) + NOISE_FACTOR * float(noise)
        if err / bound > worst[0]:
            worst = (err / bound, name, err, bound)
    if worst[0] > 1:
        return f"'{worst[1]}' differs from PyTorch's gradient by {worst[2]:.3g} > {worst[3]:.3g}", ""
    return None, f", worst error / bound {worst[0]:.2f} ({worst[1]})"


def cases(args):
    """(label, error or None) for every fixture, at each stage count; a fixture with no
    .grads.npz is a failure."""
    for name in args.names or sorted(f[:-len(".onnx")] for f in os.listdir(args.dir) if f.endswith(".onnx")):
        path = os.path.join(args.dir, f"{name}.onnx")
        if not os.path.exists(os.path.join(args.dir, f"{name}.grads.npz")):
            yield name, f"no {name}.grads.npz: run samples/exports/make_exports.py --grads"
            continue
        ref = np.load(os.path.join(args.dir, f"{name}.grads.npz"))
        ill = ill_conditioned(ref, args.tol)
        for stages in STAGES:
            label = f"{name} stages={stages}: {len(ref['names'])} gradients"
            if ill is not None:
                label += f", loss and names only (float32 PyTorch is off by {ill:.2g} of a gradient)"
            try:
                err, worst = check(args, path, ref, stages, ill is None)
                yield label + worst, err
            except RuntimeError as e:
                yield label, str(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--dir", required=True, help="samples/exports")
    ap.add_argument("--names", nargs="+", help="NAME[_VARIANT] of the fixtures (default: every .grads.npz)")
    ap.add_argument("--tol", type=float, default=1e-4)
    report(cases(ap.parse_args()))


if __name__ == "__main__":
    main()
