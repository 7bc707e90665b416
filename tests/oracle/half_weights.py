"""`pipetrain train` on float16 and bfloat16 weights (samples/half) against the float32 widening of
each file, PyTorch and onnxruntime.

For tiny_fp16.onnx and tiny_bf16.onnx, the file converted to float32 in the file here with the
onnx package alone (widen_file: each half initializer widened, exactly; each Cast to the half
type a Cast to float32; each value's type float32), then samples/half/train.yaml (3 steps of SGD
at 2 stages) three times:
  fp32     the half file, output.dtype: fp32
  file     the half file, output.dtype: file (the default)
  widened  the widened file
Checks, each a failure:
  (a) fp32's trained weights, in its safetensors and its model, are widened's bit for bit:
      training a half file is training its float32 widening; fp32's model is the widened graph
      (the same nodes, in float32);
  (b) file's are torch's rounding of fp32's (`.half()`, `.to(torch.bfloat16)`) bit for bit, and
      its model is the source file's graph node for node (the Casts to the half type as they
      were) with only the trained initializers' data changed;
  (c) widened's training is PyTorch's (samples/half/reference.npz: the module in float32 from the
      same weights, the same steps): each parameter within TOL of its largest update, and each
      step's loss within TOL relative;
  (d) both models pass the onnx checker, and onnxruntime runs them: the float32 one gives the
      widened run's model's output bit for bit, the float16 one its own output, finite (its CPU
      provider has no bfloat16 Mul, so a bfloat16 model is checked only).

Usage: half_weights.py --pipetrain BIN --samples DIR
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
import torch
from onnx import numpy_helper

HALF = {onnx.TensorProto.FLOAT16: torch.float16, onnx.TensorProto.BFLOAT16: torch.bfloat16}
TOL = 1e-4


def widen_tensor(t):
    if t.data_type not in HALF:
        return t
    return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)


def widen_file(src, dst):
    """src converted to float32 in the file: every half initializer, Constant value and value type
    float32, every Cast to a half type a Cast to float32."""
    m = onnx.load(src)
    for t in m.graph.initializer:
        t.CopyFrom(widen_tensor(t))
    for n in m.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                a.t.CopyFrom(widen_tensor(a.t))
            if n.op_type == "Cast" and a.name == "to" and a.i in HALF:
                a.i = onnx.TensorProto.FLOAT
    for v in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if v.type.tensor_type.elem_type in HALF:
            v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    onnx.checker.check_model(m)
    onnx.save(m, dst, save_as_external_data=True, location=os.path.basename(dst) + ".data", size_threshold=256)


def read_safetensors(path):
    """{name: (dtype name, raw little-endian bytes as a uint8 array, shape)}."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (e["dtype"], np.frombuffer(blob[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]], np.uint8),
                e["shape"]) for k, e in header.items()}


def rounded(fp32_bytes, dtype):
    """torch's rounding of float32 values (raw bytes) to `dtype`, as raw bytes."""
    x = torch.from_numpy(fp32_bytes.view(np.float32).copy())
    return x.to(dtype).view(torch.int16).numpy().view(np.uint8)


def train(pipetrain, model, out, dtype, samples):
    cmd = [pipetrain, "train", os.path.join(samples, "half", "train.yaml"), "-q", "--set", "model=" + model,
           "--set", "output.model=" + out, "--set", "output.dtype=" + dtype, "--set", "output.metrics=" + out + ".jsonl"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(samples))
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    inits = {t.name: t for t in onnx.load(out).graph.initializer}
    losses = [r["loss"] for r in map(json.loads, open(out + ".jsonl")) if "grad_norm" in r]
    return read_safetensors(os.path.splitext(out)[0] + ".safetensors"), inits, losses


def raw(t):
    return numpy_helper.to_array(t).reshape(-1).view(np.uint8) if t.data_type not in HALF else \
        np.frombuffer(t.raw_data, np.uint8)


def node_text(n):
    return (n.op_type, list(n.input), list(n.output),
            sorted((a.name, onnx.helper.get_attribute_value(a) if a.type != onnx.AttributeProto.TENSOR else
                    a.t.SerializeToString()) for a in n.attribute))


def check_file(name, pipetrain, samples, tmp, failures):
    src = os.path.join(samples, "half", name)
    source = onnx.load(src)
    half_type = next(t.data_type for t in source.graph.initializer if t.data_type in HALF)
    widened_path = os.path.join(tmp, name.replace(".onnx", "_widened.onnx"))
    widen_file(src, widened_path)
    runs = {kind: train(pipetrain, model, os.path.join(tmp, f"{name}.{kind}.onnx"), dtype, samples)
            for kind, model, dtype in [("fp32", src, "fp32"), ("file", src, "file"), ("widened", widened_path, "fp32")]}
    (st32, m32, loss32), (stf, mf, _), (stw, mw, lossw) = runs["fp32"], runs["file"], runs["widened"]
    fail = lambda what: failures.append(f"{name}: {what}")  # noqa: E731

    # (a) the half file trains as its float32 widening, bit for bit
    if set(st32) != set(stw):
        fail(f"safetensors keys differ from the widened run's: {sorted(set(st32) ^ set(stw))}")
    for k in st32.keys() & stw.keys():
        if st32[k][0] != "F32" or not np.array_equal(st32[k][1], stw[k][1]):
            fail(f"output.dtype fp32: safetensors '{k}' is not the widened run's ({st32[k][0]})")
    for k, t in m32.items():
        if t.data_type != mw[k].data_type or not np.array_equal(raw(t), raw(mw[k])):
            fail(f"output.dtype fp32: initializer '{k}' is not the widened run's")
    widened = onnx.load(widened_path)
    if [node_text(n) for n in onnx.load(os.path.join(tmp, f"{name}.fp32.onnx")).graph.node] != \
            [node_text(n) for n in widened.graph.node]:
        fail("output.dtype fp32: the model's graph is not the widened file's")
    if loss32 != lossw:
        fail(f"losses {loss32} are not the widened run's {lossw}")

    # (b) written back in the file's dtype: torch's rounding of the float32 masters, in the source graph
    for k, (dtype, data, shape) in stf.items():
        want = rounded(st32[k][1], HALF[half_type])
        if dtype != {onnx.TensorProto.FLOAT16: "F16", onnx.TensorProto.BFLOAT16: "BF16"}[half_type] or \
                not np.array_equal(data, want):
            fail(f"output.dtype file: safetensors '{k}' ({dtype}) is not torch's rounding of the float32 one")
    trained_file = onnx.load(os.path.join(tmp, f"{name}.file.onnx"))
    if [node_text(n) for n in trained_file.graph.node] != [node_text(n) for n in source.graph.node]:
        fail("output.dtype file: the model's graph is not the source file's")
    changed = 0
    for t in source.graph.initializer:
        got = mf[t.name]
        if got.data_type != t.data_type:
            fail(f"output.dtype file: initializer '{t.name}' is {got.data_type}, the file's {t.data_type}")
        elif t.data_type in HALF and not np.array_equal(raw(got), rounded(raw(m32[t.name]), HALF[t.data_type])):
            fail(f"output.dtype file: initializer '{t.name}' is not torch's rounding of the float32 one")
        changed += not np.array_equal(numpy_helper.to_array(got), numpy_helper.to_array(t))
    if changed < 13:
        fail(f"only {changed} initializers changed in training, not the 13 parameters")

    # (c) the widened run against PyTorch
    ref = np.load(os.path.join(samples, "half", "reference.npz"))
    worst = 0.0
    for k, (dtype, data, shape) in stw.items():
        want = ref["state." + k]
        have = data.view(np.float32).reshape(shape)
        err = float(np.max(np.abs(have - want))) / max(float(ref["update." + k]), 1e-30)
        worst = max(worst, err)
        if err > TOL:
            fail(f"'{k}' is {err:.2e} of its update from PyTorch's, past {TOL}")
    loss_err = float(np.max(np.abs(np.array(lossw) - ref["losses"]) / np.abs(ref["losses"])))
    if loss_err > TOL:
        fail(f"losses {lossw} are {loss_err:.2e} from PyTorch's {list(ref['losses'])}")

    # (d) the written models load and run as the source did
    x = np.load(os.path.join(samples, "half", "x.npy"))[:2]
    outputs = {}
    for kind in ["fp32", "file", "widened"]:
        path = os.path.join(tmp, f"{name}.{kind}.onnx")
        onnx.checker.check_model(path)
        if kind == "file" and half_type == onnx.TensorProto.BFLOAT16:
            continue
        outputs[kind] = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    if not np.array_equal(outputs["fp32"], outputs["widened"]):
        fail("onnxruntime: the float32 model's output is not the widened run's model's")
    if "file" in outputs and (outputs["file"].dtype != np.float16 or not np.all(np.isfinite(outputs["file"]))):
        fail(f"onnxruntime: the float16 model gives {outputs['file'].dtype}, finite: {np.all(np.isfinite(outputs['file']))}")
    print(f"{name}: float32 masters = widened file's bit for bit; file dtype = torch's rounding; "
          f"PyTorch: worst {worst:.2e} of an update, losses {loss_err:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--samples", required=True)
    args = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["tiny_fp16.onnx", "tiny_bf16.onnx"]:
            check_file(name, os.path.abspath(args.pipetrain), os.path.abspath(args.samples), tmp, failures)
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
