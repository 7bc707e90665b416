"""Writes ONNX's node test cases from the installed onnx package (1.23: opsets up to 28) in the
layout of libonnx-testdata (CASE/model.onnx, CASE/test_data_set_0/{input,output}_K.pb), for the
ops named, so that the conformance runners can take cases newer than Debian's data (opset 17).
The onnx package holds the case generators (onnx/backend/test/case/node), not their data.
Some cases state hand-rounded outputs (4 decimals); where onnx.reference's evaluator reproduces
them within the case's own tolerance, its unrounded outputs are written instead.

Usage: make_node_cases.py --out DIR (--ops Add,ReduceMean,... | --pipetrain BIN)
(with --pipetrain: every default-domain op `pipetrain ops` lists). Prints how many it wrote.
"""
import argparse
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.backend.test.case.node import collect_testcases


def unrounded(case, inputs, outputs):
    try:
        feeds = {i.name: v for i, v in zip(case.model.graph.input, inputs)}
        computed = ReferenceEvaluator(case.model).run(None, feeds)
    except Exception:
        return outputs
    for have, want in zip(computed, outputs):
        if np.shape(have) != np.shape(want) or np.asarray(have).dtype != np.asarray(want).dtype:
            return outputs
        if np.asarray(want).dtype not in (np.float32, np.float64):
            return outputs  # only float outputs are ever rounded by hand
        if not np.allclose(have, want, rtol=case.rtol, atol=case.atol, equal_nan=True):
            return outputs
    return computed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", help="comma-separated op types")
    ap.add_argument("--pipetrain", help="take the ops from `pipetrain ops`")
    args = ap.parse_args()
    if args.pipetrain:
        listing = subprocess.run([args.pipetrain, "ops"], capture_output=True, text=True, check=True).stdout
        ops = {line.split()[0] for line in listing.splitlines() if line and "::" not in line.split()[0]}
    else:
        ops = set((args.ops or "").split(","))
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    written = 0
    for case in collect_testcases():
        nodes = case.model.graph.node
        if len(nodes) != 1 or nodes[0].domain not in ("", "ai.onnx") or nodes[0].op_type not in ops:
            continue
        inputs, outputs = case.data_sets[0]
        if not all(hasattr(v, "shape") for v in list(inputs) + list(outputs)):
            continue  # sequences, optionals: not tensors
        outputs = unrounded(case, inputs, outputs)
        d = os.path.join(args.out, case.name)
        data = os.path.join(d, "test_data_set_0")
        os.makedirs(data)
        onnx.save(case.model, os.path.join(d, "model.onnx"))
        for kind, values, infos in (("input", inputs, case.model.graph.input),
                                    ("output", outputs, case.model.graph.output)):
            for k, (v, info) in enumerate(zip(values, infos)):
                with open(os.path.join(data, f"{kind}_{k}.pb"), "wb") as f:
                    f.write(numpy_helper.from_array(v, info.name).SerializeToString())
        written += 1
    print(f"onnx {onnx.__version__}: {written} node cases written to {args.out}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
