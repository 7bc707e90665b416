"""Stage-chain equivalence against onnxruntime.

For each model and stage count: `pipetrain partition --export` writes stage_K.onnx; every stage
must pass the onnx checker (with shape inference), and running the stages one after another in
onnxruntime, each fed with what the earlier ones produced, must reproduce the whole model's
outputs (run by onnxruntime on the same inputs) within --tol.

Usage: stage_chain.py --pipetrain BIN --model M.onnx [--model ...] --stages 2 3 4 [--micro-batch 2]
Prints one line per case and closes with 'N passed, M failed'.
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

NP_TYPES = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.BOOL: np.bool_,
}


def make_inputs(model_path, batch, rng):
    """Random inputs for the model's runtime inputs, batch bound to `batch`; ids within range."""
    model = onnx.load(model_path)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else batch for d in tt.shape.dim]
        shape[0] = batch if not tt.shape.dim[0].HasField("dim_value") else shape[0]
        dtype = NP_TYPES[tt.elem_type]
        if dtype in (np.int64, np.int32):
            feeds[vi.name] = rng.integers(0, 16, size=shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def session(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def run_chain(stage_paths, feeds):
    env = dict(feeds)
    for path in stage_paths:
        s = session(path)
        outs = s.run(None, {i.name: env[i.name] for i in s.get_inputs()})
        for o, v in zip(s.get_outputs(), outs):
            env[o.name] = v
    last = session(stage_paths[-1])
    return {o.name: env[o.name] for o in last.get_outputs()}


def check_case(args, model, stages, rng):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [args.pipetrain, "partition", model, "--stages", str(stages),
               "--micro-batch", str(args.micro_batch), "--export", tmp, "--json"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            return f"pipetrain failed: {res.stderr.strip()}"
        plan = json.loads(res.stdout)
        paths = [os.path.join(tmp, f"stage_{k}.onnx") for k in range(len(plan["stages"]))]
        for p in paths:
            onnx.checker.check_model(onnx.load(p), full_check=True)
        feeds = make_inputs(model, args.micro_batch, rng)
        whole = session(model)
        expected = dict(zip([o.name for o in whole.get_outputs()], whole.run(None, feeds)))
        got = run_chain(paths, feeds)
        worst = 0.0
        for name, want in expected.items():
            have = got[name]
            if have.shape != want.shape:
                return f"output {name}: shape {have.shape} != {want.shape}"
            scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
            worst = max(worst, float(np.max(np.abs(have.astype(np.float64) - want))) / scale)
        if worst > args.tol:
            return f"max error {worst:.3g} > {args.tol}"
        return None


def report(results):
    """Prints one line per (label, error or None), then 'N passed, M failed'; exits 1 on a failure."""
    passed = failed = 0
    for label, err in results:
        if err:
            failed += 1
            print(f"FAIL {label}: {err}")
        else:
            passed += 1
            print(f"ok   {label}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    report((f"{os.path.basename(model)} stages={stages}", check_case(args, model, stages, rng))
           for model in args.model for stages in args.stages)


if __name__ == "__main__":
    main()
