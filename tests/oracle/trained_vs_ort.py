"""The trained model `pipetrain train` writes is the input model with new weights, and onnxruntime
runs it: for each sample, a few training steps (synthetic data, 2 stages), then the trained file
must (1) pass the onnx checker with the same graph (nodes, inputs, outputs) as the input model,
(2) keep its weights in external data (trained.onnx.data) where the input model does, and
differ from it in its trained initializers (and BatchNorm running statistics), and (3) give in
onnxruntime what `pipetrain run` gives on it (forward_vs_ort's check). Prints 'N passed, M failed'.
"""
import argparse
import os
import subprocess
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

from forward_vs_ort import check
from stage_chain import report


def external(path):
    """Whether the model at path keeps any initializer in external data."""
    graph = onnx.load(path, load_external_data=False).graph
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.initializer)


def train_and_check(pipetrain, model, rng):
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "c.yaml")
        out = os.path.join(tmp, "trained.onnx")
        with open(cfg, "w") as f:
            f.write(f"model: {model}\ndims: {{batch: 2}}\ndata: {{kind: synthetic, samples: 16}}\n"
                    "optimizer: {kind: sgd, lr: 0.01, momentum: 0.9}\n"
                    "pipeline: {stages: 2, micro_batches: 2, schedule: 1f1b}\n"
                    f"parameters: {{frozen: [mask]}}\nsteps: 3\noutput: {{model: {out}}}\n")
        res = subprocess.run([pipetrain, "train", cfg, "-q"], capture_output=True, text=True)
        if res.returncode != 0:
            return f"pipetrain train failed: {res.stderr.strip()}"
        before, after = onnx.load(model), onnx.load(out)
        onnx.checker.check_model(out)
        if external(model) != external(out):
            return f"the input model's external data is {external(model)}, the trained model's {external(out)}"
        if external(out) and not os.path.exists(out + ".data"):
            return "the trained model's data file trained.onnx.data is missing"
        if [n.SerializeToString() for n in before.graph.node] != [n.SerializeToString() for n in after.graph.node]:
            return "the trained model's nodes differ from the input model's"
        if before.graph.input != after.graph.input or before.graph.output != after.graph.output:
            return "the trained model's inputs or outputs differ"
        old = {t.name: numpy_helper.to_array(t) for t in before.graph.initializer}
        new = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
        if old.keys() != new.keys():
            return "the trained model's initializer names differ"
        changed = [k for k in old if old[k].dtype == np.float32 and not np.array_equal(old[k], new[k])]
        if not changed:
            return "no initializer changed"
        if any("running" in k for k in old) and not any("running" in k for k in changed):
            return "BatchNorm running statistics did not change"
        if "mask" in old and "mask" in changed:
            return "the frozen mask changed"
        return check(pipetrain, out, 2, 1e-4, rng)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--model", action="append", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    report((os.path.basename(m), train_and_check(args.pipetrain, m, rng)) for m in args.model)


if __name__ == "__main__":
    main()
