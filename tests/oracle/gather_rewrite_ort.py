"""GatherElements and GatherND with constant indices into data computed at run time, which import
rewrites as Gather (onnx_import/gather_rewrite.h): `pipetrain run` against onnxruntime, exactly.
Each case is a one-node model behind a Relu, so that the data is not constant.

Usage: gather_rewrite_ort.py --pipetrain BIN    (closes with 'N passed, M failed')
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from stage_chain import report  # one line per case, then 'N passed, M failed'

CASES = [
    # name, op, data shape, indices, attributes
    ("elements_axis0", "GatherElements", [3, 4], [[0, 2, 1, 0], [2, -1, 0, 1]], {"axis": 0}),
    ("elements_axis_last", "GatherElements", [2, 3, 4], [[[3, 0], [1, 1], [-4, 2]]] * 2, {"axis": -1}),
    ("nd_pairs", "GatherND", [3, 4, 5], [[0, 1], [2, -1], [1, 3]], {}),
    ("nd_rows", "GatherND", [3, 4, 5], [[[2], [0]], [[1], [1]]], {}),
    ("nd_batch", "GatherND", [2, 3, 4], [[[1, 2], [0, 0]], [[2, 3], [1, -1]]], {"batch_dims": 1}),
]


def model(op, shape, indices, attrs, path):
    idx = np.array(indices, dtype=np.int64)
    node = helper.make_node(op, ["act", "idx"], ["output"], **attrs)
    relu = helper.make_node("Relu", ["input"], ["act"])
    graph = helper.make_graph([relu, node], "case",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch"] + shape[1:])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(idx, "idx")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inferred = onnx.shape_inference.infer_shapes(m)  # the output's type, which the checker asks for
    m.graph.output[0].CopyFrom(inferred.graph.output[0])
    onnx.save(m, path)


def check(args, op, shape, indices, attrs, x):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        model(op, shape, indices, attrs, path)
        np.save(os.path.join(tmp, "x.npy"), x)
        res = subprocess.run([args.pipetrain, "run", path, "--input", f"input={tmp}/x.npy", "--output", tmp],
                             capture_output=True, text=True)
        if res.returncode != 0:
            return res.stderr.strip()
        want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
        have = np.load(os.path.join(tmp, "output.npy"))
        if have.shape != want.shape or not np.array_equal(have, want):
            return f"{have.shape} vs onnxruntime's {want.shape}, or values differ"
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    report((name, check(args, op, shape, indices, attrs, rng.standard_normal(shape).astype(np.float32)))
           for name, op, shape, indices, attrs in CASES)


if __name__ == "__main__":
    main()
