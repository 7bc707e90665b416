#!/usr/bin/env python3
"""Fixtures for float16 and bfloat16 weights: a tiny language model as PyTorch exports it after
`.half()` and `.to(torch.bfloat16)`, and a PyTorch reference of its training in float32.

Run once, in .venv-export (PyTorch; scripts/export_venv.sh makes it; CI does not need it, the
files it makes are committed):

    .venv-export/bin/python samples/half/make_half.py --out samples/half
    .venv-export/bin/python samples/half/make_half.py --rounding   # prints core_test's table

It writes, under --out:
  tiny_fp16.onnx (+ .data)   torch.onnx.export(module.half(), (x,), path) with no flags: the
  tiny_bf16.onnx (+ .data)   torch.export-based exporter, opset 20, external data for the larger
                             weights, every value and op in the half type, and Casts to float32 and
                             back where the module computes in float32 (its RMSNorm and softmax,
                             as Hugging Face's models do); the metadata pipetrain does not read
                             is left out (drop_unread_metadata)
  x.npy, y.npy               12 samples of 4 tokens and their targets: 3 steps of 2 micro-batches
                             of 2
  reference.npz              PyTorch's training of the float32 module holding the widened weights
                             (`module.half().float()`, the same values for both files: the weights
                             are drawn as bfloat16 values inside float16's normal range, so both
                             half types hold them exactly): 3 steps of SGD, lr LR, momentum
                             MOMENTUM, the mean cross-entropy over each global batch, gradients
                             accumulated micro-batch by micro-batch. `state.<key>` each trained
                             parameter (float32) by state_dict key, `update.<key>` its largest
                             change max|trained - start|, `losses` per step.
Dropout none. tests/oracle/half_weights.py trains the half files with pipetrain, against their
float32 widening (which it makes with the onnx package alone), the reference and onnxruntime.
"""

import argparse
import os

import numpy as np
import torch
import torch.nn as nn

VOCAB, D, SEQ, HIDDEN = 16, 8, 4, 32  # HIDDEN: a GPT MLP's 4 x D
STEPS, MICRO, BATCH, LR, MOMENTUM = 3, 2, 2, 0.1, 0.9


class RMSNorm(nn.Module):
    """As Hugging Face's Llama writes it: the statistics in float32, the result in the input's dtype."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class TinyLM(nn.Module):
    """Embedding, one pre-norm block (causal single-head attention with its softmax in float32, a
    GELU MLP), a final norm and an LM head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.norm1 = RMSNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.norm2 = RMSNorm(D)
        self.fc = nn.Linear(D, HIDDEN)
        self.out = nn.Linear(HIDDEN, D)
        self.norm3 = RMSNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.register_buffer("causal", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)), persistent=False)

    def forward(self, idx):
        x = self.embed(idx)
        q, k, v = self.qkv(self.norm1(x)).split(D, dim=-1)
        scores = (q @ k.transpose(-1, -2)) * D ** -0.5
        scores = scores.masked_fill(~self.causal, float("-inf"))
        attn = torch.softmax(scores.to(torch.float32), dim=-1).to(q.dtype)
        x = x + self.proj(attn @ v)
        x = x + self.out(nn.functional.gelu(self.fc(self.norm2(x))))
        return self.head(self.norm3(x))


def module():
    """The module with weights every half type holds exactly: bfloat16 values (8 significant
    bits) of magnitude 2^-14 (float16's least normal) or more, or zero."""
    torch.manual_seed(0)
    m = TinyLM()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms and biases not all equal: no merging
            b = p.to(torch.bfloat16).to(torch.float32)
            p.copy_(torch.where(b.abs() < 2.0 ** -14, torch.zeros_like(b), b))
    return m


def data():
    rng = np.random.default_rng(0)
    n = STEPS * MICRO * BATCH
    return (rng.integers(0, VOCAB, (n, SEQ)).astype(np.int64), rng.integers(0, VOCAB, (n, SEQ)).astype(np.int64))


def drop_unread_metadata(path):
    """Most of a small export's bytes are metadata pipetrain does not read: each node's Python
    stack, class hierarchy and namespace, and the value infos of intermediate values (import
    infers every type). The node's FX record and name scopes and the value infos that mark
    parameters stay (onnx_import/module_params.h reads them)."""
    import onnx
    m = onnx.load(path, load_external_data=False)
    unread = {"pkg.torch.onnx.stack_trace", "pkg.torch.onnx.class_hierarchy", "namespace"}
    for node in m.graph.node:
        kept = [p for p in node.metadata_props if p.key not in unread]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    marked = [v for v in m.graph.value_info if len(v.metadata_props)]
    del m.graph.value_info[:]
    m.graph.value_info.extend(marked)
    onnx.save(m, path)


def export(m, dtype, path):
    x = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    torch.onnx.export(m.to(dtype).eval(), (x,), path, input_names=["input"], output_names=["output"], dynamo=True)
    drop_unread_metadata(path)


def reference(x, y):
    """SGD with momentum over micro-batches on the float32 module holding the widened weights."""
    m = module().to(torch.float16).to(torch.float32)
    start = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
    losses, per_step = [], MICRO * BATCH
    for s in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for mb in range(MICRO):
            at = s * per_step + mb * BATCH
            logits = m(torch.from_numpy(x[at:at + BATCH]))
            target = torch.from_numpy(y[at:at + BATCH])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1)) / MICRO
            loss.backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total)
    arrays = {"state." + k: v.detach().numpy() for k, v in m.state_dict().items()}
    arrays.update({"update." + k: np.max(np.abs(arrays["state." + k] - v)) for k, v in start.items()})
    arrays["losses"] = np.array(losses)
    return arrays


def rounding_table():
    """core_test's cases: float32 bit patterns and torch's float16 and bfloat16 rounding of each."""
    u = np.array([0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x47C35000,
                  0x7F800000, 0xFF800000, 0x38800000, 0x387FFFFF, 0x33800000, 0x33000000, 0x33000001, 0x33C00000,
                  0x34400000, 0x3F801000, 0x3F803000, 0x3F801001, 0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF,
                  0x00000001, 0xBEAAAAAB, 0x3DCCCCCD, 0x42F6E979], dtype=np.uint32)
    f = torch.from_numpy(u.view(np.float32).copy())
    h = f.half().view(torch.int16).numpy().view(np.uint16)
    b = f.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    for bits, fp16, bf16, v in zip(u, h, b, u.view(np.float32)):
        print(f"      {{0x{bits:08x}, 0x{fp16:04x}, 0x{bf16:04x}}},  // {v:.9g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--rounding", action="store_true", help="print core_test's rounding table and stop")
    args = ap.parse_args()
    if args.rounding:
        return rounding_table()
    os.makedirs(args.out, exist_ok=True)
    for dtype, name in [(torch.float16, "fp16"), (torch.bfloat16, "bf16")]:
        path = os.path.join(args.out, f"tiny_{name}.onnx")
        export(module(), dtype, path)
    x, y = data()
    np.save(os.path.join(args.out, "x.npy"), x)
    np.save(os.path.join(args.out, "y.npy"), y)
    np.savez_compressed(os.path.join(args.out, "reference.npz"), **reference(x, y))


if __name__ == "__main__":
    main()
