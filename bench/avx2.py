"""Runs a comparison with every program in it held to AVX2, on a machine that has AVX-512.

onnxruntime picks its kernels by cpuid alone and has no switch to cap them; PyTorch and oneDNN
have switches, and pipetrain's own copies are picked by GCC's CPU test. To set pipetrain's AVX2
path against onnxruntime's and PyTorch's on an AVX-512 machine, this script makes copies under
--out of

    bin/pipetrain, bin/forward_bench   the build's, as a user on an AVX2 machine runs them
    lib/libdnnl.so.2                   the oneDNN the build links
    python/onnxruntime/                the onnxruntime package this Python imports

with each cpuid written as int3; nop and each xgetbv as int3; xchg ax,ax (found by objdump, so
only instructions are touched), builds hold.so from bench/avx2_hold.c, and runs the command with
that library preloaded: it answers each trap as a CPU without AVX-512 would. A copy run without
it stops on its first cpuid, so nothing runs half held. The command also gets PyTorch's and
glibc's own switches (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA,
GLIBC_TUNABLES), and the copies come first on PYTHONPATH and LD_LIBRARY_PATH. The
microarchitecture stays the machine's: an AVX2 Zen 3 or Skylake has its own caches and ports.

    .venv/bin/python bench/avx2.py -- .venv/bin/python bench/forward.py --bench out/avx2/bin/forward_bench
    .venv/bin/python bench/avx2.py -- .venv-export/bin/python bench/cpu_step.py --pipetrain out/avx2/bin/pipetrain
    .venv/bin/python bench/avx2.py --check    # show that a trapped program sees AVX2 only
"""
import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def load_segments(data):
    """(vaddr, file offset, size) of each PT_LOAD segment of an ELF64 file."""
    assert data[:4] == b"\x7fELF" and data[4] == 2, "not an ELF64 file"
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    segments = []
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if kind == 1:
            segments.append((vaddr, offset, filesz))
    return segments


TRAPS = {"cpuid": (b"\x0f\xa2", b"\xcc\x90"), "xgetbv": (b"\x0f\x01\xd0", b"\xcc\x66\x90")}


def write_traps(path):
    """Rewrites every cpuid and xgetbv of the ELF file at path as a trap; returns the counts."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    segments = load_segments(data)
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                             text=True, check=True).stdout
    counts = {name: 0 for name in TRAPS}
    for m in re.finditer(r"^\s*([0-9a-f]+):\s+(cpuid|xgetbv)\s*$", listing, re.M):
        vaddr = int(m.group(1), 16)
        offset = next(o + vaddr - v for v, o, size in segments if v <= vaddr < v + size)
        was, trap = TRAPS[m.group(2)]
        if data[offset:offset + len(was)] != was:
            sys.exit(f"avx2.py: {path}: objdump's {m.group(2)} at {vaddr:#x} is not at file "
                     f"offset {offset:#x}; the file's layout is not what this script reads")
        data[offset:offset + len(was)] = trap
        counts[m.group(2)] += 1
    with open(path, "wb") as f:
        f.write(data)
    return counts


def fresh(copy, source):
    return os.path.exists(copy) and os.path.getmtime(copy) >= os.path.getmtime(source)


def held_copy(source, copy):
    """A trapped copy of one file, remade when the source is newer."""
    if fresh(copy, source):
        return
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    shutil.copy2(source, copy + ".part")
    counts = write_traps(copy + ".part")
    os.replace(copy + ".part", copy)
    os.utime(copy)
    print(f"avx2.py: {os.path.relpath(copy)}: {counts['cpuid']} cpuid, {counts['xgetbv']} xgetbv",
          file=sys.stderr)


def linked_library(binary, name):
    for line in subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if parts and parts[0] == name and len(parts) >= 3:
            return os.path.realpath(parts[2])
    sys.exit(f"avx2.py: {binary} does not link {name}; build pipetrain first")


def prepare(build, out, binaries=True):
    """Makes hold.so and the trapped copies (pipetrain's where binaries); returns hold.so's path."""
    hold = os.path.join(out, "hold.so")
    source = os.path.join(ROOT, "bench", "avx2_hold.c")
    if not fresh(hold, source):
        os.makedirs(out, exist_ok=True)
        subprocess.run(["cc", "-O2", "-Wall", "-shared", "-fPIC", "-nostdlib", source, "-o", hold],
                       check=True)
    for name in ("pipetrain", "bench/forward_bench") if binaries else ():
        binary = os.path.join(build, name)
        if not os.path.exists(binary):
            sys.exit(f"avx2.py: {binary} is missing; build pipetrain first (README)")
        held_copy(binary, os.path.join(out, "bin", os.path.basename(name)))
    if binaries:
        held_copy(linked_library(os.path.join(build, "pipetrain"), "libdnnl.so.2"),
                  os.path.join(out, "lib", "libdnnl.so.2"))
    try:
        import onnxruntime
    except ImportError:
        return hold
    package = os.path.dirname(onnxruntime.__file__)
    copy = os.path.join(out, "python", "onnxruntime")
    for dirpath, _, files in os.walk(package):
        for f in files:
            if "__pycache__" in dirpath:
                continue
            src = os.path.join(dirpath, f)
            dst = os.path.join(copy, os.path.relpath(src, package))
            if ".so" in f:
                held_copy(src, dst)
            elif not fresh(dst, src):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(src, dst)
    return hold


def held_environment(out, hold):
    env = dict(os.environ)
    prepend = lambda key, path: os.pathsep.join([path] + ([env[key]] if env.get(key) else []))
    env["LD_PRELOAD"] = prepend("LD_PRELOAD", hold).replace(os.pathsep, " ")
    env["LD_LIBRARY_PATH"] = prepend("LD_LIBRARY_PATH", os.path.join(out, "lib"))
    env["PYTHONPATH"] = prepend("PYTHONPATH", os.path.join(out, "python"))
    env["PT_BENCH_HELD_ISA"] = "AVX2"  # bench/machine.py names it
    env["ATEN_CPU_CAPABILITY"] = "avx2"
    env["MKL_ENABLE_INSTRUCTIONS"] = "AVX2"
    env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    env["GLIBC_TUNABLES"] = ("glibc.cpu.hwcaps=-AVX512F,-AVX512CD,-AVX512BW,-AVX512DQ,-AVX512VL,"
                             "-AVX512_VNNI,-AVX512_BF16,-AVX512_FP16")
    return env


PROBE = r"""
#include <cpuid.h>
#include <stdio.h>
int main(void) {
  unsigned a, b, c, d, xcr0, high;
  __builtin_cpu_init();
  __cpuid_count(7, 0, a, b, c, d);
  __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(high) : "c"(0));
  printf("%d %d %d %d\n", __builtin_cpu_supports("avx512f") != 0, __builtin_cpu_supports("avx2") != 0,
         (b >> 16) & 1, (xcr0 & 0xE0) != 0);
  return 0;
}
"""

ORT_PROBE = r"""
import onnxruntime, sys
print(onnxruntime.__file__)
"""


def check(out, env):
    """Shows that a program's own CPU test, in a trapped copy, sees AVX2 and no AVX-512, and that
    the onnxruntime the command imports is the trapped copy."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(PROBE)
        probe = os.path.join(tmp, "probe")
        subprocess.run(["cc", "-O2", src, "-o", probe], check=True)
        plain = subprocess.run([probe], capture_output=True, text=True, check=True).stdout.split()
        write_traps(probe)
        held = subprocess.run([probe], env=env, capture_output=True, text=True, check=True).stdout.split()
    say = lambda v: (f"__builtin_cpu_supports avx512f {v[0]}, avx2 {v[1]}; cpuid AVX512F {v[2]}; "
                     f"XCR0 AVX-512 state {v[3]}")
    print(f"a probe as the machine is: {say(plain)}\nheld: {say(held)}")
    if held != ["0", plain[1], "0", "0"]:
        sys.exit("avx2.py: the hold did not take: a trapped probe sees AVX-512, or AVX2 where the machine has none")
    where = subprocess.run([sys.executable, "-c", ORT_PROBE], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    print(f"onnxruntime imported from {os.path.relpath(where)}")
    if not where.startswith(os.path.abspath(out)):
        sys.exit("avx2.py: the command would import an onnxruntime that is not held")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "avx2"))
    ap.add_argument("--check", action="store_true",
                    help="prepare hold.so and onnxruntime's copy, check the hold on a probe, run nothing")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    out = os.path.abspath(args.out)
    for tool in ("objdump", "cc", "ldd"):
        if not shutil.which(tool):
            sys.exit(f"avx2.py: {tool} is not on PATH; install build-essential (scripts/setup.sh does)")
    check_only = args.check or not command
    hold = prepare(os.path.abspath(args.build), out, binaries=not check_only)
    env = held_environment(out, hold)
    if check_only:
        check(out, env)
        return
    sys.exit(subprocess.run(command, env=env).returncode)


if __name__ == "__main__":
    main()
