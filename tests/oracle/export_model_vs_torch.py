"""The whole round trip a PyTorch user takes: module -> samples/export_model.py -> `pipetrain train`
-> trained.safetensors -> module.load_state_dict(strict=True), against the same module trained
by torch.optim.

The fixtures (samples/export_model/NAME.onnx, exported by samples/export_model/make_fixtures.py
with torch 2.15) carry their module's record in metadata_props. For each:
  1. the start: the module (samples/export_model/modules.py, built here with this python's torch)
     gets the file's own initializers as its state_dict through the record (every key; integer
     buffers from their recorded start), loaded with strict=True;
  2. `pipetrain train` for STEPS steps of SGD with momentum and weight decay, M micro-batches of
     B rows, cross-entropy, no shuffling, writing trained.onnx and trained.safetensors;
  3. the reference: the module from the same start trained in float64 on the same micro-batches
     (gradients accumulated as sum(loss) / global count per micro-batch, BatchNorm in training
     mode updating its running statistics and num_batches_tracked per forward);
  4. the safetensors file, read here with numpy and json, loads into a fresh module with
     strict=True; every entry's update from the start equals the reference's within --tol
     relative to that update's own scale, plus float32's rounding (update_error;
     num_batches_tracked exactly), the trained ONNX holds the same values, and the two modules'
     outputs on a held-out input, in eval mode, agree within --tol.
Well-conditioning: torch in float32 must agree with float64 within tol/10 on the same checks,
and no BatchNorm output that a ReLU reads comes within KINK_MARGIN of zero (a ReLU input that
close could take the other branch in float32 and move the next step by far more than rounding).

Usage: export_model_vs_torch.py --pipetrain BIN --fixtures samples/export_model [--tol 1e-4]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
import torch.nn.functional as F
import yaml
from onnx import numpy_helper

STEPS, B, M, CLASSES = 3, 2, 2, 5
OPTIMIZER = dict(kind="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3)
KINK_MARGIN = 1e-6
SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
                      "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path):
    """({name: array}, metadata): the format's 8-byte length, JSON header, then the data."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    base, out, spans = 8 + n, {}, []
    assert base % 8 == 0, f"data starts at byte {base}, not a multiple of 8"
    for name, e in header.items():
        b, end = e["data_offsets"]
        dtype = np.dtype(SAFETENSORS_DTYPES[e["dtype"]])
        assert (base + b) % dtype.itemsize == 0, f"{name} at {base + b} is not aligned to {dtype.itemsize}"
        out[name] = np.frombuffer(blob[base + b:base + end], dtype=dtype).reshape(e["shape"]).copy()
        spans.append((b, end))
    spans.sort()
    assert [s[0] for s in spans] == [0] + [s[1] for s in spans[:-1]] and spans[-1][1] == len(blob) - base, \
        "data_offsets leave holes or overlap"
    return out, meta


def start_state(model):
    """The module's state_dict at export, rebuilt from the file through its pipetrain.* record."""
    props = {p.key: p.value for p in model.metadata_props}
    entries = json.loads(props["pipetrain.state_dict"])
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    state = {}
    for name, keys in json.loads(props["pipetrain.initializers"]).items():
        for k in keys:
            state[k["key"]] = inits[name].T if k["transposed"] else inits[name]
    for key, b in json.loads(props["pipetrain.int_buffers"]).items():
        e = next(e for e in entries if e["key"] == key)
        state[key] = np.array(b["start"], dtype=e["dtype"]).reshape(e["shape"])
    return {e["key"]: torch.from_numpy(np.array(state[e["key"]])) for e in entries}


def load(module, state, dtype):
    module.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=True)
    return module.to(dtype)


def torch_train(build, start, x, y, dtype):
    """(trained module, smallest |BatchNorm output| seen): STEPS steps, as pipetrain's contract."""
    module = load(build(), start, dtype).train()
    margin = [np.inf]
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.register_forward_hook(lambda _m, _i, o: margin.__setitem__(0, min(margin[0], float(o.abs().min()))))
    opt = torch.optim.SGD(module.parameters(), lr=OPTIMIZER["lr"], momentum=OPTIMIZER["momentum"],
                          weight_decay=OPTIMIZER["weight_decay"], foreach=False)
    for s in range(STEPS):
        rows = s * B * M + np.arange(B * M)
        opt.zero_grad(set_to_none=True)
        for k in range(M):
            mb = rows[k * B:(k + 1) * B]
            out = module(torch.from_numpy(x[mb]).to(dtype))
            (F.cross_entropy(out, torch.from_numpy(y[mb]), reduction="sum") / (B * M)).backward()
        opt.step()
    return module, margin[0]


# Trained values are compared by their update, not by their value: a parameter that training
# moves by a small fraction of its size (BERT's query weights: 6.6e-7 at a scale of 0.064 after
# 3 steps) would pass a bound relative to its largest value with a zero or wrong gradient. So
#     max|have - want| <= tol * max|want - start| + updates * ROUNDING_PER_UPDATE * max(|start|, |want|),
# the first term relative to PyTorch's update, the second what float32 cannot resolve. One
# update of a float32 tensor p rounds it to the nearest float, an error of at most half an ulp,
# 2^-24 |p|; the float64 reference stored as float32 is rounded once more, and the momentum
# buffer and the step's own product are float32 too. 4 such roundings per update bound that, so
# after n updates (optimizer steps for a parameter, training-mode forwards for a BatchNorm
# running statistic) the floor is n * 4 * 2^-24 * max|p|.
ROUNDING_PER_UPDATE = 4 * 2.0 ** -24


def update_error(have, want, start, updates, tol, floor=0.0):
    """(max|have - want|, its bound, the update's scale max|want - start|): the bound is tol times
    that scale (at least `floor`) plus `updates` float32 roundings at the tensor's magnitude."""
    have, want, start = (np.asarray(a, np.float64) for a in (have, want, start))
    if want.size == 0:
        return 0.0, 1.0, 0.0
    err = float(np.max(np.abs(have - want)))
    scale = float(np.max(np.abs(want - start)))
    magnitude = max(float(np.max(np.abs(want))), float(np.max(np.abs(start))))
    return err, tol * max(scale, floor) + updates * ROUNDING_PER_UPDATE * magnitude, scale


def relative(have, want):
    have, want = np.asarray(have, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(have - want))) / max(float(np.max(np.abs(want))), 1e-30)


def compare(state, ref_module, start, tol, what):
    """Failures of `state` ({key: array}) against the reference module's state_dict, each float
    entry by its update from `start` (update_error: STEPS optimizer steps for a parameter, one
    update per training-mode forward, STEPS * M, for a BatchNorm running statistic), and the
    worst (error / bound, key)."""
    failures, worst = [], (0.0, "")
    ref = {k: v.detach().numpy() for k, v in ref_module.state_dict().items()}
    if set(state) != set(ref):
        return [f"{what}: keys {sorted(set(state) ^ set(ref))[:4]} in one only"], worst
    params = {k for k, _ in ref_module.named_parameters()}
    for k, want in ref.items():
        if not np.issubdtype(want.dtype, np.floating):
            if not np.array_equal(state[k], want):
                failures.append(f"{what}: {k} is {state[k].tolist()}, torch {want.tolist()}")
            continue
        err, bound, scale = update_error(state[k], want, start[k].numpy(), STEPS if k in params else STEPS * M, tol)
        worst = max(worst, (err / bound, k))
        if err > bound:
            failures.append(f"{what}: {k} differs by {err:.3g} > {bound:.3g} (tol {tol:g} of its update {scale:.3g} "
                            f"+ float32 rounding)")
    return failures, worst


def run_pipetrain(args, fixture, tmp, x, y):
    np.save(os.path.join(tmp, "x.npy"), x)
    np.save(os.path.join(tmp, "y.npy"), y)
    cfg = {"model": os.path.abspath(fixture), "dims": {"batch": B}, "loss": {"kind": "cross_entropy"},
           "data": {"kind": "npy", "inputs": {"input": os.path.join(tmp, "x.npy")},
                    "targets": os.path.join(tmp, "y.npy"), "shuffle": False, "eval_fraction": 0.0},
           "optimizer": OPTIMIZER, "pipeline": {"stages": 1, "micro_batches": M}, "steps": STEPS,
           "seed": 0, "output": {"model": os.path.join(tmp, "trained.onnx")}}
    path = os.path.join(tmp, "train.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    res = subprocess.run([args.pipetrain, "train", path, "--quiet"], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"pipetrain train: exit {res.returncode}: {res.stderr.strip() or res.stdout.strip()}")
    want = f"trained weights -> {os.path.join(tmp, 'trained.safetensors')}"
    if want not in res.stdout:
        raise RuntimeError(f"pipetrain train did not print '{want}':\n{res.stdout}")
    return os.path.join(tmp, "trained.safetensors"), os.path.join(tmp, "trained.onnx")


def check(args, name):
    sys.path.insert(0, args.fixtures)
    from modules import MODULES, SHAPES  # noqa: E402
    build = MODULES[name]
    fixture = os.path.join(args.fixtures, f"{name}.onnx")
    model = onnx.load(fixture)
    start = start_state(model)
    rng = np.random.default_rng(0)
    shape = SHAPES[name][1:]
    x = rng.standard_normal((STEPS * B * M,) + shape).astype(np.float32)
    y = rng.integers(0, CLASSES, STEPS * B * M).astype(np.int64)
    probe = torch.from_numpy(rng.standard_normal((3,) + shape))
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        st_path, onnx_path = run_pipetrain(args, fixture, tmp, x, y)
        trained, meta = read_safetensors(st_path)
        in_onnx = {t.name: numpy_helper.to_array(t) for t in onnx.load(onnx_path).graph.initializer}
    ref64, margin = torch_train(build, start, x, y, torch.float64)
    ref32, _ = torch_train(build, start, x, y, torch.float32)
    with torch.no_grad():
        want = ref64.eval()(probe).numpy()
        noise_out = relative(ref32.eval()(probe.float()).numpy(), want)
        ours = load(build(), trained, torch.float64).eval()  # strict=True: every key, no other
        out_err = relative(ours(probe).numpy(), want)
    noise, noise_worst = compare({k: v.detach().numpy() for k, v in ref32.state_dict().items()}, ref64, start,
                                 args.tol / 10, "torch float32 vs float64")
    failures += noise
    if noise_out > args.tol / 10:
        failures.append(f"torch float32 vs float64: output relative error {noise_out:.3g}")
    if margin < KINK_MARGIN:
        failures.append(f"a BatchNorm output {margin:.2g} from ReLU's kink: choose other data")
    errs, worst = compare(trained, ref64, start, args.tol, "pipetrain vs torch float64")
    failures += errs
    if out_err > args.tol:
        failures.append(f"held-out output: relative error {out_err:.3g} > {args.tol:g}")
    for k, v in trained.items():  # the file and the trained model agree where names meet
        if k in in_onnx and not np.array_equal(in_onnx[k], v):
            failures.append(f"{k}: the safetensors value differs from the trained model's")
    if meta.get("format") != "pt":
        failures.append(f"__metadata__ {meta}: no format 'pt'")
    nbt = {k: int(v) for k, v in trained.items() if k.endswith("num_batches_tracked")}
    print(f"{name}: {len(trained)} entries loaded strictly; worst error / bound {worst[0]:.2f} ({worst[1]}); "
          f"held-out output {out_err:.2e}; torch float32 vs float64: error / bound {noise_worst[0]:.2f}, output "
          f"{noise_out:.2e}" + (f"; min |BN output| {margin:.2g}" if np.isfinite(margin) else "")
          + (f"; num_batches_tracked {nbt}" if nbt else ""))
    return [f"{name}: {f}" for f in failures]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--fixtures", required=True, help="samples/export_model")
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    failures = []
    for name in args.only or ["convbn", "block"]:
        try:
            failures += check(args, name)
        except RuntimeError as e:
            failures.append(f"{name}: {e}")
    for f in failures:
        print(f"FAIL {f}")
    print(f"{len(failures)} failures" if failures else "all passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
