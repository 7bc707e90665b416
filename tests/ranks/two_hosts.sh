#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair, one rank in each, MPI
# over TCP between them (no shared memory: Open MPI sees two nodes). mpirun starts in the first
# and reaches the second through a launch agent that enters its namespace (nsenter), where a
# cluster's mpirun would use ssh. The charlm sample trained for 3 steps on 2 stages this way gives
# the very bytes of one process; the rank on the second host killed mid-run ends the job within
# 60 s, the survivor's line naming the last step every rank completed.
#
#   tests/ranks/two_hosts.sh PIPETRAIN MPIRUN     (ctest: mpi.two_hosts_netns; needs root)
#
# Exit 0 when both hold, 1 when not, 77 (ctest: skipped) where network namespaces cannot be
# made (not root, or no iproute2 or util-linux).
set -euo pipefail
pipetrain=$1 mpirun=$2
cd "$(dirname "$0")/../.."

if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
  echo "two_hosts: needs root, iproute2 and util-linux (unshare, nsenter); skipped"; exit 77
fi
work=$(mktemp -d /tmp/pt_two_hosts.XXXXXX)
# Each namespace lives as long as a process holding it (no /run/netns mounts, which a chroot such
# as CI's fresh root cannot make); the veth pair and the namespaces go with the processes.
holders=()
cleanup() {
  for p in "${holders[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
for i in 0 1; do
  unshare --net sleep 100000 &
  holders+=($!)
done
sleep 0.2
for p in "${holders[@]}"; do
  [ "$(readlink /proc/$p/ns/net)" != "$(readlink /proc/self/ns/net)" ] ||
    { echo "two_hosts: unshare --net made no network namespace; skipped"; exit 77; }
done
in_ns() { local p=$1; shift; nsenter --net="/proc/$p/ns/net" "$@"; }
a=pt$$a b=pt$$b  # interface names, unique per run (at most 15 characters)
ip link add "$a" type veth peer name "$b"
ip link set "$a" netns "${holders[0]}"
ip link set "$b" netns "${holders[1]}"
in_ns "${holders[0]}" ip addr add 10.99.0.1/24 dev "$a"
in_ns "${holders[1]}" ip addr add 10.99.0.2/24 dev "$b"
in_ns "${holders[0]}" ip link set "$a" up
in_ns "${holders[1]}" ip link set "$b" up
for p in "${holders[@]}"; do in_ns "$p" ip link set lo up; done

# The agent mpirun calls as it would call ssh: `agent HOST COMMAND...`, HOST being an address.
cat >"$work/agent.sh" <<AGENT
#!/bin/sh
host=\$1; shift
case \$host in
  10.99.0.1) exec nsenter --net=/proc/${holders[0]}/ns/net sh -c "\$*" ;;
  10.99.0.2) exec nsenter --net=/proc/${holders[1]}/ns/net sh -c "\$*" ;;
  *) echo "two_hosts agent: unknown host \$host" >&2; exit 1 ;;
esac
AGENT
chmod +x "$work/agent.sh"
printf '10.99.0.1 slots=1\n10.99.0.2 slots=1\n' >"$work/hosts"

sets=(--set steps=3 --set pipeline.stages=2 --set pipeline.chunks=1 --set pipeline.schedule=1f1b
      --set checkpoint.dir= --set output.trace= --set output.timeline= --set output.metrics= -q)
bin=$(realpath "$pipetrain")
# mpirun started in the first namespace: one rank per host, TCP between them.
launch=(in_ns "${holders[0]}" "$mpirun" --allow-run-as-root -n 2 --hostfile "$work/hosts"
        --mca plm_rsh_agent "$work/agent.sh" --mca btl self,tcp
        --mca oob_tcp_if_include 10.99.0.0/24 --mca btl_tcp_if_include 10.99.0.0/24)
"$pipetrain" train samples/charlm/train.yaml "${sets[@]}" --set "output.model=$work/one.onnx" >/dev/null
"${launch[@]}" --tag-output \
  sh -c 'echo "rank on $(ip -o -4 addr show | grep -o "10\.99\.0\.[0-9]*")"; exec "$0" "$@"' \
  "$bin" train samples/charlm/train.yaml "${sets[@]}" --set "output.model=$work/two.onnx" \
  >"$work/log" 2>&1 || { cat "$work/log"; echo "two_hosts: the run across two namespaces failed"; exit 1; }
grep -h "rank on" "$work/log" | sort
hosts=$(grep -c -e 'rank on 10.99.0.1' -e 'rank on 10.99.0.2' "$work/log" || true)
[ "$hosts" = 2 ] || { cat "$work/log"; echo "two_hosts: the ranks did not run one per namespace"; exit 1; }
for f in one.onnx one.safetensors; do
  cmp "$work/$f" "$work/${f/one/two}" || { echo "two_hosts: ${f/one/two} differs from one process's"; exit 1; }
done
echo "two_hosts: 2 ranks in 2 network namespaces over TCP: the bytes of one process"

# The rank on the second host killed mid-run: the first stops within 60 s with one line naming
# the last step every rank completed (mpirun's own line names the lost rank). One CI run in about
# thirty had a try end as it should (a non-zero exit within seconds, mpirun's line naming the lost
# rank, its note that a process returned a non-zero exit code: the survivor's own exit) but with
# nothing of the survivor's in mpirun's output, neither this line nor Open MPI's peer-disconnect
# warning (50 tries here, idle, loaded and killed at other points of a step, on this machine and
# in a fresh root, never did); a later CI run under AddressSanitizer, whose slower survivor gives
# mpirun more time to end it first, had two such tries in a row. Such a try is shown and run
# again, up to three tries; three in a row fail the test, as does any other outcome.
kill_try() {  # $1: the try's number. Exit 0: as it should; 2: the line missing; 1: anything else.
  local marker="$work/long$1.onnx" log="$work/killed$1.log" metrics="$work/killed$1.jsonl"
  "${launch[@]}" "$bin" train samples/charlm/train.yaml "${sets[@]}" --set steps=100000 \
    --set "output.model=$marker" --set "output.metrics=$metrics" >"$log" 2>&1 &
  local run=$! victim="" p
  for _ in $(seq 300); do
    for p in $(pgrep -f "train .*$marker" || true); do
      [ "$(readlink "/proc/$p/ns/net")" = "$(readlink "/proc/${holders[1]}/ns/net")" ] && \
        [ "$(tr '\0' ' ' <"/proc/$p/cmdline" | cut -d' ' -f1)" = "$bin" ] && victim=$p
    done
    [ -n "$victim" ] && break
    sleep 0.1
  done
  [ -n "$victim" ] || { cat "$log"; echo "two_hosts: no rank found in the second namespace"; return 1; }
  # A step done (rank 0's first metrics line), however late a loaded machine starts the ranks.
  for _ in $(seq 600); do [ -s "$metrics" ] && break; sleep 0.2; done
  [ -s "$metrics" ] || { cat "$log"; echo "two_hosts: no step done in 120 s"; return 1; }
  local t0=$SECONDS code=0
  kill -9 "$victim"
  wait "$run" || code=$?
  local elapsed=$((SECONDS - t0)) line ended=false
  line=$(grep -E "^interrupted: mpirun stopped every rank after step [0-9]+, the last every rank completed .*a rank lost on another host" "$log" || true)
  [ "$code" != 0 ] && [ "$elapsed" -le 60 ] && ended=true
  if $ended && [ -n "$line" ]; then
    echo "two_hosts: the rank on the second host killed: exit $code in $elapsed s; $line"
    return 0
  fi
  cat "$log"
  echo "two_hosts: after the kill (try $1): exit $code in $elapsed s, the survivor's line: '${line}'"
  $ended && grep -q "process rank 1 .* exited on signal 9" "$log" && return 2
  return 1
}
status=2
for try in 1 2 3; do
  [ "$status" = 2 ] || break
  [ "$try" = 1 ] || echo "two_hosts: the survivor's line did not come through mpirun; once more"
  status=0
  kill_try "$try" || status=$?
done
[ "$status" = 0 ] || exit 1
