#!/usr/bin/env python3
"""charlm: a small GPT-style byte-level language model, pipetrain's main training sample.

Run with Debian's python (torch 1.13):

    /usr/bin/python3 samples/charlm/make_charlm.py                 # writes samples/charlm/charlm.onnx
    /usr/bin/python3 samples/charlm/make_charlm.py --train-check   # the same model trained in torch

The model: token = byte (vocab 256), context 64, learned positions, 4 pre-LayerNorm blocks
(causal self-attention with 4 heads, GELU MLP of 4 x d), a final LayerNorm and an untied LM head.
The blocks are the ones samples/export_samples.py uses for the gpt sample: the causal mask is one
float initializer `mask` [1,1,64,64] (lower-triangular ones; sliced, compared with 0 and turned into
-1e9 by Where in every block), so train.yaml lists it under parameters.frozen.

--train-check trains a fresh copy of the same model in torch with train.yaml's hyperparameters and
batching (8 micro-batches of 8 windows, the loss the mean over the whole global batch, AdamW with
linear warm-up and cosine decay as train/optimizer.h defines it, the data split and windows of
pipetrain's tokens loader) and prints the train loss and the held-out loss along the way. It is the
reference for what `pipetrain train samples/charlm/train.yaml` should reach; the numbers are in
README.md.
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from export_samples import PreLNBlock, _perturb_layernorms  # noqa: E402  (samples/)

OPSET = 17
VOCAB = 256

# The hyperparameters train.yaml uses; --train-check reads them from here, so keep both in step.
CONFIG = dict(context=64, d_model=64, heads=4, layers=4,
              micro_batch=8, micro_batches=8, eval_fraction=0.1,
              lr=3e-3, min_lr=3e-4, warmup=20, weight_decay=0.01, betas=(0.9, 0.95),
              clip=1.0, steps=400, eval_every=50)


class CharLM(nn.Module):
    def __init__(self, context, d_model, heads, layers):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        # One causal mask shared by every block: [1, 1, T, T], 1 = may attend.
        self.register_buffer("mask", torch.tril(torch.ones(context, context)).view(1, 1, context, context))
        self.blocks = nn.ModuleList([PreLNBlock(d_model, heads, 4 * d_model) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, VOCAB, bias=False)
        for m in self.modules():  # GPT-2's weights; biases keep torch's random init (zeros would be
            if isinstance(m, (nn.Linear, nn.Embedding)):  # deduped into one tied tensor by the export)
                nn.init.normal_(m.weight, std=0.02)
        _perturb_layernorms(self)

    def forward(self, idx):  # idx: (B, T) int64 -> logits (B, T, 256)
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.lm_head(self.ln_f(x))


def make_model(seed=0):
    torch.manual_seed(seed)
    c = CONFIG
    return CharLM(c["context"], c["d_model"], c["heads"], c["layers"])


def export(path):
    model = make_model().eval()
    example = torch.randint(0, VOCAB, (2, CONFIG["context"]), dtype=torch.long)
    torch.onnx.export(model, (example,), path, export_params=True, opset_version=OPSET,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                      do_constant_folding=True)
    n = sum(p.numel() for p in model.parameters())
    print("wrote %s: %d parameters, %d bytes" % (path, n, os.path.getsize(path)))


# --- the torch reference run -----------------------------------------------------------------

def windows(data, T):
    """pipetrain's tokens loader: sample i = bytes [i*T, i*T+T) -> next bytes [i*T+1, i*T+T+1)."""
    n = (len(data) - 1) // T
    x = torch.stack([data[i * T:i * T + T] for i in range(n)])
    y = torch.stack([data[i * T + 1:i * T + T + 1] for i in range(n)])
    return x, y


def lr_at(t, total):
    """train/optimizer.h: linear warm-up from lr / warmup at step 0 to lr at step warmup - 1, then
    cosine to min_lr at step total - 1."""
    c = CONFIG
    if t < c["warmup"]:
        return c["lr"] * (t + 1) / c["warmup"]
    q = min(1.0, (t - c["warmup"]) / max(1, total - 1 - c["warmup"]))
    r = c["min_lr"] / c["lr"]
    return c["lr"] * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * q)))


def train_check(text_path, steps, seed, threads):
    c = CONFIG
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    data = torch.tensor(list(open(text_path, "rb").read()), dtype=torch.long)
    x, y = windows(data, c["context"])
    n_eval = int(round(c["eval_fraction"] * len(x)))  # the last samples are held out
    n_train = len(x) - n_eval
    xt, yt, xe, ye = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
    print("%s: %d bytes -> %d windows of %d: %d train, %d held out"
          % (text_path, len(data), len(x), c["context"], n_train, n_eval))

    model = make_model(seed)
    model.train()
    params = [p for p in model.parameters()]  # the mask is a buffer, not a parameter
    opt = torch.optim.AdamW(params, lr=c["lr"], betas=c["betas"], eps=1e-8,
                            weight_decay=c["weight_decay"], foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: lr_at(t, steps) / c["lr"])

    def evaluate():
        model.eval()
        with torch.no_grad():
            rows = c["micro_batch"]
            losses = [F.cross_entropy(model(xe[i:i + rows]).reshape(-1, VOCAB), ye[i:i + rows].reshape(-1))
                      for i in range(0, len(xe) - rows + 1, rows)]  # a partial last batch is dropped
        model.train()
        return float(torch.stack(losses).mean())

    B, M = c["micro_batch"], c["micro_batches"]
    stream, epoch = [], 0
    g = torch.Generator().manual_seed(seed)
    print("step %4d  eval %.4f" % (0, evaluate()))
    t0 = time.time()
    for step in range(steps):
        while len(stream) < B * M:  # whole epochs, each freshly shuffled
            stream += torch.randperm(n_train, generator=g).tolist()
            epoch += 1
        idx, stream = stream[:B * M], stream[B * M:]
        opt.zero_grad()
        total = 0.0
        for m in range(M):  # micro-batch m: rows [m*B, (m+1)*B); loss = mean over the global batch
            rows = idx[m * B:(m + 1) * B]
            logits = model(xt[rows])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), yt[rows].reshape(-1), reduction="sum")
            loss = loss / (B * M * c["context"])
            loss.backward()
            total += float(loss)
        torch.nn.utils.clip_grad_norm_(params, c["clip"])
        opt.step()
        sched.step()
        line = "step %4d  train %.4f  lr %.2e" % (step + 1, total, lr_at(step, steps))
        if c["eval_every"] and (step + 1) % c["eval_every"] == 0 or step + 1 == steps:
            line += "  eval %.4f" % evaluate()
        print(line, flush=True)
    print("%d steps in %.1f s (torch, %d threads), %d epochs" % (steps, time.time() - t0, threads, epoch))
    raw = open(text_path, "rb").read()
    start = max(n_train * c["context"], raw.find(b"If the disclaimer", n_train * c["context"]))
    sample(model, data[start:start + 40])  # held out, and (unlike its start) not in capitals


def sample(model, prompt, n=200):
    """Greedy continuation of a held-out prompt, to see what the model learned."""
    model.eval()
    T = CONFIG["context"]
    idx = prompt.tolist()
    with torch.no_grad():
        for _ in range(n):
            ctx = torch.tensor([idx[-T:]])
            idx.append(int(model(ctx)[0, -1].argmax()))
    print("greedy continuation of a held-out prompt:")
    print(bytes(idx).decode("latin-1"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "charlm.onnx"))
    ap.add_argument("--train-check", action="store_true", help="train the model in torch and print the losses")
    ap.add_argument("--text", default=os.path.join(HERE, "gpl3.txt"))
    ap.add_argument("--steps", type=int, default=CONFIG["steps"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="--train-check: change a CONFIG entry (lr, weight_decay, warmup, ...)")
    args = ap.parse_args()
    for kv in args.set:
        k, v = kv.split("=", 1)
        if k not in CONFIG or isinstance(CONFIG[k], tuple):
            ap.error("--set: no scalar CONFIG entry %r" % k)
        CONFIG[k] = type(CONFIG[k])(v)
    if args.train_check:
        train_check(args.text, args.steps, args.seed, args.threads)
    else:
        export(args.out)


if __name__ == "__main__":
    main()
