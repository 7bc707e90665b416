"""Reference training in PyTorch for `pipetrain train`.

In: the same YAML config `pipetrain train` reads (cli/config.h; model, dims.batch, loss, data of
kind npy, optimizer, pipeline.micro_batches, steps), with the same `--set key=value` overrides.
Out: every float initializer of the model after `steps` steps, one .npy each in --out, named as
cli/npy_files.h's npy_file_name() names them, plus history.npy: per step the loss, the learning
rate it used and the gradient norm before clipping (the loss, lr and grad_norm of pipetrain's
metrics lines).

How a step goes (the contract of `pipetrain train`, cli/config.h and train/optimizer.h):
  * data: N samples, no shuffling; step s takes samples s*B*M ... (s+1)*B*M - 1, modulo N;
    micro-batch m is rows m*B ... (m+1)*B - 1 of those, B = dims.batch, M = micro_batches.
  * the graph runs with torch ops (onnx_torch.py) in float64 (--dtype float32 for comparison);
    micro-batch m adds sum(loss over its rows) / count over the global batch into the gradients,
    so the step's loss is the mean over the global batch: cross_entropy over the last axis of
    the loss output (targets equal to ignore_index are not counted), or mse over every element.
  * BatchNormalization in training mode normalises with the micro-batch's statistics (biased
    variance) and updates running_mean / running_var in place after every micro-batch, in
    micro-batch order, as torch's BatchNorm does (momentum 1 - ONNX momentum, unbiased variance).
  * then torch.nn.utils.clip_grad_norm_ over every gradient (when clip_grad_norm > 0),
    torch.optim.SGD / AdamW (foreach=False), and LambdaLR with train/optimizer.h's warm-up +
    cosine factor (total steps = steps), stepped after the optimizer.
Float initializers that get no gradient (gpt's mask) stay as they are; torch.optim skips them.

Usage: torch_train.py --config cfg.yaml [--set key=value ...] --out DIR [--dtype float64]
"""
import argparse
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn.functional as F
import yaml

sys.path.insert(0, os.path.dirname(__file__))
import onnx_torch  # noqa: E402
from optimizer_torch import lr_factor  # noqa: E402  (train/optimizer.h's schedule, one copy)

DEFAULT_OPTIMIZER = dict(kind="adamw", lr=1e-3, momentum=0.0, nesterov=False, betas=[0.9, 0.999],
                         eps=1e-8, weight_decay=0.0, clip_grad_norm=0.0, warmup_steps=0,
                         schedule="constant", min_lr=0.0)


def npy_file_name(name):
    """cli/npy_files.h: '/', ':', '\\' and ' ' become '_', then '.npy'."""
    return "".join("_" if ch in "/:\\ " else ch for ch in name) + ".npy"


def running_stats(model):
    """Names of BatchNormalization's running mean and variance (inputs 3 and 4): buffers."""
    return {n.input[k] for n in model.graph.node if n.op_type == "BatchNormalization"
            for k in (3, 4) if len(n.input) > k and n.input[k]}


def make_optimizer(tensors, opt):
    if opt["kind"] == "sgd":
        return torch.optim.SGD(tensors, lr=opt["lr"], momentum=opt["momentum"],
                               nesterov=bool(opt["nesterov"]), weight_decay=opt["weight_decay"],
                               foreach=False)
    if opt["kind"] == "adamw":
        return torch.optim.AdamW(tensors, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"],
                                 weight_decay=opt["weight_decay"], foreach=False)
    raise ValueError(f"optimizer.kind {opt['kind']!r}: sgd or adamw")


def schedule_lambda(opt, steps):
    case = dict(lr=opt["lr"], warmup=opt["warmup_steps"], schedule=opt["schedule"],
                min_lr=opt["min_lr"], total_steps=steps)
    return lambda t: lr_factor(case, t)


def micro_batch_loss(out, target, loss):
    """Sum of the loss over the micro-batch's rows (divided by the global count by the caller)."""
    if loss["kind"] == "cross_entropy":
        c = out.shape[-1]
        return F.cross_entropy(out.reshape(-1, c), torch.from_numpy(target.reshape(-1)).long(),
                               ignore_index=loss["ignore_index"], reduction="sum")
    if loss["kind"] == "mse":
        return torch.sum((out - onnx_torch.to_torch(target)) ** 2)
    raise ValueError(f"loss.kind {loss['kind']!r}: cross_entropy or mse")


def global_count(target, loss):
    if loss["kind"] == "cross_entropy":
        return int(np.sum(target != loss["ignore_index"]))
    return int(target.size)


def train(model, inputs, targets, cfg, on_gradients=None):
    """Runs `steps` steps; returns ({float initializer name: array after training}, history),
    history holding per step {"loss", "lr", "grad_norm"} (norm of all gradients before clipping).

    model: onnx.ModelProto; inputs: {input name: array of N rows}; targets: array of N rows;
    cfg: the config as a dict (keys of cli/config.h). on_gradients(step, {name: array}) sees the
    accumulated gradients of every step before clipping.
    """
    b = int(cfg["dims"]["batch"])
    m = int(cfg["pipeline"].get("micro_batches", 1))
    steps = int(cfg.get("steps", 1))
    loss = dict(dict(kind="cross_entropy", output="", ignore_index=-100), **cfg.get("loss", {}))
    opt = dict(DEFAULT_OPTIMIZER, **cfg.get("optimizer", {}))
    out_name = loss["output"] or model.graph.output[0].name

    params = onnx_torch.parameters(model)
    for name in running_stats(model):
        params[name].requires_grad_(False)  # onnx_torch then lets BatchNorm update them in place
    trained = [t for t in params.values() if t.requires_grad]
    optimizer = make_optimizer(trained, opt)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_lambda(opt, steps))

    n = targets.shape[0]
    history = []
    for s in range(steps):
        rows = (s * b * m + np.arange(b * m)) % n
        step_targets = targets[rows]
        count = global_count(step_targets, loss)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(m):
            mb = rows[k * b:(k + 1) * b]
            out = onnx_torch.run(model, {name: v[mb] for name, v in inputs.items()}, params)[out_name]
            value = micro_batch_loss(out, targets[mb], loss) / count
            value.backward()
            total += float(value)
        grads = [t.grad for t in trained if t.grad is not None]
        norm = float(torch.sqrt(sum(torch.sum(g.double() ** 2) for g in grads)))
        history.append({"loss": total, "lr": optimizer.param_groups[0]["lr"], "grad_norm": norm})
        if on_gradients:
            on_gradients(s, {name: t.grad.numpy().copy() for name, t in params.items()
                             if t.grad is not None})
        if opt["clip_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(trained, opt["clip_grad_norm"])
        optimizer.step()
        scheduler.step()
    after = {name: t.detach().numpy().copy() for name, t in params.items() if t.is_floating_point()}
    return after, history


def load_npy_data(cfg):
    data = cfg["data"]
    if data.get("kind") != "npy":
        raise ValueError("torch_train: data.kind must be npy")
    if data.get("shuffle", True) or data.get("eval_fraction", 0.0):
        raise ValueError("torch_train: needs data.shuffle false and data.eval_fraction 0")
    inputs = {name: np.load(path) for name, path in data["inputs"].items()}
    return inputs, np.load(data["targets"])


def apply_set(cfg, spec):
    """--set a.b=value, the value parsed as YAML (as `pipetrain train --set` does)."""
    key, _, text = spec.partition("=")
    node = cfg
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = yaml.safe_load(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--model", help="overrides the config's model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    args = ap.parse_args()
    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    for spec in args.set:
        apply_set(cfg, spec)
    if args.model:
        cfg["model"] = args.model
    torch.set_num_threads(1)
    onnx_torch.FLOAT = getattr(torch, args.dtype)
    inputs, targets = load_npy_data(cfg)
    after, history = train(onnx.load(cfg["model"]), inputs, targets, cfg)
    os.makedirs(args.out, exist_ok=True)
    for name, value in after.items():
        np.save(os.path.join(args.out, npy_file_name(name)), value)
    np.save(os.path.join(args.out, "history.npy"),
            np.array([[h["loss"], h["lr"], h["grad_norm"]] for h in history]))
    for s, h in enumerate(history):
        print(f"step {s + 1}: loss {h['loss']:.6f}  lr {h['lr']:.3g}  grad_norm {h['grad_norm']:.6f}")


if __name__ == "__main__":
    main()
