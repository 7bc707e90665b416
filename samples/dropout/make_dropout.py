#!/usr/bin/env python3
"""Fixtures for training-mode dropout and stochastic depth: small models exported in train() mode.

Run once, with the export venv of samples/exports (PyTorch 2.15, transformers, torchvision;
CI uses the committed files):

    .venv-export/bin/python samples/dropout/make_dropout.py [--out samples/dropout]

Writes, under --out:
  gpt2.onnx (+ .data)         transformers' GPT-2 (2 layers, d 32) with every dropout 0.1, train()
                              mode, the default (torch.export-based) exporter, its optimizer on:
                              Dropout(x, ratio, training_mode) with both initializers
  gpt2_noopt.onnx (+ .data)   the same with optimize=False: ratio and training_mode from Constant
                              nodes, CastLike and SplitToSequence/SequenceAt folded at import
  gpt2_legacy.onnx            the legacy exporter (dynamo=False, TrainingMode.TRAINING,
                              do_constant_folding=False), opset 17: Constant nodes
  gpt2_eval.onnx, gpt2_noopt_eval.onnx, gpt2_legacy_eval.onnx
                              the same module exported in eval() mode by the same exporter with
                              the same options (no Dropout)
  bert*.onnx                  BERT for sequence classification (2 layers, d 32), the same six
  convnext*.onnx              torchvision ConvNeXt (2 stages of 1 block, channels 8 and 16,
                              stochastic_depth_prob 0.2): StochasticDepth exported as
                              RandomUniformLike + Less + Cast (optimize=False: CastLike, the
                              chance cast like the draw); default, optimize=False and legacy,
                              each also in eval() mode
  effnet.onnx, effnet_legacy.onnx
                              torchvision EfficientNet (3 MBConv blocks, BatchNorm, SiLU,
                              squeeze-excitation, stochastic_depth_prob 0.2, classifier dropout
                              0.2) in train() mode. The default exporter writes the in-place
                              classifier Dropout as RandomUniformLike + Less + Cast too (and folds
                              BatchNorm into the convolutions); no eval() export, as BatchNorm
                              differs between the two modes.
  bernoulli.onnx, bernoulli_legacy.onnx
                              an MLP masked by torch.bernoulli(full_like(h, p)) / p: ONNX
                              Bernoulli from both exporters; no eval() export (torch.bernoulli
                              draws in eval() mode too).
  data.npz                    x_tokens int64 [16, 8], y_lm int64 [16, 8], y_class int64 [16],
                              x_image float32 [16, 3, 16, 16], y_image int64 [16]

Parameters are jittered (seeded noise, as samples/exports/make_exports.py did before import
untied merged initializers), so that the exported files hold no two equal initializers. Node metadata (the exporter's stack traces, 90% of the bytes) is
stripped; the graph is as exported. tests/oracle/dropout_train.py trains them.
"""

import argparse
import os
import sys
import warnings

import numpy as np
import onnx
import torch

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "exports"))
from make_exports import Logits  # noqa: E402

VOCAB, SEQ, ROWS, P = 64, 8, 16, 0.1


def gpt2():
    import transformers as t
    return t.GPT2LMHeadModel(t.GPT2Config(
        vocab_size=VOCAB, tie_word_embeddings=False, n_layer=2, n_embd=32, n_head=2, n_positions=16,
        resid_pdrop=P, embd_pdrop=P, attn_pdrop=P)), "tokens"


def bert():
    import transformers as t
    return t.BertForSequenceClassification(t.BertConfig(
        vocab_size=VOCAB, num_hidden_layers=2, hidden_size=32, intermediate_size=64,
        num_attention_heads=2, max_position_embeddings=16, hidden_dropout_prob=P,
        attention_probs_dropout_prob=P, num_labels=3)), "tokens"


def convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    return ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)],
                    stochastic_depth_prob=0.2, layer_scale=0.5, num_classes=5), "image"


class DrawnMask(torch.nn.Module):
    """An MLP whose hidden layers are masked by torch.bernoulli: both exporters write ONNX
    Bernoulli."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3 * 16 * 16, 32)
        self.b = torch.nn.Linear(32, 32)
        self.c = torch.nn.Linear(32, 5)

    def forward(self, x):
        h = torch.relu(self.a(x.flatten(1)))
        h = torch.relu(self.b(h * torch.bernoulli(torch.full_like(h, 0.75)) / 0.75))
        return self.c(h * torch.bernoulli(torch.full_like(h, 0.5)) / 0.5)


def bernoulli():
    return DrawnMask(), "image"


def effnet():
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig
    blocks = [MBConvConfig(1, 3, 1, 8, 8, 1), MBConvConfig(4, 3, 2, 8, 16, 2)]
    return EfficientNet(blocks, dropout=0.2, stochastic_depth_prob=0.2, num_classes=5,
                        last_channel=32), "image"


def jitter(module, seed):
    """Moves every parameter by seeded noise, so that no two initializers are equal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g, dtype=p.dtype))


MODELS = {"gpt2": gpt2, "bert": bert, "convnext": convnext, "effnet": effnet, "bernoulli": bernoulli}


def export(model, example, path, mode, training):
    model.train(training)
    if mode == "legacy":
        torch.onnx.export(model, (example,), path, input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                          opset_version=17, dynamo=False,
                          training=torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL,
                          do_constant_folding=False)
    else:
        torch.onnx.export(model, (example,), path, input_names=["input"], output_names=["output"],
                          dynamic_shapes=({0: torch.export.Dim("batch")},), dynamo=True,
                          optimize=mode != "noopt")
    model.train(training)
    m = onnx.load(path, load_external_data=False)
    for n in m.graph.node:
        del n.metadata_props[:]
        n.doc_string = ""
    onnx.save(m, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("names", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(0)
    data = {"x_tokens": rng.integers(0, VOCAB, (ROWS, SEQ)).astype(np.int64),
            "y_lm": rng.integers(0, VOCAB, (ROWS, SEQ)).astype(np.int64),
            "y_class": rng.integers(0, 3, (ROWS,)).astype(np.int64),
            "x_image": rng.standard_normal((ROWS, 3, 16, 16)).astype(np.float32),
            "y_image": rng.integers(0, 5, (ROWS,)).astype(np.int64)}
    np.savez_compressed(os.path.join(args.out, "data.npz"), **data)
    print(f"torch {torch.__version__}")
    for name in args.names:
        torch.manual_seed(0)
        module, kind = MODELS[name]()
        jitter(module, 1)
        wrapped = Logits(module)
        example = torch.from_numpy(data["x_tokens" if kind == "tokens" else "x_image"][:2])
        training_only = name in ("effnet", "bernoulli")
        modes = [("", "default"), ("_legacy", "legacy")] + ([] if training_only else [("_noopt", "noopt")])
        for suffix, mode in list(modes):
            if not training_only:
                modes.append((suffix + "_eval", mode))
        for suffix, mode in modes:
            training = not suffix.endswith("_eval")
            path = os.path.join(args.out, f"{name}{suffix}.onnx")
            export(wrapped, example, path, mode, training)
            print(f"{name}{suffix}: {mode} exporter, {'train' if training else 'eval'}() mode")


if __name__ == "__main__":
    sys.exit(main())
