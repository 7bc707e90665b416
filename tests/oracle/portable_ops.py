"""The portable form of the pipetrain-domain ops, run by onnxruntime.

tests/autodiff/portable_cases_main.cc writes, per case, the one-node graph after lower_to_standard
(DIR/<case>/model.onnx), its inputs (DIR/<case>/inputs/*.npy) and what the pipetrain CPU kernel
gave (DIR/<case>/expected/*.npy). Each model must pass the onnx checker with full shape inference
(so the types pipetrain wrote for the new values are right), import no domain but the standard
one at opset >= 17, and reproduce every expected output in onnxruntime within --tol.

Tolerance: max |ort - pipetrain| / max |pipetrain| per output, 1e-4 by default. Both sides compute
the same math in float32 but in different orders and forms (oneDNN's blocked reductions against
ReduceSum; ConvTranspose against oneDNN's backward-data primitive; a sum times 1/n against a mean;
logsumexp against LogSoftmax), so they differ by rounding that grows with the length of the
reductions (here at most a few hundred terms: well under 1e-5 of the largest value). A wrong
index, a missing or doubled term, a mis-scaled window or an unmasked ignored row is an error of
the order of the values themselves, 1e-2 relative or more, so 1e-4 separates the two by orders of
magnitude. Scaling by the largest magnitude keeps near-zero entries (ReluGrad's, ClipGrad's)
from demanding a relative accuracy float32 cannot give.

Usage: portable_ops.py DIR [--tol 1e-4]. Prints one line per case and 'N passed, M failed'.
"""
import argparse
import os

import numpy as np
import onnx

from stage_chain import report, session


def check_case(case_dir, tol):
    """(error or None, worst relative error or None)."""
    model_path = os.path.join(case_dir, "model.onnx")
    model = onnx.load(model_path)
    onnx.checker.check_model(model, full_check=True)
    domains = {o.domain: o.version for o in model.opset_import}
    if set(domains) - {"", "ai.onnx"}:
        return f"imports non-standard domains {sorted(set(domains) - {'', 'ai.onnx'})}", None
    if max(domains.get("", 0), domains.get("ai.onnx", 0)) < 17:
        return f"opset {domains} < 17", None
    odd = [n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")]
    if odd:
        return f"non-standard nodes {odd}", None
    s = session(model_path)
    feeds = {i.name: np.load(os.path.join(case_dir, "inputs", i.name + ".npy"))
             for i in s.get_inputs()}
    names = [o.name for o in s.get_outputs()]
    worst = 0.0
    for name, have in zip(names, s.run(None, feeds)):
        want = np.load(os.path.join(case_dir, "expected", name + ".npy"))
        if have.shape != want.shape:
            return f"{name}: shape {have.shape} != {want.shape}", None
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        if scale == 0.0:
            return f"{name}: pipetrain's output is all zeros, which checks nothing", None
        err = float(np.max(np.abs(have.astype(np.float64) - want))) / scale
        worst = max(worst, err)
    return f"max error {worst:.3g} > {tol}" if worst > tol else None, worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    cases = sorted(d for d in os.listdir(args.dir)
                   if os.path.isfile(os.path.join(args.dir, d, "model.onnx")))
    if not cases:
        report([("cases", f"no case found under {args.dir}")])

    def run(case):
        try:
            err, worst = check_case(os.path.join(args.dir, case), args.tol)
        except Exception as e:  # an onnx checker or onnxruntime error fails this case only
            err, worst = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}", None
        return (case if worst is None else f"{case} (max rel err {worst:.1e})"), err

    report(run(case) for case in cases)


if __name__ == "__main__":
    main()
