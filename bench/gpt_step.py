#!/usr/bin/env python3
"""GPT training steps on the CPU against PyTorch 2.15 eager and torch.compile (issue 43's Show).

Two modules made by the torch of the export venv and exported as its users export them,
torch.onnx.export(model, (x,), path) (the default exporter: opset 20, external data):

  - nanogpt: nanoGPT's model (token and position embeddings, pre-LayerNorm blocks with
    F.scaled_dot_product_attention(is_causal=True), a GELU MLP, the LM head tied to the token
    embedding) at d 384, 6 layers of 6 heads, context 1024, vocab 4096; 4 micro-batches of 2.
  - gpt2: GPT-2 small, transformers' GPT2LMHeadModel (124M, tied head) from its default config
    with use_cache=False and no dropout, its logits as the output; context 1024, 4 micro-batches
    of 1.

Every contender trains the same initial weights on the same batches (random token ids, the same
.npy files): the loss the mean cross-entropy over the global batch, AdamW (lr 6e-4, betas
(0.9, 0.95), weight decay 0.1), gradients clipped at norm 1.0, --threads threads:

  - eager: forward and backward of each micro-batch (gradient accumulation), clipping, AdamW.
  - compile: the same with the module under torch.compile (the steps that compile are not timed).
  - pipetrain 1 stage (--threads threads), and for gpt2 4 stages (1f1b, one thread each).

They take turns (eager, compile, pipetrain, ..., eager, ...), each turn a fresh process training
--steps steps; a turn's time is the median of its steps after the first (after the two first for
compile), the table's the median over --rounds turns with the least and the most in brackets.
Peak RSS is each turn's process's own (wait4's ru_maxrss), the median over the turns. pipetrain's
losses of the first steps are checked against eager's (the largest relative difference printed).

Usage, in the export venv (samples/README.md):
    .venv-export/bin/python bench/gpt_step.py [--models nanogpt,gpt2] [--rounds 3] [--steps 3]
        [--threads 2] [--no-compile] [--pipetrain build/pipetrain ...] [--out DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from machine import cpu_name  # bench/machine.py
from train import summary_of  # bench/train.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPT = {"lr": 6e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "clip": 1.0}
MODELS = {
    "nanogpt": {"context": 1024, "vocab": 4096, "micro_batch": 2, "micro_batches": 4, "stages": [1]},
    "gpt2": {"context": 1024, "vocab": 50257, "micro_batch": 1, "micro_batches": 4, "stages": [1, 4]},
}
LOSS_STEPS = 3  # pipetrain's losses checked against eager's for this many first steps


def nanogpt_module(d=384, heads=6, layers=6, vocab=4096, context=1024):
    import torch
    from torch import nn

    class NanoGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
            self.blocks = nn.ModuleList(nn.ModuleDict({
                "ln_1": nn.LayerNorm(d), "c_attn": nn.Linear(d, 3 * d), "c_proj": nn.Linear(d, d),
                "ln_2": nn.LayerNorm(d), "c_fc": nn.Linear(d, 4 * d), "mlp_proj": nn.Linear(4 * d, d)})
                for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.wte.weight
            for name, p in self.named_parameters():  # nanoGPT's initialisation
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() == 2:
                    std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                    nn.init.normal_(p, std=std)

        def forward(self, idx):
            b, t = idx.shape
            x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
            for blk in self.blocks:
                q, k, v = blk["c_attn"](blk["ln_1"](x)).split(d, dim=2)
                q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
                y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + blk["c_proj"](y.transpose(1, 2).reshape(b, t, d))
                x = x + blk["mlp_proj"](nn.functional.gelu(blk["c_fc"](blk["ln_2"](x))))
            return self.lm_head(self.ln_f(x))

    return NanoGPT()


def gpt2_module(context=1024):
    import torch
    import transformers as t
    config = t.GPT2Config(n_positions=context, use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = t.GPT2LMHeadModel(config)

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.model = m

        def forward(self, input_ids):
            return self.model(input_ids).logits

    return Logits(model)


def module(name):
    """The module, its weights seeded; the worker loads the parent's saved state over them."""
    import torch
    torch.manual_seed(0)
    return nanogpt_module() if name == "nanogpt" else gpt2_module(MODELS[name]["context"])


def prepare(name, out, steps):
    """Exports the module (the user's plain call), saves its state_dict and steps' worth of batches."""
    import numpy as np
    import onnx
    import torch
    m = MODELS[name]
    onnx_path = os.path.join(out, f"{name}.onnx")
    model = module(name).eval()
    torch.save(model.state_dict(), os.path.join(out, f"{name}.pt"))
    rng = np.random.default_rng(0)
    samples = steps * m["micro_batches"] * m["micro_batch"]
    ids = rng.integers(0, m["vocab"], (samples, m["context"] + 1))
    np.save(os.path.join(out, f"{name}_x.npy"), ids[:, :-1].astype(np.int64))
    np.save(os.path.join(out, f"{name}_y.npy"), ids[:, 1:].astype(np.int64))
    example = torch.from_numpy(ids[: m["micro_batch"], :-1].copy())
    torch.onnx.export(model, (example,), onnx_path)
    graph = onnx.load(onnx_path, load_external_data=False).graph
    return onnx_path, graph.input[0].name


def torch_worker(name, out, threads, steps, compiled):
    """In its own process: trains `steps` steps; prints the step seconds and losses."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    m = MODELS[name]
    model = module(name)
    model.load_state_dict(torch.load(os.path.join(out, f"{name}.pt")))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=OPT["lr"], betas=OPT["betas"], weight_decay=OPT["weight_decay"])
    forward = torch.compile(model) if compiled else model
    xs = torch.from_numpy(np.load(os.path.join(out, f"{name}_x.npy")))
    ys = torch.from_numpy(np.load(os.path.join(out, f"{name}_y.npy")))
    mb, n = m["micro_batch"], m["micro_batches"]
    times, losses = [], []
    for s in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        total = 0.0
        for k in range(n):
            rows = slice((s * n + k) * mb, (s * n + k + 1) * mb)
            # The logits are not held past the loss (as a training loop writes it).
            loss = F.cross_entropy(forward(xs[rows]).reshape(-1, m["vocab"]), ys[rows].reshape(-1),
                                   reduction="sum") / (n * mb * m["context"])
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPT["clip"])
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(total)
    warm = 2 if compiled else 1
    print(json.dumps({"step_s": statistics.median(times[warm:]), "losses": losses}))


class TurnFailed(Exception):
    """A contender's turn that did not finish (a pipetrain refusing for the host's memory, an OOM kill)."""


def timed(cmd, **kw):
    """Runs cmd; (stdout, its process's own peak RSS in MiB)."""
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, text=True, **kw)
        _, status, usage = os.wait4(proc.pid, 0)
        so.seek(0)
        se.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise TurnFailed(f"exit {os.waitstatus_to_exitcode(status)}: {se.read().strip()[-300:]}")
        return so.read(), usage.ru_maxrss / 1024


def torch_turn(name, out, threads, steps, compiled):
    warm = 2 if compiled else 1
    text, rss = timed([sys.executable, __file__, "--worker", name, out, str(threads), str(steps + warm - 1),
                       "1" if compiled else "0"])
    r = json.loads(text.strip().splitlines()[-1])
    return r["step_s"], rss, r["losses"]


def pipetrain_config(name, out, onnx_path, input_name, stages, threads, steps):
    m = MODELS[name]
    metrics = os.path.join(out, f"{name}_p{stages}.jsonl")
    path = os.path.join(out, f"{name}_p{stages}.yaml")
    with open(path, "w") as f:
        f.write(f"""model: {onnx_path}
dims: {{batch: {m["micro_batch"]}}}
loss: {{kind: cross_entropy}}
data: {{kind: npy, inputs: {{{input_name}: {out}/{name}_x.npy}}, targets: {out}/{name}_y.npy, shuffle: false, eval_fraction: 0}}
optimizer:
  kind: adamw
  lr: {OPT["lr"]}
  betas: [{OPT["betas"][0]}, {OPT["betas"][1]}]
  weight_decay: {OPT["weight_decay"]}
  clip_grad_norm: {OPT["clip"]}
pipeline: {{stages: {stages}, chunks: 1, micro_batches: {m["micro_batches"]}, schedule: 1f1b}}
threads: {threads if stages == 1 else max(1, threads // stages)}
steps: {steps}
eval_every: 0
checkpoint: {{dir: "", every: 0}}
output: {{model: "", metrics: {metrics}, trace: "", timeline: ""}}
""")
    return path, metrics


def pipetrain_turn(binary, config, metrics):
    if os.path.exists(metrics):
        os.remove(metrics)
    _, rss = timed([binary, "train", config, "-q"])
    losses = [json.loads(line)["loss"] for line in open(metrics) if '"loss"' in line and "summary" not in line]
    return summary_of(metrics)["step_s_median"], rss, losses


def fmt_s(xs):
    return f"{1e3 * statistics.median(xs):,.0f} ({1e3 * min(xs):,.0f}-{1e3 * max(xs):,.0f})"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        name, out, threads, steps, compiled = sys.argv[2:7]
        torch_worker(name, out, int(threads), int(steps), compiled == "1")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", nargs="+", default=[os.path.join(ROOT, "build", "pipetrain")],
                    help="one or more binaries (before and after a change), each a contender")
    ap.add_argument("--models", default="nanogpt,gpt2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--no-torch", action="store_true", help="pipetrain only (eager's losses still checked once)")
    ap.add_argument("--out", help="keep the exports, batches and configs here (default: a fresh temporary folder)")
    a = ap.parse_args()
    import torch
    out = os.path.abspath(a.out or tempfile.mkdtemp(prefix="pt_bench_gpt_step_"))
    os.makedirs(out, exist_ok=True)
    print(f"{cpu_name()}; {os.cpu_count()} cores; PyTorch {torch.__version__} "
          f"(CPU capability {torch.backends.cpu.get_cpu_capability()}); {a.threads} threads; "
          f"load average {os.getloadavg()[0]:.2f} at the start\n", flush=True)
    rows = []
    for name in a.models.split(","):
        steps = max(a.steps, LOSS_STEPS)
        onnx_path, input_name = prepare(name, out, steps + 1)
        arms = {}
        if not a.no_torch:
            arms["PyTorch eager"] = lambda: torch_turn(name, out, a.threads, steps, False)
            if not a.no_compile:
                arms["torch.compile"] = lambda: torch_turn(name, out, a.threads, steps, True)
        for i, binary in enumerate(a.pipetrain):
            tag = "" if len(a.pipetrain) == 1 else f" [{i}: {binary}]"
            for stages in MODELS[name]["stages"]:
                cfg = pipetrain_config(name, out, onnx_path, input_name, stages, a.threads, steps)
                arms[f"pipetrain {stages} stage{'s' if stages > 1 else ''}{tag}"] = (
                    lambda b=binary, c=cfg: pipetrain_turn(b, *c))
        results = {k: [] for k in arms}
        failed = {}
        for _ in range(a.rounds):
            for k, turn in arms.items():
                try:
                    results[k].append(turn())
                except TurnFailed as e:  # reported in the table; the other contenders go on
                    failed[k] = str(e)
                    print(f"  {name} {k}: failed, {e}", flush=True)
                    continue
                print(f"  {name} {k}: {1e3 * results[k][-1][0]:,.0f} ms, {results[k][-1][1]:,.0f} MiB", flush=True)
        eager = results.get("PyTorch eager")
        eager_losses = eager[0][2] if eager else torch_turn(name, out, a.threads, LOSS_STEPS, False)[2]
        eager_ms = statistics.median(r[0] for r in eager) if eager else None
        eager_rss = statistics.median(r[1] for r in eager) if eager else None
        for k, rs in results.items():
            if not rs:
                rows.append((name, k, "failed: " + failed[k].replace("|", "/"), "-", "-", "-", "-", "-"))
                continue
            step = statistics.median(r[0] for r in rs)
            rss = statistics.median(r[1] for r in rs)
            losses = rs[0][2][:LOSS_STEPS]
            diff = max(abs(x - y) / abs(y) for x, y in zip(losses, eager_losses[:LOSS_STEPS]))
            rows.append((name, k, fmt_s([r[0] for r in rs]), f"{step / eager_ms:.2f}" if eager_ms else "-",
                         f"{rss:,.0f}", f"{rss / eager_rss:.2f}" if eager_rss else "-", f"{diff:.1e}",
                         ", ".join(f"{x:.4f}" for x in losses)))
    print("\n| model | contender | step ms | / eager | peak RSS MiB | / eager | loss vs eager (first "
          f"{LOSS_STEPS} steps, largest relative difference) | losses |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\n(medians over {a.rounds} turns of {max(a.steps, LOSS_STEPS)} steps, least-most in brackets; "
          f"load average {os.getloadavg()[0]:.2f} at the end; files in {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
