"""pipetrain's inferred types against the onnx package's shape inference (onnx 1.23 in .venv).

For each model: the file's symbolic batch is bound to --batch and onnx.shape_inference infers
every value (strict mode, data propagation); `pipetrain partition --stages 1 --export` writes
the imported graph with pipetrain's type for every value it keeps (import folds constant
subgraphs away, so those values are not compared). Every value both name must have the same
dtype and rank, and every dim onnx knows must be pipetrain's; a dim onnx leaves unknown (one
that depends on values it does not propagate, which folding computes) is counted as more precise. Prints one line per model and closes with 'N passed, M failed'.

Usage: shapes_vs_onnx.py --pipetrain BIN --model M.onnx [--model ...] [--batch 2]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import onnx

from stage_chain import report  # one line per case, then 'N passed, M failed'


def types_of(model):
    out = {}
    g = model.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        out[vi.name] = (tt.elem_type, dims)
    return out


def onnx_types(path, batch):
    m = onnx.load(path)
    for vi in m.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.dim_value = batch
    for vi in m.graph.output:
        vi.type.tensor_type.ClearField("shape")
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    return types_of(m)


def check(args, path):
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([args.pipetrain, "partition", path, "--stages", "1", "--micro-batch",
                              str(args.batch), "--export", tmp], capture_output=True, text=True)
        if res.returncode != 0:
            return 0, 0, f"pipetrain failed: {res.stderr.strip()[:300]}"
        ours = types_of(onnx.load(os.path.join(tmp, "stage_0.onnx")))
    theirs = onnx_types(path, args.batch)
    compared = precise = 0
    for name, (dtype, dims) in ours.items():
        if name not in theirs:
            continue
        compared += 1
        their_dtype, their_dims = theirs[name]
        if their_dtype != dtype or len(their_dims) != len(dims) or any(
                t is not None and t != d for t, d in zip(their_dims, dims)):
            return compared, precise, f"'{name}': pipetrain {dtype} {dims}, onnx {their_dtype} {their_dims}"
        precise += any(t is None for t in their_dims)
    return compared, precise, None if compared else "no value in common"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()

    def cases():
        for path in args.model:
            compared, precise, err = check(args, path)
            note = f": {compared} values agree" + (f" ({precise} with dims onnx leaves unknown)" if precise else "")
            yield os.path.basename(path) + ("" if err else note), err

    report(cases())


if __name__ == "__main__":
    main()
