#!/usr/bin/env python3
"""GPU training step against PyTorch eager on the same GPU, and the fraction of the GPU's peak.

The charlm model (samples/charlm/make_charlm.py: pre-LayerNorm GPT blocks, learned positions,
byte vocabulary, untied LM head) at each size of --sizes (d_model x layers x context), exported
from the module with the exporter of the torch at hand (opset 17, TorchScript exporter where it
exists, else the default one). One step = 8 micro-batches of 8 sequences, forward and backward,
gradient clipping and AdamW, as the CPU benchmark (bench/train.py) measures it:

  - PyTorch eager on the GPU, fp32 (TF32 off) and bf16 autocast; median of the steps after the
    warm-up ones (torch.cuda.synchronize around each step);
  - `pipetrain train` with device: cuda at 1 stage, precision fp32 and bf16 (the step time it
    reports: the median of its steps after the first), and of that the schedule's span (its
    measured makespan: forward and backward of every micro-batch); the rest of the step is the
    work after the schedule (gradients brought to the host, their norm, the optimizer, the
    parameters sent back).

FLOP/s: the model's training FLOPs per step counted in closed form (3 x the forward's
multiply-adds x 2: every Linear, the LM head, and the attention's two T x T products per head),
over the step time, against the GPU's dense peak for that precision (--peak-fp32, --peak-bf16;
defaults: the H100/H200 SXM data-sheet figures, 67 and 989 TFLOP/s).

Usage (on the GPU machine, from the repository root):
  python3 bench/gpu_train.py --pipetrain PATH [--sizes 64x4x64,1024x4x256] [--steps 8] [--profile]
Prints a Markdown table; --json FILE writes the rows too.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "samples", "charlm"))
import make_charlm  # noqa: E402
from train import summary_of  # noqa: E402  (bench/train.py)

MICRO_BATCH, MICRO_BATCHES, VOCAB = 8, 8, 256


def parse_size(text):
    d, layers, context = (int(v) for v in text.split("x"))
    return d, layers, context


def make_model(d, layers, context):
    torch.manual_seed(0)
    return make_charlm.CharLM(context, d, max(1, d // 64) if d >= 256 else 4, layers)


def export(model, context, path):
    example = torch.randint(0, VOCAB, (2, context), dtype=torch.long)
    kwargs = dict(export_params=True, opset_version=17, input_names=["input"], output_names=["output"],
                  dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    try:
        torch.onnx.export(model.eval(), (example,), path, dynamo=False, do_constant_folding=True, **kwargs)
        return "TorchScript exporter"
    except Exception as e:  # the TorchScript exporter is gone from this torch
        print(f"  (TorchScript export failed: {str(e).splitlines()[0][:120]}; using the default exporter)")
        torch.onnx.export(model.eval(), (example,), path, dynamo=True, **kwargs)
        return "default exporter"


def train_flops(d, layers, context):
    """Training FLOPs of one step: forward multiply-adds x 2 x 3 (forward, input and weight grads)."""
    tokens = MICRO_BATCH * MICRO_BATCHES * context
    per_token = layers * (12 * d * d + 2 * context * d) + d * VOCAB  # multiply-adds
    return 6 * per_token * tokens


def torch_step(model, context, steps, bf16):
    dev = torch.device("cuda")
    model = model.to(dev).train()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    xs = torch.randint(0, VOCAB, (MICRO_BATCHES, MICRO_BATCH, context), generator=g).to(dev)
    ys = torch.randint(0, VOCAB, (MICRO_BATCHES, MICRO_BATCH, context), generator=g).to(dev)
    times = []
    for _ in range(steps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        for m in range(MICRO_BATCHES):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                logits = model(xs[m])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), ys[m].reshape(-1)) / MICRO_BATCHES
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def pipetrain_step(binary, onnx_path, out, steps, precision, profile=False):
    metrics = os.path.join(out, f"metrics_{precision}.jsonl")
    cfg = os.path.join(out, "gpu_train.yaml")
    with open(cfg, "w") as f:
        f.write(f"""model: {onnx_path}
dims: {{batch: {MICRO_BATCH}}}
loss: {{kind: cross_entropy, output: output}}
data: {{kind: synthetic, samples: {MICRO_BATCH * MICRO_BATCHES * 4}, shuffle: false}}
optimizer: {{kind: adamw, lr: 1.0e-4, betas: [0.9, 0.95], weight_decay: 0.01, clip_grad_norm: 1.0}}
pipeline: {{stages: 1, chunks: 1, micro_batches: {MICRO_BATCHES}, schedule: 1f1b}}
parameters: {{frozen: [mask]}}
device: cuda
precision: {precision}
seed: 0
steps: {steps}
output: {{metrics: {metrics}}}
""")
    r = subprocess.run([binary, "train", cfg, "-q"] + (["--profile"] if profile else []), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"pipetrain train ({precision}) exited {r.returncode}: "
                           + (r.stderr.strip().splitlines() or ["?"])[-1])
    if profile:
        lines = r.stdout.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("kernel time per step")), len(lines))
        print("\n".join(lines[start:]))
    summary = summary_of(metrics)
    return summary["step_s_median"], summary["measured_makespan_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--sizes", default="64x4x64,1024x4x256")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--peak-fp32", type=float, default=67e12)
    ap.add_argument("--peak-bf16", type=float, default=989e12)
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true",
                    help="then pipetrain's --profile of the last size (fp32 and bf16): where its step's time goes")
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="pt_gpu_train_")
    gpu = torch.cuda.get_device_name(0)
    print(f"## training step on {gpu}: pipetrain (1 stage, device: cuda) against PyTorch {torch.__version__} eager\n")
    print("| model (d x layers x context) | precision | PyTorch eager ms | pipetrain ms | pipetrain / PyTorch "
          "| pipetrain TFLOP/s (of peak) | PyTorch TFLOP/s (of peak) | pipetrain schedule ms |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for text in a.sizes.split(","):
        d, layers, context = parse_size(text)
        path = os.path.join(out, f"charlm_{text}.onnx")
        how = export(make_model(d, layers, context), context, path)
        flops = train_flops(d, layers, context)
        for precision in ("fp32", "bf16"):
            peak = a.peak_fp32 if precision == "fp32" else a.peak_bf16
            row = {"size": text, "precision": precision, "exporter": how, "train_flops": flops}
            try:
                row["torch_s"] = torch_step(make_model(d, layers, context), context, a.steps, precision == "bf16")
            except Exception as e:  # noqa: BLE001  (report and go on)
                row["torch_error"] = str(e).splitlines()[0]
            try:
                row["pipetrain_s"], row["schedule_s"] = pipetrain_step(a.pipetrain, path, out, a.steps + 1, precision)
            except Exception as e:  # noqa: BLE001
                row["pipetrain_error"] = str(e)
            rows.append(row)

            def cell(key):
                if key not in row:
                    return "error: " + row.get(key.replace("_s", "_error"), "?")[:80]
                return f"{1e3 * row[key]:.2f}"

            def rate(key):
                return f"{flops / row[key] / 1e12:.1f} ({100 * flops / row[key] / peak:.0f}%)" if key in row else "-"

            ratio = f"{row['pipetrain_s'] / row['torch_s']:.2f}" if "pipetrain_s" in row and "torch_s" in row else "-"
            print(f"| {d} x {layers} x {context} | {precision} | {cell('torch_s')} | {cell('pipetrain_s')} | {ratio} "
                  f"| {rate('pipetrain_s')} | {rate('torch_s')} | {cell('schedule_s') if 'schedule_s' in row else '-'} |",
                  flush=True)
    print(f"\n(8 micro-batches of 8 sequences, AdamW, clipping; peaks: fp32 {a.peak_fp32 / 1e12:.0f}, "
          f"bf16 {a.peak_bf16 / 1e12:.0f} TFLOP/s dense; exported by the {rows[0]['exporter'] if rows else '?'})")
    if a.profile:
        d, layers, context = parse_size(a.sizes.split(",")[-1])
        for precision in ("fp32", "bf16"):
            print(f"\n## pipetrain --profile, {d} x {layers} x {context}, {precision}\n")
            pipetrain_step(a.pipetrain, os.path.join(out, f"charlm_{a.sizes.split(',')[-1]}.onnx"), out, 3,
                           precision, profile=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": gpu, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
