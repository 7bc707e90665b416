"""ONNX's node test cases through `pipetrain run`, as a user's model would go: import (folding,
the opset-18+ adaptations, the fused-op rewrites), then the CPU kernels.

Takes the cases tests/oracle/make_node_cases.py wrote (CASE/model.onnx and
CASE/test_data_set_0/{input,output}_K.pb) and sorts each into
  passed   every output within |have - want| <= atol + rtol |want| (the case's own tolerances,
           at least 1e-5 and 1e-4; integers and bools exactly). A random op (Bernoulli) has no
           reference values: its outputs must be 0 or 1, of the reference's dtype and shape;
  wrong    pipetrain exited 0 with a different number, shape or dtype: never allowed;
  refused  pipetrain exited 2 with a one-line error (the reason, less the case's own path and
           node, is tallied);
  crashed  any other exit: never allowed.
Then holds the result against a committed list of the cases that pass (--expected): a case on the
list that no longer passes fails the run; a case that passes and is not on the list is reported
(add it with --update). Prints the tallies, the refusals by reason, one line per wrong case, and
closes with 'N passed, M failed, K skipped' (failed: wrong, crashed and dropped from the list;
skipped: refused).

Usage: node_cases_run.py --pipetrain BIN --cases DIR --expected LIST [--update] [--report FILE]
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

RANDOM_OPS = {"Bernoulli", "RandomUniformLike", "RandomNormalLike", "RandomUniform", "RandomNormal"}


def read_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def npy_name(value_name):
    for c in "/:\\ ":
        value_name = value_name.replace(c, "_")
    return value_name + ".npy"


def reason_of(stderr, case_dir):
    """The error line with the case's path and node name taken out, so that like refusals
    tally together."""
    line = next((l for l in stderr.splitlines() if l.startswith("error:")), stderr.strip()[:200])
    line = line.replace(case_dir + "/model.onnx", "MODEL").replace(case_dir, "CASE")
    line = re.sub(r"node '[^']*'", "node", line)
    line = re.sub(r" in graph '[^']*'", "", line)
    line = re.sub(r"/\S+\.npy", "INPUT.npy", line)
    line = re.sub(r"input '[^']*'", "input", line)
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return line[:160]


def compare(have, want, rtol, atol, random_op):
    if have.shape != want.shape:
        return f"shape {have.shape}, reference {want.shape}"
    if have.dtype != want.dtype:
        return f"dtype {have.dtype}, reference {want.dtype}"
    if random_op:
        return None if np.all((have == 0) | (have == 1)) else "a draw that is not 0 or 1"
    if want.dtype.kind in "biu":
        return None if np.array_equal(have, want) else "integers differ"
    bad = ~np.isclose(have, want, rtol=rtol, atol=atol, equal_nan=True)
    if bad.any():
        i = np.unravel_index(np.argmax(bad), bad.shape)
        return f"{int(bad.sum())} of {want.size} values differ, first at {tuple(int(x) for x in i)}: {have[i]} vs {want[i]}"
    return None


def run_case(pipetrain, case_dir):
    """('passed' | 'wrong' | 'refused' | 'crashed', detail)."""
    model = onnx.load(os.path.join(case_dir, "model.onnx"))
    data = os.path.join(case_dir, "test_data_set_0")
    random_op = any(n.op_type in RANDOM_OPS for n in model.graph.node)
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    with tempfile.TemporaryDirectory() as tmp:
        args = [pipetrain, "run", os.path.join(case_dir, "model.onnx"), "--threads", "1", "--output", tmp]
        for k, info in enumerate(inputs):
            path = os.path.join(tmp, f"in_{k}.npy")
            np.save(path, read_pb(os.path.join(data, f"input_{k}.pb")))
            args += ["--input", f"{info.name}={path}"]
        try:
            res = subprocess.run(args, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return "crashed", "no answer in 60 s"
        if res.returncode == 2:
            lines = [l for l in res.stderr.splitlines() if l.strip()]
            if len(lines) != 1:
                return "crashed", f"a refusal of {len(lines)} lines: {res.stderr.strip()[:300]}"
            return "refused", reason_of(res.stderr, case_dir)
        if res.returncode != 0:
            return "crashed", f"exit {res.returncode}: {(res.stderr or res.stdout).strip()[:300]}"
        for k, out in enumerate(model.graph.output):
            want = read_pb(os.path.join(data, f"output_{k}.pb"))
            path = os.path.join(tmp, npy_name(out.name))
            if not os.path.exists(path):
                return "wrong", f"output '{out.name}' was not written"
            err = compare(np.load(path), want, 1e-4, 1e-5, random_op)
            if err:
                return "wrong", f"output '{out.name}': {err}"
    return "passed", ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipetrain", required=True)
    ap.add_argument("--cases", required=True, help="the folder make_node_cases.py wrote")
    ap.add_argument("--expected", required=True, help="the committed list of passing cases")
    ap.add_argument("--update", action="store_true", help="rewrite --expected with today's passing cases")
    ap.add_argument("--report", help="also write the per-case results here")
    args = ap.parse_args()
    names = sorted(d for d in os.listdir(args.cases) if os.path.isdir(os.path.join(args.cases, d)))
    results = {name: run_case(args.pipetrain, os.path.join(args.cases, name)) for name in names}
    by_kind = collections.Counter(kind for kind, _ in results.values())
    refusals = collections.Counter(detail for kind, detail in results.values() if kind == "refused")
    passing = sorted(n for n, (kind, _) in results.items() if kind == "passed")

    print(f"{len(names)} cases: {by_kind['passed']} passed ({100.0 * by_kind['passed'] / max(1, len(names)):.1f}%), "
          f"{by_kind['refused']} refused, {by_kind['wrong']} wrong, {by_kind['crashed']} crashed")
    old_opset = sum(1 for kind, detail in results.values() if kind == "refused" and "is outside the supported range" in detail)
    applicable = len(names) - old_opset
    print(f"of the {applicable} cases at the opsets pipetrain reads (the other {old_opset} are older): "
          f"{100.0 * by_kind['passed'] / max(1, applicable):.1f}% pass")
    print("refused, by reason:")
    for reason, count in refusals.most_common():
        print(f"  {count:4d}  {reason}")
    failures = []
    for name, (kind, detail) in results.items():
        if kind in ("wrong", "crashed"):
            failures.append(f"{kind.upper()} {name}: {detail}")
    if args.update:
        with open(args.expected, "w") as f:
            f.write("".join(n + "\n" for n in passing))
        print(f"wrote {len(passing)} passing cases to {args.expected}")
    else:
        with open(args.expected) as f:
            expected = [l.strip() for l in f if l.strip() and not l.startswith("#")]
        for name in expected:
            if name not in results:
                failures.append(f"MISSING {name}: on the list, but make_node_cases.py wrote no such case")
            elif results[name][0] != "passed":
                failures.append(f"DROPPED {name}: on the list of passing cases, now {results[name][0]}: {results[name][1]}")
        new = sorted(set(passing) - set(expected))
        if new:
            print(f"{len(new)} cases pass that the list does not hold (add them with --update): {', '.join(new[:10])}"
                  + (" ..." if len(new) > 10 else ""))
    if args.report:
        with open(args.report, "w") as f:
            for name, (kind, detail) in results.items():
                f.write(f"{kind:8s} {name} {detail}\n")
    for line in failures:
        print(line)
    print(f"{by_kind['passed']} passed, {len(failures)} failed, {by_kind['refused']} skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
