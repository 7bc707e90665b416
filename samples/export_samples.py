#!/usr/bin/env python3
"""Export the small sample models used by pipetrain's tests and benchmarks.

Run with Debian's python (it has torch 1.13):

    /usr/bin/python3 samples/export_samples.py [names...] --out samples

With no names every sample is exported. Each model is written to
<out>/<name>/<name>.onnx. All exports use opset 17, one input named "input",
one output named "output", and a symbolic batch dimension named "batch"
(dim 0 of both). torch is seeded so re-running produces identical files.

If the `onnx` / `onnxruntime` packages are importable (e.g. run with the
project's .venv/bin/python, made by scripts/setup.sh), every export is also checked with
onnx.checker.check_model and run in onnxruntime at batch 2 and batch 3
against the torch output. Pass --no-check to skip that.
"""

import argparse
import collections
import math
import os
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

OPSET = 17


# ---------------------------------------------------------------------------
# 1. MLP
# ---------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, in_dim=64, hidden=(128, 128, 64), num_classes=10):
        super().__init__()
        layers = []
        d = in_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


# ---------------------------------------------------------------------------
# Hand-written multi-head self-attention (standard ops only, no
# nn.MultiheadAttention). Reshapes use x.size(0) so the exporter emits
# Shape/Gather/Unsqueeze/Concat/Reshape subgraphs for the dynamic batch.
# ---------------------------------------------------------------------------
class SelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        B, T, C = x.size(0), x.size(1), x.size(2)
        q = self.q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        if mask is not None:
            # mask: [1, 1, S, S] lower-triangular ones; 0 = hidden. Sliced by the
            # traced T, so Slice/Equal/Where stay in the graph. A finite large
            # negative instead of -inf: same softmax, no inf arithmetic.
            att = att.masked_fill(mask[:, :, :T, :T] == 0, -1e9)
        att = F.softmax(att, dim=-1)
        att = self.attn_drop(att)
        y = torch.matmul(att, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


def _perturb_layernorms(model, std=0.02):
    """LayerNorm init is weight=1, bias=0 in every layer. In eval mode torch
    1.13's exporter dedupes value-identical initializers, so all LayerNorms
    would end up sharing one weight and one bias through Identity nodes (i.e.
    tied parameters). Small random offsets keep every LayerNorm its own."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.add_(torch.randn_like(m.weight) * std)
                m.bias.add_(torch.randn_like(m.bias) * std)


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, act, dropout=0.0):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = act
        self.fc2 = nn.Linear(d_ff, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.fc2(self.act(self.fc1(x))))


class PreLNBlock(nn.Module):
    """x + attn(ln(x)); x + ffn(ln(x)) (GPT-2 / ViT style)."""

    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, nn.GELU())

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask)
        x = x + self.ffn(self.ln2(x))
        return x


class PostLNBlock(nn.Module):
    """ln(x + attn(x)); ln(x + ffn(x)) (original BERT style)."""

    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.attn = SelfAttention(d_model, n_heads)
        self.ln1 = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, nn.ReLU())
        self.ln2 = nn.LayerNorm(d_model)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        x = self.ln2(x + self.ffn(x))
        return x


# ---------------------------------------------------------------------------
# 2. GPT
# ---------------------------------------------------------------------------
class GPT(nn.Module):
    def __init__(self, vocab=256, seq=32, d_model=64, n_heads=4, n_layers=8):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq, d_model)
        self.drop = nn.Dropout(0.0)
        # One causal-mask buffer shared by all blocks (per-block copies would be
        # value-identical and the exporter would dedupe them into Identity nodes).
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))
        self.blocks = nn.ModuleList(
            [PreLNBlock(d_model, n_heads, 4 * d_model) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)  # untied
        _perturb_layernorms(self)

    def forward(self, idx):
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.lm_head(self.ln_f(x))


# ---------------------------------------------------------------------------
# 3. BERT
# ---------------------------------------------------------------------------
class BERT(nn.Module):
    def __init__(self, vocab=256, seq=32, d_model=64, n_heads=4, n_layers=4, num_classes=2):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq, d_model)
        self.emb_ln = nn.LayerNorm(d_model)
        self.drop = nn.Dropout(0.0)
        self.layers = nn.ModuleList(
            [PostLNBlock(d_model, n_heads, 4 * d_model) for _ in range(n_layers)])
        self.pooler = nn.Linear(d_model, d_model)
        self.classifier = nn.Linear(d_model, num_classes)
        _perturb_layernorms(self)

    def forward(self, idx):
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.drop(self.emb_ln(self.tok_emb(idx) + self.pos_emb(pos)))
        for layer in self.layers:
            x = layer(x)
        cls = x[:, 0]  # first ([CLS]) token
        pooled = torch.tanh(self.pooler(cls))
        return self.classifier(pooled)


# ---------------------------------------------------------------------------
# 4. ViT
# ---------------------------------------------------------------------------
class ViT(nn.Module):
    def __init__(self, image=32, patch=4, in_ch=3, d_model=64, n_heads=4, n_layers=4,
                 num_classes=10):
        super().__init__()
        n_patches = (image // patch) ** 2
        self.patch_embed = nn.Conv2d(in_ch, d_model, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos_emb = nn.Parameter(torch.randn(1, n_patches + 1, d_model) * 0.02)
        nn.init.normal_(self.cls_token, std=0.02)
        self.drop = nn.Dropout(0.0)
        self.blocks = nn.ModuleList(
            [PreLNBlock(d_model, n_heads, 4 * d_model) for _ in range(n_layers)])
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)
        _perturb_layernorms(self)

    def forward(self, img):
        x = self.patch_embed(img)              # [B, D, H/p, W/p]
        x = x.flatten(2).transpose(1, 2)       # [B, N, D]
        B = x.size(0)
        cls = self.cls_token.expand(B, -1, -1)  # Shape/Gather/Concat -> Expand
        x = torch.cat([cls, x], dim=1)
        x = self.drop(x + self.pos_emb)
        for blk in self.blocks:
            x = blk(x)
        x = self.ln(x)
        return self.head(x[:, 0])


# ---------------------------------------------------------------------------
# 5. ResNet (CIFAR-style, BasicBlocks 16-32-64)
# ---------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, in_ch, out_ch, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = None
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        sc = x if self.shortcut is None else self.shortcut(x)
        return F.relu(out + sc)


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), blocks=(2, 2, 2), num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        layers = []
        in_ch = widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(BasicBlock(in_ch, w, stride))
                in_ch = w
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = torch.flatten(self.pool(x), 1)
        return self.fc(x)


# ---------------------------------------------------------------------------
# 6. MobileNetV2. torchvision.models.mobilenet_v2 is used when torchvision is
# importable; otherwise a local copy of the same architecture (same module
# structure, channel rounding and init as torchvision 0.14) is used.
# ---------------------------------------------------------------------------
def _make_divisible(v, divisor, min_value=None):
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class _ConvBNReLU6(nn.Sequential):
    def __init__(self, in_ch, out_ch, kernel=3, stride=1, groups=1, act=True):
        layers = [nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2,
                            groups=groups, bias=False),
                  nn.BatchNorm2d(out_ch)]
        if act:
            layers.append(nn.ReLU6(inplace=True))
        super().__init__(*layers)


class _InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers = []
        if expand_ratio != 1:
            layers.append(_ConvBNReLU6(inp, hidden, kernel=1))
        layers += [_ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
                   _ConvBNReLU6(hidden, oup, kernel=1, act=False)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class _MobileNetV2(nn.Module):
    def __init__(self, num_classes=1000, width_mult=1.0, round_nearest=8, dropout=0.2):
        super().__init__()
        input_channel = 32
        last_channel = 1280
        setting = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                   [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]
        input_channel = _make_divisible(input_channel * width_mult, round_nearest)
        self.last_channel = _make_divisible(last_channel * max(1.0, width_mult), round_nearest)
        features = [_ConvBNReLU6(3, input_channel, stride=2)]
        for t, c, n, s in setting:
            out_ch = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(_InvertedResidual(input_channel, out_ch, s if i == 0 else 1, t))
                input_channel = out_ch
        features.append(_ConvBNReLU6(input_channel, self.last_channel, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout),
                                        nn.Linear(self.last_channel, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)


def _mobilenet_v2(width_mult, num_classes):
    try:
        import torchvision  # noqa: F401
        return torchvision.models.mobilenet_v2(width_mult=width_mult, num_classes=num_classes), \
            "torchvision %s" % torchvision.__version__
    except ImportError:
        return _MobileNetV2(num_classes=num_classes, width_mult=width_mult), "local copy"


# ---------------------------------------------------------------------------
# Sample table and export
# ---------------------------------------------------------------------------
def _bn_running_stats_warmup(model, shape):
    """Give BatchNorm layers non-trivial running stats (a few train-mode passes
    on random data) so the BNs folded into the Convs by the eval export are
    not identities."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(*shape))


def make_mlp():
    return MLP(), torch.randn(2, 64), {}


def make_gpt():
    return GPT(), torch.randint(0, 256, (2, 32), dtype=torch.long), {}


def make_bert():
    return BERT(), torch.randint(0, 256, (2, 32), dtype=torch.long), {}


def make_vit():
    return ViT(), torch.randn(2, 3, 32, 32), {}


def make_resnet():
    # TRAINING export keeps BatchNormalization (training_mode=1), no folding.
    return ResNet(), torch.randn(2, 3, 32, 32), {
        "training": torch.onnx.TrainingMode.TRAINING, "do_constant_folding": False}


def make_mobilenet():
    model, src = _mobilenet_v2(width_mult=0.25, num_classes=10)
    print("  mobilenet_v2 from %s" % src)
    _bn_running_stats_warmup(model, (8, 3, 32, 32))
    return model, torch.randn(2, 3, 32, 32), {}


SAMPLES = collections.OrderedDict([
    ("mlp", make_mlp),
    ("gpt", make_gpt),
    ("bert", make_bert),
    ("vit", make_vit),
    ("resnet", make_resnet),
    ("mobilenet", make_mobilenet),
])


def export(name, out_dir):
    torch.manual_seed(0)
    model, example, extra = SAMPLES[name]()
    training = extra.get("training", torch.onnx.TrainingMode.EVAL)
    if training == torch.onnx.TrainingMode.TRAINING:
        model.train()
    else:
        model.eval()
    path = os.path.join(out_dir, name, name + ".onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    kwargs = dict(
        export_params=True,
        opset_version=OPSET,
        input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        do_constant_folding=True,
    )
    kwargs.update(extra)
    with warnings.catch_warnings():
        # TRAINING export drops the BN num_batches_tracked += 1 update; expected.
        warnings.filterwarnings("ignore", message=".*num_batches_tracked.*")
        torch.onnx.export(model, (example,), path, **kwargs)
    return path, model, example


def check(name, path, model):
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
        onnx.checker  # Debian's dist-packages has an empty "onnx" directory
    except (ImportError, AttributeError) as e:
        print("  (skipping onnx/onnxruntime check: %s)" % e)
        return
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    hist = collections.Counter(n.op_type for n in m.graph.node)
    print("  nodes=%d size=%d bytes" % (len(m.graph.node), os.path.getsize(path)))
    print("  ops: " + ", ".join("%s:%d" % kv for kv in sorted(hist.items())))
    inits = {t.name for t in m.graph.initializer}
    tied = [n.output[0] for n in m.graph.node if n.op_type == "Identity" and n.input[0] in inits]
    if tied:
        print("  WARNING: %d Identity nodes alias initializers (deduped params): %s"
              % (len(tied), tied[:4]))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    out = sess.get_outputs()[0]
    print("  input %s %s %s -> output %s %s" % (inp.name, inp.type, inp.shape, out.name, out.shape))
    # The resnet export is a training-mode graph (BN uses batch statistics),
    # so compare against the torch model in train mode; everything else eval.
    is_train = any(n.op_type == "BatchNormalization" and
                   any(a.name == "training_mode" and a.i == 1 for a in n.attribute)
                   for n in m.graph.node)
    for batch in (2, 3):
        g = torch.Generator().manual_seed(batch)
        if inp.type == "tensor(int64)":
            x = torch.randint(0, 256, (batch,) + tuple(inp.shape[1:]), generator=g)
        else:
            x = torch.randn((batch,) + tuple(inp.shape[1:]), generator=g)
        (y,) = sess.run(None, {"input": x.numpy()})
        model.train(is_train)
        with torch.no_grad():
            ref = model(x).numpy()
        err = float(np.abs(y - ref).max())
        print("  batch %d: output %s, max |ort - torch| = %.2e" % (batch, list(y.shape), err))
        if y.shape[0] != batch or not err < 1e-3:
            raise SystemExit("%s: onnxruntime check failed at batch %d" % (name, batch))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="samples to export (default: all): " +
                    ", ".join(SAMPLES))
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                    help="output root; writes <out>/<name>/<name>.onnx (default: samples/)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the onnx.checker / onnxruntime verification")
    args = ap.parse_args(argv)
    names = args.names or list(SAMPLES)
    for n in names:
        if n not in SAMPLES:
            ap.error("unknown sample %r (choose from %s)" % (n, ", ".join(SAMPLES)))
    for n in names:
        print("[%s]" % n)
        path, model, example = export(n, args.out)
        print("  wrote %s" % path)
        if not args.no_check:
            check(n, path, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
