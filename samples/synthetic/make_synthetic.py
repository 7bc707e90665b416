#!/usr/bin/env python3
"""Write a synthetic transformer-like ONNX model with the onnx helper API.

    python3 samples/synthetic/make_synthetic.py --layers L --hidden H --seq S --out FILE
        [--heads N] [--act gelu|relu] [--ffn-mult M] [--seed K]
        [--external-data [--external-shapes]] [--check]

Graph (opset 17, IR 8): input "input" float [batch, S, H] -> output "output"
float [batch, S, H]; "batch" is a symbolic dimension. Each layer is a pre-LN
encoder block built from standard ops only:

    LayerNormalization
    MatMul+Add (q, k, v) -> Reshape [-1,S,N,D] -> Transpose (k to [B,N,D,S])
    MatMul (q.kT) -> Mul (1/sqrt(D)) -> Softmax -> MatMul (.v)
    Transpose -> Reshape [-1,S,H] -> MatMul+Add (out proj) -> Add (residual)
    LayerNormalization -> MatMul+Add -> Gelu as Div/Erf/Add/Mul/Mul (or Relu)
    -> MatMul+Add -> Add (residual)

followed by one final LayerNormalization. Every layer owns its initializers
(weights and the Reshape shape tensors), named "layers.<i>.<what>", so a layer
never shares a tensor with another. That is 33 nodes per layer with gelu and 29
with relu: --layers 500 gives 16,501 (gelu) or 14,501 (relu) nodes.

Weights are random normal (numpy, seeded by --seed) with std 1/sqrt(fan_in),
LayerNorm scales 1 and shifts 0 plus a small jitter, so that activations stay
O(1) through deep stacks and no two weight tensors are value-identical (the
per-layer shape and constant tensors do repeat values across layers).

--external-data stores the tensors in one file "<out name>.data" next to the
model (size_threshold 0, all in one file), for testing external-data loading.
The small int64 Reshape shape tensors stay inline, because ONNX shape
inference (run by onnxruntime at load) cannot read them from external data;
add --external-shapes to move those too (every initializer external; ORT then
rejects the model). Without --external-data the model must stay under
protobuf's 2 GB limit.
"""

import argparse
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, external_data_helper, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17 (what torch 1.13 writes)


def nodes_per_layer(act):
    return 33 if act == "gelu" else 29


def build(layers, hidden, seq, heads=4, act="gelu", ffn_mult=4, seed=0):
    if hidden % heads:
        raise ValueError("--hidden (%d) must be divisible by --heads (%d)" % (hidden, heads))
    head_dim = hidden // heads
    ffn = hidden * ffn_mult
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def weight(name, fan_in, fan_out):
        w = rng.standard_normal((fan_in, fan_out), dtype=np.float32) / np.float32(math.sqrt(fan_in))
        return init(name, w)

    def vec(name, n, base=0.0, std=0.02):
        return init(name, (base + std * rng.standard_normal(n)).astype(np.float32))

    def node(op, inputs, outputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0]

    def linear(p, x, fan_in, fan_out, tag):
        w = weight("%s.%s.weight" % (p, tag), fan_in, fan_out)
        b = vec("%s.%s.bias" % (p, tag), fan_out)
        mm = node("MatMul", [x, w], ["%s/%s/MatMul" % (p, tag)], "%s/%s/MatMul" % (p, tag))
        return node("Add", [mm, b], ["%s/%s/Add" % (p, tag)], "%s/%s/Add" % (p, tag))

    def layernorm(p, x, tag):
        g = vec("%s.%s.weight" % (p, tag), hidden, base=1.0)
        b = vec("%s.%s.bias" % (p, tag), hidden)
        return node("LayerNormalization", [x, g, b], ["%s/%s" % (p, tag)], "%s/%s" % (p, tag),
                    axis=-1, epsilon=1e-5)

    x = "input"
    for i in range(layers):
        p = "layers.%d" % i
        split_shape = init(p + ".split_shape", np.array([-1, seq, heads, head_dim], np.int64))
        merge_shape = init(p + ".merge_shape", np.array([-1, seq, hidden], np.int64))
        scale = init(p + ".attn_scale", np.array(1.0 / math.sqrt(head_dim), np.float32))

        h = layernorm(p, x, "ln1")
        qkv = {}
        for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            y = linear(p, h, hidden, hidden, t)
            y = node("Reshape", [y, split_shape], ["%s/%s/Reshape" % (p, t)], "%s/%s/Reshape" % (p, t))
            qkv[t] = node("Transpose", [y], ["%s/%s/Transpose" % (p, t)], "%s/%s/Transpose" % (p, t),
                          perm=perm)
        s = node("MatMul", [qkv["q"], qkv["k"]], [p + "/attn/scores"], p + "/attn/scores")
        s = node("Mul", [s, scale], [p + "/attn/scaled"], p + "/attn/scaled")
        s = node("Softmax", [s], [p + "/attn/softmax"], p + "/attn/softmax", axis=-1)
        a = node("MatMul", [s, qkv["v"]], [p + "/attn/context"], p + "/attn/context")
        a = node("Transpose", [a], [p + "/attn/merge_t"], p + "/attn/merge_t", perm=[0, 2, 1, 3])
        a = node("Reshape", [a, merge_shape], [p + "/attn/merge"], p + "/attn/merge")
        a = linear(p, a, hidden, hidden, "o")
        x = node("Add", [x, a], [p + "/residual1"], p + "/residual1")

        h = layernorm(p, x, "ln2")
        h = linear(p, h, hidden, ffn, "fc1")
        if act == "gelu":
            # gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2))), as torch exports it.
            c_sqrt2 = init(p + ".gelu_sqrt2", np.array(math.sqrt(2.0), np.float32))
            c_one = init(p + ".gelu_one", np.array(1.0, np.float32))
            c_half = init(p + ".gelu_half", np.array(0.5, np.float32))
            d = node("Div", [h, c_sqrt2], [p + "/gelu/Div"], p + "/gelu/Div")
            e = node("Erf", [d], [p + "/gelu/Erf"], p + "/gelu/Erf")
            e = node("Add", [e, c_one], [p + "/gelu/Add"], p + "/gelu/Add")
            m = node("Mul", [h, e], [p + "/gelu/Mul"], p + "/gelu/Mul")
            h = node("Mul", [m, c_half], [p + "/gelu/Mul_1"], p + "/gelu/Mul_1")
        else:
            h = node("Relu", [h], [p + "/relu"], p + "/relu")
        h = linear(p, h, ffn, hidden, "fc2")
        x = node("Add", [x, h], [p + "/residual2"], p + "/residual2")

    g = vec("ln_f.weight", hidden, base=1.0)
    b = vec("ln_f.bias", hidden)
    node("LayerNormalization", [x, g, b], ["output"], "ln_f", axis=-1, epsilon=1e-5)

    graph = helper.make_graph(
        nodes, "synthetic_transformer",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", seq, hidden])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", seq, hidden])],
        initializer=inits)
    model = helper.make_model(graph, producer_name="pipetrain-make_synthetic",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    model.doc_string = ("synthetic transformer: layers=%d hidden=%d seq=%d heads=%d act=%s "
                        "ffn_mult=%d seed=%d" % (layers, hidden, seq, heads, act, ffn_mult, seed))
    return model


def save(model, out, external_data, external_shapes=False):
    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    if external_data:
        location = os.path.basename(out) + ".data"
        data_path = os.path.join(out_dir, location)
        if os.path.exists(data_path):
            os.remove(data_path)  # onnx appends to an existing file
        # Same as onnx.save_model(..., save_as_external_data=True,
        # all_tensors_to_one_file=True, location=location, size_threshold=0),
        # except that the int64 Reshape shape tensors stay inline unless
        # external_shapes: ONNX shape inference (which onnxruntime runs when
        # it loads a model) cannot read a Reshape's shape from external data
        # and rejects the model.
        external_data_helper.convert_model_to_external_data(
            model, all_tensors_to_one_file=True, location=location, size_threshold=0)
        if not external_shapes:
            for t in model.graph.initializer:
                if t.data_type == TensorProto.INT64:
                    t.data_location = TensorProto.DEFAULT
                    del t.external_data[:]
        onnx.save_model(model, out)
        os.chmod(data_path, 0o644)  # onnx creates it 0600
        return data_path
    if model.ByteSize() >= 2 ** 31:
        raise SystemExit("model is %d bytes, over protobuf's 2 GB limit: use --external-data"
                         % model.ByteSize())
    onnx.save_model(model, out)
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a synthetic transformer-like ONNX model.")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--act", choices=["gelu", "relu"], default="gelu")
    ap.add_argument("--ffn-mult", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--external-data", action="store_true",
                    help="store all tensors in <out name>.data next to the model")
    ap.add_argument("--external-shapes", action="store_true",
                    help="with --external-data, also move the int64 Reshape shape tensors "
                         "to the data file (onnxruntime then refuses to load the model)")
    ap.add_argument("--check", action="store_true",
                    help="run onnx.checker, and onnxruntime at batch 2 and 3 if installed "
                         "(the onnxruntime part takes minutes for hundreds of layers)")
    args = ap.parse_args(argv)
    if args.layers < 1 or args.hidden < 1 or args.seq < 1:
        ap.error("--layers, --hidden and --seq must be positive")

    if args.heads < 1 or args.hidden % args.heads:
        ap.error("--hidden (%d) must be divisible by --heads (%d)" % (args.hidden, args.heads))
    model = build(args.layers, args.hidden, args.seq, args.heads, args.act, args.ffn_mult, args.seed)
    n_nodes = len(model.graph.node)
    assert n_nodes == args.layers * nodes_per_layer(args.act) + 1, n_nodes
    if args.external_shapes and not args.external_data:
        ap.error("--external-shapes needs --external-data")
    data_path = save(model, args.out, args.external_data, args.external_shapes)
    size = os.path.getsize(args.out) + (os.path.getsize(data_path) if data_path else 0)
    print("wrote %s%s: %d nodes, %d bytes" % (
        args.out, (" + " + data_path) if data_path else "", n_nodes, size))
    if args.check:
        loaded = onnx.load(args.out)  # also pulls in external data
        if loaded.ByteSize() < 2 ** 31:
            # In memory, so full_check's shape inference can read the Reshape
            # shape tensors (it cannot read them from an external file).
            onnx.checker.check_model(loaded, full_check=True)
        else:
            onnx.checker.check_model(args.out)
        del loaded
        print("onnx.checker ok")
        try:
            import onnxruntime as ort
        except ImportError:
            print("(onnxruntime not installed: skipping the run)")
            return 0
        if args.external_shapes:
            print("(--external-shapes: onnxruntime cannot load this model, skipping the run)")
            return 0
        # Note: onnxruntime 1.31's session creation grows ~quadratically with
        # the layer count here (~19 s at 200 layers, ~2-4 min at 500).
        sess = ort.InferenceSession(args.out, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(1)
        for batch in (2, 3):
            x = rng.standard_normal((batch, args.seq, args.hidden), dtype=np.float32)
            (y,) = sess.run(None, {"input": x})
            assert y.shape == x.shape and np.isfinite(y).all(), y.shape
            print("onnxruntime batch %d: output %s, finite" % (batch, list(y.shape)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
