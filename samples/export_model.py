#!/usr/bin/env python3
"""Export a PyTorch nn.Module to ONNX the way `pipetrain train` trains it best, and record in the
file what pipetrain needs to give the trained weights back to the module.

Where it sits: user's nn.Module -> THIS -> model.onnx (+ model.onnx.data) -> `pipetrain train`
-> trained.onnx and trained.safetensors, which `module.load_state_dict(..., strict=True)` reads.

How it exports (torch 2.9+):
  * the default, torch.export-based exporter (`dynamo=True`), opset 20 unless --opset;
  * `optimize=False`. The exporter's optimizer rewrites the graph for inference, and every
    rewrite it makes to an initializer breaks the link between the file and the module's
    parameters: it folds `Transpose(weight)` into a new pre-transposed constant under a
    generated name (`val_N`), which pipetrain then trains as a copy no module parameter matches;
    it merges initializers of equal value into one (at random init every LayerNorm weight is all
    ones, so all of them would train as one shared tensor); and it folds BatchNorm into the
    convolution before it (the BatchNorm's weight, bias and running statistics vanish, and the
    convolution's weight becomes a product no module holds). Without the optimizer every
    parameter and buffer the forward reads is an initializer under its state_dict key;
  * the module in eval mode unless --train-mode (train_mode=True): eval leaves Dropout out and
    writes BatchNorm on running statistics, which pipetrain turns into its training form itself
    (batch statistics, running statistics updated as PyTorch updates them). --train-mode keeps
    Dropout in the file (pipetrain then draws seeded masks: not PyTorch's);
  * dim 0 of every input and output is the symbolic `batch`;
  * external data: the weights in PATH.data beside PATH.

What it records (the file's model-level metadata_props, each value JSON), because pipetrain
cannot infer it from the graph:
  pipetrain.format        "1"
  pipetrain.state_dict    [{"key", "dtype", "shape"}, ...]: every state_dict entry, in order
  pipetrain.initializers  {initializer name: [{"key", "transposed"}, ...]}: the state_dict keys
                          each initializer holds. Usually the name itself; a tied parameter
                          (an embedding shared with the LM head) is one initializer holding
                          two keys; a weight stored transposed (2-D, found by value when the
                          name is no key) has "transposed": true
  pipetrain.int_buffers   {key: {"start": [values, row-major], "counts_forwards_of": key or
                          absent}}: integer and bool buffers at export time. BatchNorm's
                          num_batches_tracked names its running_mean: pipetrain adds the
                          training-mode forwards it ran, as PyTorch counts them.
A state_dict key none of these covers (a parameter the forward never reads, a large integer
buffer) is listed by `pipetrain train`, which writes the rest: load that file with strict=False.

Library:
    from export_model import export_for_pipetrain
    export_for_pipetrain(module, example, "out/model.onnx")

Command line (run with a python that has torch 2.9+, onnx and onnxscript):
    python samples/export_model.py --module my_pkg.nets:Net --input-shape 2,3,32,32 -o net.onnx
    python samples/export_model.py --module path/to/nets.py:Net --kwargs '{"width": 8}' ...
    python samples/export_model.py --torchvision resnet18 --input-shape 2,3,224,224 -o r18.onnx
Options: --weights FILE (a state_dict to load first), --input-dtype int64 --vocab N (token ids
below N), --train-mode, --opset N, --seed S (module init before --weights).
"""

import argparse
import importlib
import importlib.util
import json
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn

FORMAT = "1"
MAX_INT_BUFFER = 1 << 16  # integer buffers up to this many elements are recorded by value


def dtype_name(t):
    """'float32', 'int64', 'bool', ... as numpy (and pipetrain's core/ir.h) name them."""
    return str(t).replace("torch.", "")


def check_module(module):
    """Raises ValueError for what pipetrain cannot train as PyTorch does."""
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            if m.momentum is None:
                raise ValueError(f"{name or 'module'}: BatchNorm with momentum=None (a cumulative "
                                 "average) is not what pipetrain updates; give it a momentum")


def initializer_keys(model, state, by_identity):
    """{initializer name: [(key, transposed), ...]} for every initializer holding module state.

    model: the exported onnx.ModelProto (external data loaded); state: the state_dict;
    by_identity: {key: [keys sharing its storage (ties)]}. An initializer named by a key holds
    that key and its ties. One under a generated name (an exporter that stores a weight
    transposed, a lifted constant) holds the entry whose value it equals, as is or transposed,
    among the entries no initializer holds by name; it holds nothing when none or several do."""
    from onnx import numpy_helper
    out, unmatched = {}, []
    for t in model.graph.initializer:
        if t.name in state:
            out[t.name] = [(k, False) for k in by_identity[t.name]]
        else:
            unmatched.append(t)
    held = {k for keys in out.values() for k, _ in keys}
    free = {k: s.detach().cpu().numpy() for k, s in state.items() if k not in held and s.is_floating_point()}
    for t in unmatched:
        v = numpy_helper.to_array(t)
        hits = []
        for k, a in free.items():
            if a.shape == v.shape and np.array_equal(a, v):
                hits.append((k, False))
            elif a.ndim == 2 and a.T.shape == v.shape and np.array_equal(a.T, v):
                hits.append((k, True))
        if hits and {k for k, _ in hits} == set(by_identity[hits[0][0]]):  # one tensor (and its ties)
            out[t.name] = hits
            for k, _ in hits:
                free.pop(k)
        elif len(hits) > 1:
            print(f"export_model: initializer '{t.name}' equals {len(hits)} state_dict entries "
                  f"({', '.join(k for k, _ in hits[:3])}...): not recorded", file=sys.stderr)
    return out


def ties(state):
    """{key: [every key whose tensor shares this one's storage, in state_dict order]}."""
    groups = {}
    for k, v in state.items():
        where = v.data_ptr() if v.numel() else k  # empty tensors share no data
        groups.setdefault((where, v.dtype, tuple(v.shape), tuple(v.stride())), []).append(k)
    return {k: g for g in groups.values() for k in g}


def int_buffers(module, state):
    """{key: {"start": [...], "counts_forwards_of": running_mean key}} for integer/bool entries."""
    counted = {}
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            prefix = f"{name}." if name else ""
            counted[prefix + "num_batches_tracked"] = prefix + "running_mean"
    out = {}
    for k, v in state.items():
        if v.is_floating_point() or v.is_complex() or v.numel() > MAX_INT_BUFFER:
            continue
        entry = {"start": [int(x) for x in v.detach().cpu().reshape(-1).tolist()]}
        if k in counted and counted[k] in state:
            entry["counts_forwards_of"] = counted[k]
        out[k] = entry
    return out


def module_metadata(module, model):
    """The pipetrain.* metadata_props for `model`, exported from `module`."""
    state = module.state_dict(keep_vars=True)
    entries = [{"key": k, "dtype": dtype_name(v.dtype), "shape": list(v.shape)} for k, v in state.items()]
    inits = initializer_keys(model, state, ties(state))
    return {
        "pipetrain.format": FORMAT,
        "pipetrain.state_dict": json.dumps(entries),
        "pipetrain.initializers": json.dumps(
            {name: [{"key": k, "transposed": tr} for k, tr in keys] for name, keys in inits.items()}),
        "pipetrain.int_buffers": json.dumps(int_buffers(module, state)),
    }


def export_for_pipetrain(module, example, path, train_mode=False, opset=None,
                         input_names=None, output_names=None):
    """Exports `module` on `example` (a tensor or a tuple of tensors, dim 0 the batch) to `path`
    (+ `path`.data) and records the metadata pipetrain reads. Returns the metadata dict.
    The module's train/eval mode is restored afterwards."""
    import onnx
    if not hasattr(torch.onnx, "export") or tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 6):
        raise RuntimeError(f"torch {torch.__version__}: the default exporter needs torch 2.6 or later")
    example = example if isinstance(example, tuple) else (example,)
    was_training = module.training
    module.train(train_mode)
    try:
        check_module(module)
        names = input_names or (["input"] if len(example) == 1 else [f"input{i}" for i in range(len(example))])
        batch = torch.export.Dim("batch")
        kw = {"opset_version": opset} if opset else {}
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with warnings.catch_warnings():  # training mode is asked for where it is on
            warnings.filterwarnings("ignore", message="Exporting a model while it is in training mode")
            torch.onnx.export(module, example, path, dynamo=True, optimize=False, external_data=True,
                              input_names=names, output_names=output_names or ["output"],
                              dynamic_shapes=tuple({0: batch} for _ in example), verbose=False, **kw)
        model = onnx.load(path)  # with external data: generated names are matched by value
        meta = module_metadata(module, model)
    finally:
        module.train(was_training)
    header = onnx.load(path, load_external_data=False)  # the data file stays as written
    del header.metadata_props[:]
    for k, v in meta.items():
        header.metadata_props.add(key=k, value=v)
    onnx.save(header, path)
    return meta


def load_class(spec):
    """'pkg.mod:Class' or 'path/to/file.py:Class' -> the class (or any callable making a module)."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise SystemExit(f"--module {spec}: write it as package.module:Class or file.py:Class")
    if where.endswith(".py"):
        spec_ = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(where))[0], where)
        if spec_ is None or not os.path.exists(where):
            raise SystemExit(f"--module {spec}: no file {where}")
        mod = importlib.util.module_from_spec(spec_)
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        spec_.loader.exec_module(mod)
    else:
        mod = importlib.import_module(where)
    if not hasattr(mod, name):
        raise SystemExit(f"--module {spec}: {where} has no {name}")
    return getattr(mod, name)


def build_module(args):
    kwargs = json.loads(args.kwargs) if args.kwargs else {}
    torch.manual_seed(args.seed)
    if args.torchvision:
        import torchvision
        module = torchvision.models.get_model(args.torchvision, weights=None, **kwargs)
    else:
        module = load_class(args.module)(**kwargs)
    if args.weights:
        module.load_state_dict(torch.load(args.weights, map_location="cpu"), strict=True)
    return module


def example_input(args):
    shape = [int(d) for d in args.input_shape.split(",")]
    g = torch.Generator().manual_seed(args.seed)
    if args.input_dtype == "float32":
        return torch.randn(shape, generator=g)
    return torch.randint(0, args.vocab, shape, generator=g, dtype=getattr(torch, args.input_dtype))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--module", help="package.module:Class or path/to/file.py:Class")
    src.add_argument("--torchvision", metavar="NAME", help="a torchvision model name (resnet18, ...)")
    ap.add_argument("--kwargs", help="JSON keyword arguments for the constructor")
    ap.add_argument("--weights", help="a state_dict file (torch.save) to load before exporting")
    ap.add_argument("--input-shape", required=True, help="example input shape, batch first: 2,3,32,32")
    ap.add_argument("--input-dtype", default="float32", choices=["float32", "int64", "int32"])
    ap.add_argument("--vocab", type=int, default=2, help="integer inputs: ids below this")
    ap.add_argument("--train-mode", action="store_true",
                    help="export in training mode (Dropout kept, BatchNorm in training form)")
    ap.add_argument("--opset", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--out", required=True, help="the .onnx file to write")
    args = ap.parse_args()
    try:
        module = build_module(args)
        example = example_input(args)
    except (OSError, ImportError, ValueError, TypeError, RuntimeError) as e:
        raise SystemExit(f"export_model: {type(e).__name__}: {e}; check --module/--torchvision, "
                         "--kwargs, --weights and --input-shape")
    meta = export_for_pipetrain(module, example, args.out, train_mode=args.train_mode, opset=args.opset)
    keys = json.loads(meta["pipetrain.state_dict"])
    held = {e["key"] for ks in json.loads(meta["pipetrain.initializers"]).values() for e in ks}
    held |= set(json.loads(meta["pipetrain.int_buffers"]))
    missing = [e["key"] for e in keys if e["key"] not in held]
    print(f"{args.out}: {len(keys)} state_dict entries, {len(keys) - len(missing)} held in the file"
          + (f"; not held: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}" if missing else ""))


if __name__ == "__main__":
    main()
