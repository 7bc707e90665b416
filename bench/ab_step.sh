#!/usr/bin/env bash
# Two pipetrain builds taking turns on one training config: A B A B ..., each turn a fresh
# process training STEPS steps; prints each turn's median step (ms, the steps after the first)
# and, at the end, both medians and how often B was lower. For a change's before and after on a
# machine whose speed drifts between runs.
#
#   bench/ab_step.sh CONFIG TURNS BINARY_A BINARY_B [STEPS]
#
# e.g. with the configs `bench/cpu_step.py --out DIR` leaves (DIR/d256_p1_t2.yaml: d 256, one
# stage of two threads):
#   git stash; ninja -C build pipetrain; cp build/pipetrain /tmp/pipetrain_before; git stash pop
#   ninja -C build pipetrain; bench/ab_step.sh DIR/d256_p1_t2.yaml 6 /tmp/pipetrain_before build/pipetrain
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
config=$1 turns=$2 a=$3 b=$4 steps=${5:-4}
for f in "$config" "$a" "$b"; do
  [ -e "$f" ] || { echo "ab_step.sh: $f: no such file" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
turn() {  # binary -> the turn's median step in ms
  "$1" train "$config" -q --set "steps=$steps" --set "output.metrics=$work/metrics.jsonl" >/dev/null
  python3 -c 'import json,sys; print("%.0f" % (1e3 * json.loads(open(sys.argv[1]).read().splitlines()[-1])["summary"]["step_s_median"]))' "$work/metrics.jsonl"
  rm -f "$work/metrics.jsonl"
}
as=() bs=()
for i in $(seq "$turns"); do
  x=$(turn "$a"); y=$(turn "$b")
  as+=("$x"); bs+=("$y")
  echo "turn $i: A $x ms, B $y ms"
done
python3 - "${#as[@]}" "${as[@]}" "${bs[@]}" <<'PY'
import statistics, sys
n = int(sys.argv[1]); a = [float(x) for x in sys.argv[2:2 + n]]; b = [float(x) for x in sys.argv[2 + n:]]
print(f"median A {statistics.median(a):.0f} ms, B {statistics.median(b):.0f} ms; "
      f"B lower in {sum(y < x for x, y in zip(a, b))} of {n}")
PY
