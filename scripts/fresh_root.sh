#!/usr/bin/env bash
# Runs a command in a clean clone of this repository's committed HEAD inside a fresh Debian 12
# root (debootstrap --variant=minbase bookworm, then chroot), as a newcomer's bare machine would:
# whatever this machine has installed by hand is not there, so a missing install step fails.
#
#   bash scripts/fresh_root.sh [COMMAND]     COMMAND defaults to "bash scripts/test.sh"
#
# The root reaches the package registries exactly as this machine does: its apt sources (the
# Debian mirror is read from them), pip's configuration, the CA certificates and resolv.conf are
# copied in; nothing else is. Uncommitted changes are not in the clone: commit first.
# Needs root (or sudo) for debootstrap, mount and chroot. The root lives under
# ${PT_FRESH_DIR:-${TMPDIR:-/tmp}/pipetrain-fresh-root.PID} and is removed afterwards unless
# PT_FRESH_KEEP=1. Exit status: COMMAND's (2 when the root cannot be made).
set -euo pipefail
cmd=${1:-bash scripts/test.sh}
top=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
work=${PT_FRESH_DIR:-${TMPDIR:-/tmp}/pipetrain-fresh-root.$$}
root=$work/root

fail() { echo "fresh_root: $*" >&2; exit 2; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || fail "needs root or sudo (debootstrap, mount, chroot)"
  SUDO="sudo"
fi

if ! command -v debootstrap >/dev/null; then
  echo "fresh_root: installing debootstrap"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq debootstrap >/dev/null
fi

# The Debian mirror this machine uses: deb822 sources first, then the one-line form.
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  mirror=$(awk '/^URIs:/ {print $2; exit}' "$f")
  [ -n "$mirror" ] && break
done
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || fail "no Debian mirror found in /etc/apt/sources.list{,.d}"

cleanup() {
  $SUDO umount "$root/dev/shm" 2>/dev/null || true
  $SUDO umount "$root/proc" 2>/dev/null || true
  [ "${PT_FRESH_KEEP:-0}" = 1 ] || $SUDO rm -rf "$work"
}
trap cleanup EXIT
$SUDO rm -rf "$work"
mkdir -p "$work"

t0=$SECONDS
echo "fresh_root: debootstrap bookworm (minbase) into $root"
$SUDO debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
  { tail -5 "$work/debootstrap.log" >&2; fail "debootstrap failed (log above)"; }

# The registries, reached as this machine reaches them.
if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
  $SUDO cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/"
  $SUDO truncate -s 0 "$root/etc/apt/sources.list"
elif [ -f /etc/apt/sources.list ]; then
  $SUDO cp /etc/apt/sources.list "$root/etc/apt/sources.list"
fi
[ -f /etc/pip.conf ] && $SUDO cp /etc/pip.conf "$root/etc/pip.conf"
$SUDO mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
$SUDO cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
$SUDO cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/" 2>/dev/null || true
$SUDO cp /etc/resolv.conf "$root/etc/" 2>/dev/null || true

# The committed HEAD as a clean clone, and ../shared beside it where this checkout has one.
$SUDO git clone -q "$top" "$root/root/project"
[ -d "$top/../shared" ] && $SUDO cp -r "$top/../shared" "$root/root/shared"
$SUDO mount -t proc proc "$root/proc"
# A machine's shared memory (MPI's shared-memory transport between ranks uses it).
$SUDO mkdir -p "$root/dev/shm" && $SUDO mount -t tmpfs -o size=1g tmpfs "$root/dev/shm"
echo "fresh_root: root ready in $((SECONDS - t0)) s; running '$cmd' on $(git -C "$top" log --oneline -1)"

set +e
$SUDO chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive /bin/bash -c "cd /root/project && $cmd"
rc=$?
set -e
echo "fresh_root: exit $rc after $((SECONDS - t0)) s"
exit "$rc"
