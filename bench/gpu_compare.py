"""Compares the initializers of two ONNX models (a CUDA run's trained model against a CPU run's),
for scripts/gpu_check.sh.

For every float initializer: max|a - b| / max(max|b|, 1e-30) (relative to the tensor's largest
value); other dtypes must be equal. Prints one line: the worst relative difference, the tensor it
is in, how many tensors are bit-identical, and PASS/FAIL against --tol; with --exact, any
difference fails. Exits 1 on FAIL, 2 when a file cannot be read.

Reads the models with the onnx package when it is installed, else with a minimal protobuf reader
here (ModelProto.graph.initializer: name, dims, data_type, raw_data or float/int64/int32 data),
since the GPU machine may have numpy but no onnx.

With --update-from INIT.onnx (the model both runs started from) the training updates are compared
instead: over every float initializer, ||(A - INIT) - (B - INIT)|| / ||B - INIT|| (2-norms over all
tensors together), against --tol. That is the check for a run in a lower precision (bf16 GEMMs),
whose parameters differ from the fp32 run's by a fraction of the update, not of the weight.

Usage: gpu_compare.py A.onnx B.onnx [--tol 1e-3] [--exact | --update-from INIT.onnx]
"""
import argparse
import os
import struct
import sys

import numpy as np

DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 6: np.int32, 7: np.int64, 9: np.bool_,
          10: np.float16, 11: np.float64}


def varint(buf, i):
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, i
        shift += 7


def fields(buf):
    """(field number, wire type, value) of a protobuf message: ints for varints, bytes else."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield num, wire, v


def packed_varints(v):
    out, i = [], 0
    while i < len(v):
        x, i = varint(v, i)
        out.append(x)
    return out


def tensor(buf, base_dir):
    name, dims, dtype, raw, floats, ints64, ints32 = "", [], 1, None, [], [], []
    location, external = 0, {}
    for num, wire, v in fields(buf):
        if num == 1:
            dims += packed_varints(v) if wire == 2 else [v]
        elif num == 2:
            dtype = v
        elif num == 8:
            name = v.decode()
        elif num == 9:
            raw = bytes(v)
        elif num == 4:
            floats += list(struct.unpack(f"<{len(v) // 4}f", v)) if wire == 2 else [
                struct.unpack("<f", v)[0]]
        elif num == 7:
            ints64 += packed_varints(v) if wire == 2 else [v]
        elif num == 5:
            ints32 += packed_varints(v) if wire == 2 else [v]
        elif num == 13:
            kv = dict((n, bytes(x).decode()) for n, _, x in fields(v))
            external[kv.get(1, "")] = kv.get(2, "")
        elif num == 14:
            location = v
    dt = DTYPES[dtype]
    if location == 1:
        with open(os.path.join(base_dir, external["location"]), "rb") as f:
            f.seek(int(external.get("offset", 0)))
            n = int(external["length"]) if "length" in external else -1
            raw = f.read(n)
    if raw is not None:
        a = np.frombuffer(raw, dtype=dt)
    elif floats:
        a = np.array(floats, dtype=dt)
    elif ints64:
        a = np.array([x - (1 << 64) if x >= 1 << 63 else x for x in ints64], dtype=dt)
    else:
        a = np.array([x - (1 << 64) if x >= 1 << 63 else x for x in ints32], dtype=dt)
    return name, a.reshape(dims)


def initializers(path):
    try:
        import onnx
        from onnx import numpy_helper
        return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    except ImportError:
        pass
    with open(path, "rb") as f:
        model = f.read()
    out = {}
    for num, _, graph in fields(model):
        if num != 7:
            continue
        for gnum, _, t in fields(graph):
            if gnum == 5:
                name, a = tensor(t, os.path.dirname(path))
                out[name] = a
    return out


def compare_updates(a, b, init, tol):
    num = den = 0.0
    for name, want in b.items():
        if not np.issubdtype(want.dtype, np.floating) or name not in init:
            continue
        start = init[name].astype(np.float64)
        da, db = a[name].astype(np.float64) - start, want.astype(np.float64) - start
        num += float(np.sum((da - db) ** 2))
        den += float(np.sum(db ** 2))
    if den == 0:
        print("FAIL the reference run changed no parameter")
        return 1
    err = (num / den) ** 0.5
    ok = err <= tol
    print(f"{'PASS' if ok else 'FAIL'} update error {err:.3e} (||dA - dB|| / ||dB||, tol {tol:g})")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--update-from")
    args = ap.parse_args()
    try:
        a, b = initializers(args.a), initializers(args.b)
        init = initializers(args.update_from) if args.update_from else None
    except (OSError, ValueError, KeyError) as e:
        print(f"ERROR cannot read: {e}")
        return 2
    if a.keys() != b.keys():
        print(f"FAIL initializers in one only: {sorted(a.keys() ^ b.keys())[:3]}")
        return 1
    if init is not None:
        return compare_updates(a, b, init, args.tol)
    worst, worst_name, identical = 0.0, "-", 0
    for name, want in b.items():
        have = a[name]
        if have.shape != want.shape or have.dtype != want.dtype:
            print(f"FAIL {name}: {have.dtype}{have.shape} vs {want.dtype}{want.shape}")
            return 1
        if np.array_equal(have, want):
            identical += 1
            continue
        if not np.issubdtype(want.dtype, np.floating):
            print(f"FAIL {name}: integer values differ")
            return 1
        scale = max(float(np.max(np.abs(want.astype(np.float64)))), 1e-30)
        d = float(np.max(np.abs(have.astype(np.float64) - want.astype(np.float64)))) / scale
        if d > worst:
            worst, worst_name = d, name
    ok = identical == len(b) if args.exact else worst <= args.tol
    verdict = "PASS" if ok else "FAIL"
    bound = "bit-identical" if args.exact else f"tol {args.tol:g}"
    print(f"{verdict} worst {worst:.3e} in {worst_name}; {identical}/{len(b)} tensors identical "
          f"({bound})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
