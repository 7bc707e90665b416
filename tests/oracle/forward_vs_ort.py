"""Forward outputs of `pipetrain run` against onnxruntime on the same inputs.

For each model: random inputs (token ids within the vocabulary) saved as .npy, `pipetrain run`
with --threads 2, and onnxruntime on the same feeds; every output must agree within --tol
relative to the output's largest magnitude. Prints 'N passed, M failed'.
"""
import argparse
import os
import subprocess
import tempfile

import numpy as np
import onnxruntime as ort

from stage_chain import make_inputs, report, session


def check(pipetrain, model, batch, tol, rng):
    feeds = make_inputs(model, batch, rng)
    with tempfile.TemporaryDirectory() as tmp:
        args = [pipetrain, "run", model, "--threads", "2", "--output", tmp]
        for name, arr in feeds.items():
            path = os.path.join(tmp, f"in_{len(args)}.npy")
            np.save(path, arr)
            args += ["--input", f"{name}={path}"]
        res = subprocess.run(args, capture_output=True, text=True)
        if res.returncode != 0:
            return f"pipetrain run failed: {res.stderr.strip()}"
        s = session(model)
        worst = 0.0
        for out, want in zip(s.get_outputs(), s.run(None, feeds)):
            fname = out.name
            for c in "/:\\ ":
                fname = fname.replace(c, "_")
            have = np.load(os.path.join(tmp, fname + ".npy"))
            if have.shape != want.shape:
                return f"{out.name}: shape {have.shape} != {want.shape}"
            scale = max(float(np.max(np.abs(want))), 1e-30)
            worst = max(worst, float(np.max(np.abs(have.astype(np.float64) - want))) / scale)
        if worst > tol:
            return f"max relative error {worst:.3g} > {tol}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    report((os.path.basename(model), check(args.pipetrain, model, args.batch, args.tol, rng))
           for model in args.model)


if __name__ == "__main__":
    main()
