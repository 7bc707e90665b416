"""FusedAttention (core/pipetrain_ops.h) against PyTorch's autograd in float64.

Each case is one attention layer written as the exporters write it: q, k, v = x @ Wq, Wk, Wv,
heads split, S = q @ k^T * scale, a mask (causal as Where with a tril constant, additive float with
some -inf, boolean as Where), Softmax, @ v, heads merged; grouped-query attention as a causal layer
with one K and V head repeated to the two query heads (Unsqueeze, Expand, Reshape: transformers'
repeat_kv); the output read as logits over E
classes. `pipetrain grad` imports it with the attention fused (checked: `pipetrain inspect`
names one fused attention) and gives the mean cross-entropy and dWq, dWk, dWv, which carry dQ,
dK and dV. The reference is softmax(q k^T * scale + mask) v in float64 torch (Debian's 1.13 has no
scaled_dot_product_attention), gradients by autograd.

Tolerance: |ours - torch| <= 1e-4 of each gradient's largest magnitude (of 1e-2 of the case's
largest gradient where a gradient is smaller, as one zero in exact arithmetic), and the loss within 1e-4 relative. Before trusting it, each case is run in float32 torch as well: float32 must itself be
within 1e-5 of float64 there (the cases are well conditioned), so 1e-4 leaves room for the fused
kernel's other summation order and still catches a wrong term, mask or scale (errors of order 1).

Usage: attention_vs_torch.py --pipetrain BIN [--tol 1e-4]. One line per case, then
'N passed, M failed'.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stage_chain import report  # noqa: E402  one line per case, then 'N passed, M failed'
from torch_train import npy_file_name  # noqa: E402  the file `grad` writes a gradient to

B, H, D = 2, 2, 8
E = H * D
KV_HEADS = 1  # the grouped-query case: one K and V head read by both query heads


def masks(kind, t, rng):
    """(constant for the graph, additive float64 mask for torch) of shape [t, t], or Nones."""
    if kind in ("causal", "gqa"):
        keep = np.tril(np.ones((t, t), dtype=bool))
    elif kind == "bool":
        keep = rng.random((t, t)) > 0.3
        keep[:, 0] = True  # no row sees nothing
    elif kind == "float":
        m = rng.uniform(-2, 0, (t, t)).astype(np.float32)
        m[rng.random((t, t)) < 0.2] = -np.inf
        m[:, 0] = 0.0
        return m, m.astype(np.float64)
    else:
        return None, None
    return keep, np.where(keep, 0.0, -np.inf)


def model(t, kind, scale, mask):
    """The layer as an ONNX model, X [B, t, E] -> logits [B, t, E]."""
    inits, nodes = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(array, name))
        return name

    rng = np.random.default_rng(t)
    kv = KV_HEADS if kind == "gqa" else H  # K and V heads
    for w, width in (("Wq", E), ("Wk", kv * D), ("Wv", kv * D)):
        const(w, (rng.standard_normal((E, width)) / np.sqrt(E)).astype(np.float32))
    const("split", np.array([B, t, H, D], dtype=np.int64))
    const("merge", np.array([B, t, E], dtype=np.int64))
    const("scale", np.array(scale, dtype=np.float32))
    const("minus_inf", np.array(-np.inf, dtype=np.float32))
    if kind != "gqa":
        for w, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            nodes += [helper.make_node("MatMul", ["X", "W" + w], [w + "_lin"]),
                      helper.make_node("Reshape", [w + "_lin", "split"], [w + "_heads"]),
                      helper.make_node("Transpose", [w + "_heads"], [w + "_t"], perm=perm)]
    else:  # K and V heads repeated to Q's as transformers' repeat_kv writes it: Unsqueeze, Expand, Reshape
        const("split_kv", np.array([B, t, kv, D], dtype=np.int64))
        const("axis2", np.array([2], dtype=np.int64))
        const("repeat", np.array([B, kv, H // kv, t, D], dtype=np.int64))
        const("all_heads", np.array([B, H, t, D], dtype=np.int64))
        nodes += [helper.make_node("MatMul", ["X", "Wq"], ["q_lin"]),
                  helper.make_node("Reshape", ["q_lin", "split"], ["q_heads"]),
                  helper.make_node("Transpose", ["q_heads"], ["q_t"], perm=[0, 2, 1, 3])]
        for w in ("k", "v"):
            nodes += [helper.make_node("MatMul", ["X", "W" + w], [w + "_lin"]),
                      helper.make_node("Reshape", [w + "_lin", "split_kv"], [w + "_heads"]),
                      helper.make_node("Transpose", [w + "_heads"], [w + "_kv"], perm=[0, 2, 1, 3]),
                      helper.make_node("Unsqueeze", [w + "_kv", "axis2"], [w + "_5d"]),
                      helper.make_node("Expand", [w + "_5d", "repeat"], [w + "_rep"]),
                      helper.make_node("Reshape", [w + "_rep", "all_heads"], [w + "_all"])]
        nodes += [helper.make_node("Transpose", ["k_all"], ["k_t"], perm=[0, 1, 3, 2]),
                  helper.make_node("Identity", ["v_all"], ["v_t"])]
    nodes += [helper.make_node("MatMul", ["q_t", "k_t"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["s_scaled"])]
    scores = "s_scaled"
    if kind == "float":
        nodes.append(helper.make_node("Add", [scores, const("mask", mask)], ["s_masked"]))
        scores = "s_masked"
    elif kind in ("causal", "bool", "gqa"):
        nodes.append(helper.make_node("Where", [const("mask", mask), scores, "minus_inf"], ["s_masked"]))
        scores = "s_masked"
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v_t"], ["y"]),
              helper.make_node("Transpose", ["y"], ["y_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["y_t", "merge"], ["logits"])]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [B, t, E])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [B, t, E])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def reference(m, x, target, mask, scale, dtype):
    """(loss, {W: grad}) in torch at dtype."""
    w = {i.name: torch.tensor(numpy_helper.to_array(i), dtype=dtype, requires_grad=True)
         for i in m.graph.initializer if i.name in ("Wq", "Wk", "Wv")}
    xt = torch.tensor(x, dtype=dtype)
    t = x.shape[1]

    def heads(a):  # [B, t, heads x D] -> [B, H, t, D], K and V heads repeated where there are fewer
        n = a.shape[-1] // D
        return a.reshape(B, t, n, D).transpose(1, 2).repeat_interleave(H // n, dim=1)

    q, k, v = heads(xt @ w["Wq"]), heads(xt @ w["Wk"]), heads(xt @ w["Wv"])
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s + torch.tensor(mask, dtype=dtype)
    y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, t, E)
    loss = torch.nn.functional.cross_entropy(y.reshape(-1, E), torch.tensor(target.reshape(-1)))
    loss.backward()
    return float(loss), {n: p.grad.numpy() for n, p in w.items()}


def pipetrain(args, *argv):
    res = subprocess.run([args.pipetrain, *argv], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"pipetrain {argv[0]} failed: {(res.stderr or res.stdout).strip()[:400]}")
    return res.stdout


def worst(have, want):
    """Relative to each gradient's largest magnitude, or to 1e-2 of the case's largest gradient where
    a gradient is smaller: dWq and dWk at T = 1 are zero in exact arithmetic (softmax over one key
    is constant), and float32 rounding leaves about 1e-8 of the largest gradient there (1.5e-8
    under ASan's build), which a floor of 1e-4 of it held to 1e-8, below float32's resolution."""
    floor = 1e-2 * max(float(np.max(np.abs(g))) for g in want.values())
    return max(float(np.max(np.abs(have[n] - want[n]))) / max(float(np.max(np.abs(want[n]))), floor) for n in want)


def check(args, t, kind, tmp):
    rng = np.random.default_rng(1000 + t)
    scale = 1.0 / np.sqrt(D)
    graph_mask, torch_mask = masks(kind, t, rng)
    m = model(t, kind, scale, graph_mask)
    path = os.path.join(tmp, f"attention_{kind}_{t}.onnx")
    onnx.save(m, path)
    attention = json.loads(pipetrain(args, "inspect", path, "--json", "--fuse-attention-from", "1")).get("attention", [])
    if len(attention) != 1 or not attention[0].startswith("fused"):
        return f"not fused: {attention}", None
    if kind == "gqa" and f"{H} heads on {KV_HEADS} K/V head" not in attention[0]:
        return f"fused with K and V repeated per head: {attention[0]}", None
    x = rng.standard_normal((B, t, E)).astype(np.float32)
    target = rng.integers(0, E, (B, t)).astype(np.int64)
    np.save(os.path.join(tmp, "x.npy"), x)
    np.save(os.path.join(tmp, "t.npy"), target)
    out = os.path.join(tmp, f"grad_{kind}_{t}")
    pipetrain(args, "grad", path, "-i", f"X={os.path.join(tmp, 'x.npy')}", "--target", os.path.join(tmp, "t.npy"),
              "--threads", "2", "--fuse-attention-from", "1", "--output", out)
    loss = float(np.load(os.path.join(out, "loss.npy")))
    grads = {n: np.load(os.path.join(out, npy_file_name(n))) for n in ("Wq", "Wk", "Wv")}
    want_loss, want = reference(m, x, target, torch_mask, scale, torch.float64)
    _, single = reference(m, x, target, torch_mask, scale, torch.float32)
    noise = worst(single, want)
    if noise > args.tol / 10:
        return f"float32 torch is {noise:.2g} from float64: too ill-conditioned for {args.tol}", None
    err = max(worst(grads, want), abs(loss - want_loss) / max(1.0, abs(want_loss)))
    return (None if err <= args.tol else f"relative error {err:.3g} > {args.tol}"), err


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pipetrain", required=True)
    p.add_argument("--tol", type=float, default=1e-4)
    args = p.parse_args()
    torch.manual_seed(0)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, lengths in (("causal", (1, 2, 33, 64, 65, 130, 1024)), ("float", (7, 100)), ("bool", (9, 70)),
                              ("none", (5, 257)), ("gqa", (3, 129))):
            for t in lengths:
                try:
                    err, value = check(args, t, kind, tmp)
                except RuntimeError as e:
                    err, value = str(e), None
                case = f"{kind} T={t}" + (f" (worst relative error {value:.1e})" if value is not None else "")
                results.append((case, err))
    return report(results)


if __name__ == "__main__":
    sys.exit(main())
