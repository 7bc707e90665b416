"""The machine a benchmark's figures come from, for the first line of its output: the CPU's model
name, family and model, and the widest vector ISA its programs ran, which is AVX2 under
bench/avx2.py however wide the CPU is (that script sets PT_BENCH_HELD_ISA in the environment of
the command it runs; /proc/cpuinfo still shows the machine's own flags there)."""
import os

HELD_ISA = "PT_BENCH_HELD_ISA"


def cpu_name():
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if ":" in line:
                k, v = (x.strip() for x in line.split(":", 1))
                info.setdefault(k, v)
    flags = info.get("flags", "").split()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    held = os.environ.get(HELD_ISA)
    if held:
        isa += f", held to {held} (bench/avx2.py)"
    return (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, "
            f"model {info.get('model', '?')}), {isa}")
