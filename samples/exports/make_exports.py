#!/usr/bin/env python3
"""Fixtures from today's exporter: small random-init models as PyTorch 2.9+ exports them.

Run once, in .venv-export, a separate venv with PyTorch and transformers from PyPI that
scripts/export_venv.sh makes (CI does not need them; the files it makes are committed):

    bash scripts/export_venv.sh
    .venv-export/bin/python samples/exports/make_exports.py [names...] --out samples/exports
    .venv-export/bin/python samples/exports/make_exports.py [names...] --refs   # references only

For each model NAME it writes, under --out:
  NAME.onnx (+ NAME.onnx.data)   torch.onnx.export(module, (x,), path) with no flags: the
                                 torch.export-based exporter, opset 20, IR 10, its optimizer on
  NAME_noopt.onnx (+ .data)      samples/export_model.py: the default exporter with optimize=False,
                                 a dynamic batch, and its record of the module's state_dict
  NAME_legacy.onnx               the legacy TorchScript exporter at opset 17, where it still works
  NAME_opset23.onnx              the default exporter asked for opset 23 (Llama: RMSNormalization
                                 and Attention as fused ops)
  NAME[_VARIANT].npz             the reference for each file (see below)
  NAME.start.safetensors         the module's state_dict before training, which `train` takes as
                                 output.start_state to write a state_dict load_state_dict(strict=True)
                                 takes from a file without samples/export_model.py's record

The reference, made in float64 from the same module: `x` (inputs for the training steps, first axis
samples), `y` (targets), `probe` (a held-out input) and `probe_out` (the module's output on it
before training, in eval mode), `probe_trained` (the trained module's output on it, eval mode),
`losses` (per step), `module_params` (the module's parameter
names) `state.<module parameter>` (every parameter the reference trained, by module name; `twins.<name>`
lists a tied parameter's other names), and `param.<initializer name>` / `buffer.<initializer name>` (every parameter and
BatchNorm buffer after STEPS steps of SGD with momentum, lr LR, over MICRO micro-batches of BATCH
samples, the loss the mean cross-entropy over the global batch, gradients accumulated micro-batch
by micro-batch, BatchNorm on each micro-batch's statistics). A parameter the exporter folded into
a constant that selects its leading elements (GPT-2's and BERT's position tables at 8 of 16
positions, BERT's token-type row, ViT's class token) trains whole in the reference, and its
`param.` and `state.` entries hold the elements the file holds. Parameters folded in other ways
are frozen in the reference too, so the reference is the training of what the file carries. The legacy exporter also stores some weights pre-transposed
under generated names (`onnx::MatMul_N`); such a file trains its own copies, which no module
parameter matches. BatchNorm nets are exported in training mode: an eval-mode export folds
BatchNorm into the convolutions, and what it holds is then not the module PyTorch trains.

Random init leaves many parameters equal (every LayerNorm weight is ones, every bias zero): the
default exporter's optimizer merges them into one initializer, drops zero biases, stores weights
transposed under generated names and folds constant subgraphs (a position table's rows). The
fixtures keep that as it comes: pipetrain gives back the module's parameters
(onnx_import/module_params.h), and the reference trains the module parameters the file still
holds in some form (by name, transposed under a generated name, named by a node's FX metadata,
or selected by a folded constant). NAME_noopt.onnx (`optimize=False`) holds every parameter. GPT-2 keeps its tied
token embedding and LM head. Dropout is 0.

NAME[_VARIANT].grads.npz (also for make_noopt_min.py's tiny_noopt_min; `--grads` writes only
these, from the committed files, without exporting again): one gradient per initializer
`pipetrain grad` trains in the file, for tests/oracle/grads_vs_torch.py. Each `grad.<initializer>`
is, in float64 (stored as float32), d loss / d initializer at the file's initial values, where
loss = mean cross-entropy over every target of the first micro-batch: x[:BATCH] (`x`), y[:BATCH]
(`y`; each token's target for the language models), i.e. `pipetrain grad FILE -i input=x.npy
--target y.npy` with one micro-batch; `loss` is that loss. The module runs as `pipetrain train`
trains the file: BatchNorm on the batch's statistics (in an eval-mode export too), Dropout 0.
What each initializer is:
  - a parameter the file holds by name, transposed under a generated name, or given back by
    pipetrain (merged equal values, a dropped zero bias): that module parameter's gradient
    (file_parameters; transposed where the file stores it so). A merged initializer becomes one
    copy per parameter, so each copy gets its own parameter's gradient;
  - a tied parameter (GPT-2's token embedding and LM head): one tensor, the sum of both uses;
  - a convolution with a BatchNorm folded into it (the default exporter on MobileNetV3, ResNet and
    the BatchNorm convnet; the legacy one on MobileNetV3): the exporter folded the BatchNorm at
    its start statistics as in eval mode (W' = W s, b' = (b - mean) s + beta, s = gamma /
    sqrt(var + eps)), so the file computes that folded module, with no BatchNorm, and the
    gradient is the folded module's, by W' and b' (torch's fuse_conv_bn_eval; a zero b' the
    exporter dropped comes back in pipetrain under the BatchNorm's bias name);
  - a parameter folded into a constant that selects its leading elements (a position table's
    rows): the gradient of those elements; folded in any other way (BatchNorm's scale): none.
Also `loss_noise`, |float32 - float64 PyTorch loss|, and `noise`, for each initializer in
`names`, max|float32 - float64 PyTorch gradient|, the rounding float32 leaves in it (the whole gradient where it is zero in exact arithmetic), and
`start.<initializer>` for each initializer pipetrain makes that the file holds under no name of
its own (merged or dropped), its initial value, so that tests can measure training's updates.
"""

import argparse
import copy
import os
import re
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn

warnings.filterwarnings("ignore")

STEPS, MICRO, BATCH, LR, MOMENTUM = 3, 2, 2, 0.1, 0.9
SEQ, VOCAB = 8, 64
LONG_SEQ = 128  # nanogpt's context: its 128 x 128 mask is past what the exporter's optimizer folds


def lm(cls, config_cls, tie=False, **kw):
    return lambda: cls(config_cls(vocab_size=VOCAB, tie_word_embeddings=tie, **kw))


def build(name):
    import transformers as t
    if name == "gpt2":
        return lm(t.GPT2LMHeadModel, t.GPT2Config, tie=True, n_layer=2, n_embd=32, n_head=2, n_positions=16,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)(), "tokens"
    if name == "llama":
        return lm(t.LlamaForCausalLM, t.LlamaConfig, num_hidden_layers=2, hidden_size=32,
                  intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                  max_position_embeddings=16)(), "tokens"
    if name == "qwen2":
        return lm(t.Qwen2ForCausalLM, t.Qwen2Config, num_hidden_layers=2, hidden_size=32,
                  intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                  max_position_embeddings=16)(), "tokens"
    if name == "qwen3":
        return lm(t.Qwen3ForCausalLM, t.Qwen3Config, num_hidden_layers=2, hidden_size=32,
                  intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  max_position_embeddings=16)(), "tokens"
    if name == "mobilenetv3":
        import torchvision
        return torchvision.models.mobilenet_v3_small(num_classes=5, width_mult=0.25), "image"
    if name == "mistral":
        return lm(t.MistralForCausalLM, t.MistralConfig, num_hidden_layers=2, hidden_size=32,
                  intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                  max_position_embeddings=16, sliding_window=None)(), "tokens"
    if name == "phi3":
        return lm(t.Phi3ForCausalLM, t.Phi3Config, num_hidden_layers=2, hidden_size=32,
                  intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                  max_position_embeddings=16, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                  attention_dropout=0.0)(), "tokens"
    if name == "bert":
        return t.BertForSequenceClassification(t.BertConfig(
            vocab_size=VOCAB, num_hidden_layers=2, hidden_size=32, intermediate_size=64,
            num_attention_heads=2, max_position_embeddings=16, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, num_labels=3)), "tokens_to_class"
    if name == "vit":
        return t.ViTForImageClassification(t.ViTConfig(
            image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64, num_labels=5, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)), "image"
    if name == "convnext":
        return t.ConvNextForImageClassification(t.ConvNextConfig(
            num_channels=3, patch_size=2, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1],
            num_labels=5, image_size=16)), "image"
    if name == "resnet":
        return t.ResNetForImageClassification(t.ResNetConfig(
            num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
            layer_type="basic", num_labels=5)), "image"
    if name == "bnconv":
        return BnConv(), "image"
    if name == "nanogpt":
        return NanoGPT(), "long_tokens"
    raise SystemExit(f"unknown model {name}")


class NanoGPT(nn.Module):
    """nanoGPT's model as its users write it: token and position embeddings, pre-LayerNorm
    blocks with F.scaled_dot_product_attention(is_causal=True) and a GELU MLP, the LM head tied
    to the token embedding. Its context (LONG_SEQ) is long enough that the default exporter's
    optimizer leaves the causal mask as Trilu over a ones matrix instead of folding it."""

    def __init__(self, d=32, heads=2, layers=2, vocab=VOCAB, tie=True):
        super().__init__()
        self.heads = heads
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(LONG_SEQ, d)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln_1": nn.LayerNorm(d), "c_attn": nn.Linear(d, 3 * d), "c_proj": nn.Linear(d, d),
            "ln_2": nn.LayerNorm(d), "c_fc": nn.Linear(d, 4 * d), "mlp_proj": nn.Linear(4 * d, d)})
            for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            q, k, v = blk["c_attn"](blk["ln_1"](x)).split(x.shape[-1], dim=2)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["c_proj"](y.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["mlp_proj"](nn.functional.gelu(blk["c_fc"](blk["ln_2"](x))))
        return self.lm_head(self.ln_f(x))


class BnConv(nn.Module):
    """A small BatchNorm convnet."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))

    def forward(self, x):
        return self.body(x)


NAMES = ["nanogpt", "gpt2", "llama", "qwen2", "qwen3", "mistral", "phi3", "bert", "vit", "convnext", "mobilenetv3",
         "resnet", "bnconv"]
TRAINING_MODE_EXPORT = {"resnet", "bnconv"}
# The reference trains these in eval mode (BatchNorm on running statistics) so that float32 and
# float64 agree: MobileNetV3's BatchNorm over 2 samples of 1x1 maps, in training mode, moves the
# losses by 2e-2 between the two (and by 1e-3 at 64x64 images). pipetrain trains BatchNorm on
# batch statistics, so the test compares its schedules with each other only.
EVAL_MODE_TRAINING = {"mobilenetv3"}
OPSET23_EXPORT = {"llama"}


class Logits(nn.Module):
    """The module with one tensor input and its logits as the one output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(x)
        return out if torch.is_tensor(out) else out.logits


def data(kind, n, seed):
    rng = np.random.default_rng(seed)
    if kind == "image":
        return rng.standard_normal((n, 3, 16, 16)).astype(np.float32)
    return rng.integers(0, VOCAB, (n, LONG_SEQ if kind == "long_tokens" else SEQ)).astype(np.int64)


def targets(kind, logits_shape, n, seed):
    rng = np.random.default_rng(seed + 1)
    shape = (n, SEQ) if kind == "tokens" else (n, LONG_SEQ) if kind == "long_tokens" else (n,)
    return rng.integers(0, logits_shape[-1], shape).astype(np.int64)


def export_default(model, example, path, training, opset=None, optimize=True):
    """No flags but the input and output names the tests feed; for _noopt, samples/export_model.py
    (optimize=False, a dynamic batch, and its record of the module's state_dict)."""
    model.train(training)
    if optimize:
        kw = {"opset_version": opset} if opset else {}
        torch.onnx.export(model, (example,), path, input_names=["input"], output_names=["output"],
                          dynamo=True, **kw)
    else:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from export_model import export_for_pipetrain
        export_for_pipetrain(model, example, path, train_mode=training, opset=opset)
    drop_stack_traces(path)


def drop_stack_traces(path):
    """The exporter records each node's Python stack (pkg.torch.onnx.stack_trace), most of a
    small file's bytes; nothing reads it, so the committed fixtures leave it out."""
    import onnx
    m = onnx.load(path, load_external_data=False)
    for node in m.graph.node:
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(m, path)


def export_legacy(model, example, path, training):
    model.train(training)
    try:
        torch.onnx.export(model, (example,), path, input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                          opset_version=17, dynamo=False,
                          training=torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL,
                          do_constant_folding=not training)
        return True
    except Exception as e:  # the legacy exporter no longer takes transformers' decoders
        print(f"  legacy export failed: {str(e).splitlines()[0][:120]}")
        if os.path.exists(path):
            os.remove(path)
        return False


def held_view(v, how):
    """What an initializer holds of its module parameter's value (or gradient) v: `how` is False
    (v itself), True (v transposed) or ("rows", shape) (v's leading elements: the rows of a table
    the exporter gathered at constant positions, or a class token it expanded, as pipetrain
    restores them)."""
    if how is True:
        return v.T.copy()
    if isinstance(how, tuple):
        return v.reshape(-1)[:int(np.prod(how[1]))].reshape(how[1]).copy()
    return v


def file_parameters(path, module):
    """{initializer name pipetrain trains: (module parameter name, how it holds it; held_view)} for
    every module parameter the file holds in some form, as pipetrain restores it
    (onnx_import/module_params.h):
      - under its own name, or a tied twin's name (GPT-2's LM head and token embedding);
      - transposed under a generated name (val_N, onnx::MatMul_N), found by value;
      - named by a node's FX metadata (`%p_<path>` in pkg.torch.onnx.fx_node) though no
        initializer has its name (merged with equal values, or a dropped zero bias): pipetrain
        makes it an initializer of that name;
      - (the legacy exporter) the output of an Identity of another initializer, its merge of
        equal values: untied under its name;
      - folded by the default exporter's optimizer into a constant that selects its leading
        elements (a position table's first rows, a class token expanded over the batch; the
        value info's pkg.onnxscript.optimizer.folded_from names the parameter): pipetrain gives
        those elements back under the parameter's name, a table as [rows, dim].
    Parameters in none of these forms were folded into constants and stay frozen."""
    import onnx
    from onnx import numpy_helper
    g = onnx.load(path).graph
    named = dict(module.named_parameters(remove_duplicate=False))
    canonical = {}
    for n, p in named.items():
        canonical.setdefault(id(p), n)
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    out, held = {}, set()

    def hold(init, param, transposed):
        if canonical[id(named[param])] not in held:
            held.add(canonical[id(named[param])])
            out[init] = (canonical[id(named[param])], transposed)

    for n in named:
        if n in inits:
            hold(n, n, False)
    for n, p in named.items():
        v = p.detach().numpy()
        for name, a in inits.items():
            if name not in named and v.ndim == 2 and a.shape == v.T.shape and np.array_equal(a, v.T):
                hold(name, n, True)
    fx = [p.value for node in g.node for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"]
    spelled = {"p_" + n.replace(".", "_").lower(): n for n in named}
    for text in fx:
        for placeholder in re.findall(r"%(p_\w+)", text.split("args = (", 1)[-1]):
            if placeholder in spelled:
                hold(spelled[placeholder], spelled[placeholder], False)
    if not fx:  # the legacy exporter writes a merged parameter as `name = Identity(kept)`
        for node in g.node:
            if node.op_type == "Identity" and node.input[0] in inits and node.output[0] in named:
                hold(node.output[0], node.output[0], False)
    for vi in g.value_info:
        folded = [p.value for p in vi.metadata_props if p.key == "pkg.onnxscript.optimizer.folded_from"]
        params = [n for n in re.findall(r"'([^']+)'", folded[0]) if n in named] if folded else []
        if vi.name not in inits or len(params) != 1 or canonical[id(named[params[0]])] in held:
            continue
        v = named[params[0]].detach().numpy()
        n = np.unique(inits[vi.name]).size  # the distinct elements it selected
        if n <= v.size and np.array_equal(np.unique(inits[vi.name]), np.unique(v.reshape(-1)[:n])):
            hold(params[0], params[0], ("rows", v.shape if n == v.size else (n // v.shape[-1], v.shape[-1])))
    return out


def reference(model, held, file_inits, x, y, probe, dtype=torch.float64, train_mode=True):
    """SGD with momentum over micro-batches (float64; float32 for the conditioning check); returns
    losses, the trained parameters (under the file's initializer names), buffers, the trained
    parameters by module name, and the trained module's output on `probe` in eval mode."""
    m = Logits(model).to(dtype).train(train_mode)
    with torch.no_grad():  # buffers start where the file has them (the legacy exporter's trace
        for n, b in m.named_buffers():  # in training mode moved its BatchNorm statistics)
            if b.is_floating_point() and n in file_inits:
                b.copy_(torch.from_numpy(file_inits[n]).to(dtype))
    wanted = {param for param, _ in held.values()}
    trained = {n: p for n, p in m.named_parameters() if n in wanted}
    for n, p in m.named_parameters():
        p.requires_grad_(n in trained)
    opt = torch.optim.SGD(list(trained.values()), lr=LR, momentum=MOMENTUM)
    losses = []
    per_step = MICRO * BATCH
    for s in range(STEPS):
        opt.zero_grad()
        xs, ys = x[s * per_step:(s + 1) * per_step], y[s * per_step:(s + 1) * per_step]
        total = 0.0
        for mb in range(MICRO):
            xm = torch.from_numpy(xs[mb * BATCH:(mb + 1) * BATCH])
            if xm.is_floating_point():
                xm = xm.to(dtype)
            ym = torch.from_numpy(ys[mb * BATCH:(mb + 1) * BATCH])
            logits = m(xm)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ym.reshape(-1),
                                               reduction="sum") / ym.numel() / MICRO
            loss.backward()
            total += float(loss)
        opt.step()
        losses.append(total)
    state = {n: p.detach().numpy().astype(np.float32) for n, p in trained.items()}
    params = {}
    for name, (param, how) in held.items():
        params[name] = held_view(trained[param].detach().numpy().astype(np.float32), how)
        if isinstance(how, tuple):  # what the file can give back of it
            state[param] = params[name]
    buffers = {n: b.detach().numpy().astype(np.float32)
               for n, b in m.named_buffers() if b.is_floating_point() and n in file_inits}
    with torch.no_grad():
        xp = torch.from_numpy(probe)
        probe_out = m.eval()(xp.to(dtype) if xp.is_floating_point() else xp).numpy().astype(np.float32)
    return losses, params, buffers, state, probe_out


def fold_batchnorms(wrapped):
    """A copy of the module in eval mode with every BatchNorm folded into the convolution
    registered just before it in the same parent (a Sequential, ResNet's conv layer and
    shortcut), as the exporters fold an eval-mode graph; the BatchNorm becomes an Identity and
    the convolution always has a bias. Returns (the copy, {folded bias name: BatchNorm bias name})."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval
    folded = copy.deepcopy(wrapped).eval()
    bias_names = {}
    for parent_name, parent in list(folded.named_modules()):
        children = list(parent.named_children())
        for (conv_name, conv), (bn_name, bn) in zip(children, children[1:]):
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.modules.batchnorm._BatchNorm):
                setattr(parent, conv_name, fuse_conv_bn_eval(conv, bn))
                setattr(parent, bn_name, nn.Identity())
                prefix = f"{parent_name}." if parent_name else ""
                bias_names[f"{prefix}{conv_name}.bias"] = f"{prefix}{bn_name}.bias"
    return folded, bias_names


def folds_batchnorm(path, wrapped):
    """Whether the file holds the module's BatchNorms folded into its convolutions (none left)."""
    import onnx
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in wrapped.modules())
    return has_bn and not any(n.op_type == "BatchNormalization" for n in onnx.load(path, load_external_data=False).graph.node)


def folded_parameters(path, folded, bias_names):
    """file_parameters for a file whose convolutions read folded weights: each Conv's weight is
    matched to the folded module's by value (the default exporter keeps the convolution's name,
    the legacy one writes onnx::Conv_N) and its bias input is that convolution's bias; a
    convolution with no bias input (the exporter dropped a zero b') gets it back in pipetrain
    under the BatchNorm's bias name. Other parameters as file_parameters finds them."""
    import onnx
    from onnx import numpy_helper
    g = onnx.load(path).graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    convs = {n: m for n, m in folded.named_modules() if isinstance(m, nn.Conv2d)}
    held = {k: v for k, v in file_parameters(path, folded).items() if v[0].rsplit(".", 1)[0] not in convs}
    for node in g.node:
        if node.op_type != "Conv" or node.input[1] not in inits:
            continue
        w = inits[node.input[1]]
        match = [n for n, m in convs.items() if m.weight.shape == w.shape
                 and np.allclose(m.weight.detach().numpy(), w, rtol=1e-5, atol=1e-7)]
        if len(match) != 1:
            raise SystemExit(f"{path}: Conv weight '{node.input[1]}' matches {len(match)} folded convolutions")
        held[node.input[1]] = (f"{match[0]}.weight", False)
        if len(node.input) > 2 and node.input[2]:
            held[node.input[2]] = (f"{match[0]}.bias", False)
        else:
            bias = f"{match[0]}.bias"  # a convolution with no BatchNorm keeps its own name
            held[bias_names.get(bias, bias)] = (bias, False)
    return held


def gradients(module, held, x, y, dtype, train_mode):
    """({initializer: d loss / d initializer}, loss): the mean cross-entropy over every target
    of (x, y), one forward and backward of the module in `dtype`."""
    m = copy.deepcopy(module).to(dtype).train(train_mode)
    named = dict(m.named_parameters(remove_duplicate=False))
    for p in named.values():
        p.requires_grad_(True)
    xm = torch.from_numpy(x)
    logits = m(xm.to(dtype) if xm.is_floating_point() else xm)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1))
    wanted = sorted({param for param, _ in held.values()})
    grads = dict(zip(wanted, torch.autograd.grad(loss, [named[p] for p in wanted], allow_unused=True)))
    out = {}
    for init, (param, how) in held.items():
        g = grads[param]
        g = np.zeros(named[param].shape) if g is None else g.detach().to(torch.float64).numpy()
        out[init] = held_view(g, how)
    return out, float(loss)


def write_grads(wrapped, path, x, y):
    """NAME[_VARIANT].grads.npz beside `path` (see the module's docstring); `wrapped` at its start."""
    import onnx
    from onnx import numpy_helper
    module, train_mode = wrapped, True
    if folds_batchnorm(path, wrapped):
        module, bias_names = fold_batchnorms(wrapped)
        held, train_mode = folded_parameters(path, module, bias_names), False
    else:
        held = file_parameters(path, wrapped)
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    named = dict(module.named_parameters(remove_duplicate=False))
    start = {}
    for init, (param, how) in held.items():
        v = held_view(named[param].detach().numpy(), how)
        if init not in inits:
            start[init] = v.astype(np.float32)
        elif not np.allclose(inits[init], v, rtol=1e-5, atol=1e-7):  # the module starts where the file does
            raise SystemExit(f"{path}: '{init}' is not the module's '{param}' (max |diff| "
                             f"{float(np.max(np.abs(inits[init] - v))):.3g})")
    xb, yb = x[:BATCH], y[:BATCH]
    g64, loss = gradients(module, held, xb, yb, torch.float64, train_mode)
    g32, loss32 = gradients(module, held, xb, yb, torch.float32, train_mode)
    noise = {k: float(np.max(np.abs(g32[k] - g))) for k, g in g64.items()}
    # Zero in exact arithmetic: float64 leaves less than float32's rounding noise (an attention
    # key bias; a bias before a training-mode BatchNorm, which subtracts the batch's mean).
    zero = sorted(k for k, g in g64.items() if float(np.max(np.abs(g))) < noise[k])
    spread, where = max((noise[k] / float(np.max(np.abs(g))), k) for k, g in g64.items() if k not in zero)
    arrays = {"x": xb, "y": yb, "loss": np.array(loss), "loss_noise": np.array(abs(loss32 - loss))}
    arrays.update({f"grad.{k}": g.astype(np.float32) for k, g in g64.items()})
    arrays["names"] = np.array(sorted(noise))
    arrays["noise"] = np.array([noise[k] for k in sorted(noise)])
    arrays.update({f"start.{k}": v for k, v in start.items()})
    out = os.path.splitext(path)[0] + ".grads.npz"
    np.savez_compressed(out, **arrays)
    print(f"  {os.path.basename(out)}: {len(g64)} gradients{' (BatchNorm folded)' if not train_mode else ''}, "
          f"loss {loss:.6f}; float32 against float64 PyTorch: worst {spread:.2g} of the gradient's scale ({where}), "
          f"{len(zero)} zero in exact arithmetic; {os.path.getsize(out)} bytes")


def grads_for_committed(name, out):
    """write_grads for every committed file of `name`, from the module at its start."""
    torch.manual_seed(0)
    if name == "tiny_noopt_min":
        from make_noopt_min import Tiny
        model = Tiny()
    else:
        model, _ = build(name)
    wrapped = Logits(model)
    start = {k: v.detach().clone() for k, v in wrapped.state_dict().items()}
    for variant in ("", "_noopt", "_legacy", "_opset23"):
        path = os.path.join(out, f"{name}{variant}.onnx")
        if os.path.exists(path):
            ref = np.load(os.path.join(out, f"{name}{variant}.npz"))
            wrapped.load_state_dict(start)
            write_grads(wrapped, path, ref["x"], ref["y"])


def make(name, out, export=True):
    """The files of `name` (exported again unless `export` is False: then the committed ones) and
    their references."""
    torch.manual_seed(0)
    model, kind = build(name)
    wrapped = Logits(model)
    training = name in TRAINING_MODE_EXPORT
    n = STEPS * MICRO * BATCH
    x = data(kind, n, 2)
    probe = data(kind, BATCH, 3)
    example = torch.from_numpy(x[:BATCH])
    # The start, before any export: exporting in training mode runs the forward, which moves
    # BatchNorm's running statistics; each export starts from it too.
    start = {k: v.detach().clone() for k, v in wrapped.state_dict().items()}
    from safetensors.torch import save_file  # the state_dict before training: train's output.start_state
    save_file({k: v.contiguous() for k, v in start.items()}, os.path.join(out, f"{name}.start.safetensors"))
    files = {"": os.path.join(out, f"{name}.onnx")}
    if not export:
        files = {v: os.path.join(out, f"{name}{v}.onnx") for v in ("", "_noopt", "_legacy", "_opset23")}
        files = {v: path for v, path in files.items() if os.path.exists(path)}
    else:
        export_default(wrapped, example, files[""], training)
        wrapped.load_state_dict(start)
        files["_noopt"] = os.path.join(out, f"{name}_noopt.onnx")
        export_default(wrapped, example, files["_noopt"], training, optimize=False)
        wrapped.load_state_dict(start)
        if export_legacy(wrapped, example, os.path.join(out, f"{name}_legacy.onnx"), training):
            files["_legacy"] = os.path.join(out, f"{name}_legacy.onnx")
        wrapped.load_state_dict(start)
        if name in OPSET23_EXPORT:  # the fused RMSNormalization and Attention of opset 23
            files["_opset23"] = os.path.join(out, f"{name}_opset23.onnx")
            export_default(wrapped, example, files["_opset23"], training, opset=23)
    wrapped.load_state_dict(start)
    with torch.no_grad():
        ref = Logits(model).double().eval()
        xp = torch.from_numpy(probe)
        probe_out = ref(xp.double() if xp.is_floating_point() else xp).numpy()
    y = targets(kind, probe_out.shape, n, 2)
    module_params = [k for k, _ in wrapped.named_parameters()]
    twins = {}  # a tied parameter's names (GPT-2's token embedding and LM head)
    for k, p in wrapped.named_parameters(remove_duplicate=False):
        twins.setdefault(id(p), []).append(k)
    twins = {names[0]: names for names in twins.values()}
    for variant, path in files.items():
        model.float()
        wrapped.load_state_dict(start)
        held = file_parameters(path, wrapped)
        train_mode = name not in EVAL_MODE_TRAINING
        import onnx
        from onnx import numpy_helper
        file_inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
        losses, params, buffers, state, probe_trained = reference(model, held, file_inits, x, y, probe,
                                                                  train_mode=train_mode)
        model.float()
        wrapped.load_state_dict(start)
        losses32 = reference(model, held, file_inits, x, y, probe, torch.float32, train_mode)[0]
        spread = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses32, losses))
        if spread > 1e-5:  # a tenth of the tests' 1e-4: float32 rounding must not move the path
            raise SystemExit(f"{name}{variant}: float32 and float64 losses differ by {spread:.2g}")
        arrays = {"x": x, "y": y, "probe": probe, "probe_out": probe_out.astype(np.float32),
                  "losses": np.array(losses), "module_params": np.array(module_params)}
        arrays.update({f"param.{k}": v for k, v in params.items()})
        arrays.update({f"buffer.{k}": v for k, v in buffers.items()})
        arrays.update({f"state.{k}": v for k, v in state.items()})
        arrays["probe_trained"] = probe_trained
        arrays.update({f"twins.{k}": np.array(v) for k, v in twins.items() if len(v) > 1})
        np.savez_compressed(os.path.join(out, f"{name}{variant}.npz"), **arrays)
        model.float()
        wrapped.load_state_dict(start)
        write_grads(wrapped, path, x, y)
        frozen = [k for k in module_params if k not in {param for param, _ in held.values()}]
        print(f"{name}{variant}: {len(params)} parameters trained, {len(frozen)} frozen (not in the file "
              f"by name); losses {', '.join(f'{v:.4f}' for v in losses)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--grads", action="store_true",
                    help="write only NAME[_VARIANT].grads.npz for the files in --out (tiny_noopt_min too)")
    ap.add_argument("--refs", action="store_true",
                    help="write the references (.npz, .grads.npz) of the files in --out without exporting again")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"torch {torch.__version__}")
    if args.grads:
        for name in args.names or NAMES + ["tiny_noopt_min"]:
            grads_for_committed(name, args.out)
        return
    for name in args.names or NAMES:
        make(name, args.out, export=not args.refs)


if __name__ == "__main__":
    sys.exit(main())
