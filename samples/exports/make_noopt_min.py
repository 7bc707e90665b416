#!/usr/bin/env python3
"""A tiny fixture exported as users are told to export for training: the default exporter with
its optimizer off (`torch.onnx.export(..., dynamo=True, optimize=False)`), so that every
parameter keeps its own initializer (the optimizer merges initializers of equal value, such as
LayerNorm weights at their init) but the file keeps the nodes the optimizer would remove.

Run once, in the export venv of make_exports.py (CI uses the committed files):

    .venv-export/bin/python samples/exports/make_noopt_min.py --out samples/exports

It writes tiny_noopt_min.onnx (weights inline, opset 20, under 200 KB) and tiny_noopt_min.npz,
the reference make_exports.py writes for its fixtures (a held-out probe and the module's output
on it, and 3 steps of float64 SGD with momentum over 2 micro-batches of 2), so that
tests/oracle/exports_vs_torch.py checks it like the others. The module is a one-block
transformer over float features, small enough to read, that exercises what optimize=False leaves
in a file: torch.split as SplitToSequence + SequenceAt (an even split of the fused QKV and an
uneven one), CastLike (the attention scale, scalar constants met with tensors), Constant,
Identity, views whose shapes are Concats of Shape pieces, Range (a position ramp), and the
reduction axes of mean() computed by a Reshape of Constants. No parameter is jittered: with the
optimizer off nothing is merged.
"""

import argparse
import collections
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_exports import BATCH, MICRO, STEPS, Logits, file_parameters, reference  # noqa: E402

warnings.filterwarnings("ignore")

NAME = "tiny_noopt_min"
T, C, HEADS, CLASSES = 8, 12, 2, 5


class Tiny(nn.Module):
    """x: (B, T, C) float features -> (B, CLASSES) logits."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.norm2 = nn.LayerNorm(C)
        self.head = nn.Linear(7, CLASSES)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(x)).split(c, dim=-1)            # SplitToSequence, 3 parts

        def heads(z):                                                   # (B, HEADS, T, C/HEADS)
            return z.view(b, t, HEADS, c // HEADS).transpose(1, 2)

        a = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        h = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        h = self.norm2(h) + torch.arange(t, dtype=h.dtype).unsqueeze(-1) / t
        p1, _, p3 = h.split(5, dim=-1)                                  # 5 + 5 + 2: uneven
        g = torch.cat([p1 * 0.5, p3], dim=-1).mean(dim=1)               # (B, 7)
        return self.head(torch.tanh(g))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Tiny()
    wrapped = Logits(model).eval()
    n = STEPS * MICRO * BATCH
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, T, C)).astype(np.float32)
    y = rng.integers(0, CLASSES, (n,)).astype(np.int64)
    probe = np.random.default_rng(3).standard_normal((BATCH, T, C)).astype(np.float32)
    path = os.path.join(args.out, f"{NAME}.onnx")
    torch.onnx.export(wrapped, (torch.from_numpy(x[:BATCH]),), path, input_names=["input"],
                      output_names=["output"], dynamic_shapes=({0: torch.export.Dim("batch")},),
                      dynamo=True, optimize=False, external_data=False)
    start = {k: v.detach().clone() for k, v in wrapped.state_dict().items()}
    with torch.no_grad():
        probe_out = Logits(model).double().eval()(torch.from_numpy(probe).double()).numpy()
    model.float()
    wrapped.load_state_dict(start)
    held = file_parameters(path, wrapped)
    losses, params, buffers = reference(model, held, x, y)
    arrays = {"x": x, "y": y, "probe": probe, "probe_out": probe_out.astype(np.float32),
              "losses": np.array(losses),
              "module_params": np.array([k for k, _ in wrapped.named_parameters()])}
    arrays.update({f"param.{k}": v for k, v in params.items()})
    arrays.update({f"buffer.{k}": v for k, v in buffers.items()})
    np.savez_compressed(os.path.join(args.out, f"{NAME}.npz"), **arrays)

    import onnx
    ops = collections.Counter(node.op_type for node in onnx.load(path).graph.node)
    print(f"{path}: {os.path.getsize(path)} bytes, {len(params)} parameters; losses "
          f"{', '.join(f'{v:.4f}' for v in losses)}")
    print("  " + ", ".join(f"{k}={v}" for k, v in sorted(ops.items())))


if __name__ == "__main__":
    sys.exit(main())
