"""The CPU AdamW kernel flavours (workers/adamw_kernel.h) as pytest parameters: every flavour runs
where this CPU has its instructions and is skipped, naming the missing ones, where it does not.
The instruction sets are read from /proc/cpuinfo here, independently of the C++ cpuid check, and
test_kernel_flavours.py checks that the two agree."""

import pathlib

import pytest

# flavour -> the /proc/cpuinfo flags it needs (PathSupported in workers/adamw_kernel.cc).
REQUIRED_FLAGS = {
    "portable": [],
    "avx2": ["avx2", "fma", "f16c"],
    "avx512": ["avx512f", "avx512bw", "avx512vl"],
    "avx512bf16": ["avx512f", "avx512bw", "avx512vl", "avx512_bf16"],
}


def cpu_flags() -> set:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def missing_flags(flavour: str) -> list:
    have = cpu_flags()
    return [f for f in REQUIRED_FLAGS[flavour] if f not in have]


def supported() -> list:
    """Fastest first, as SupportedPaths() orders them."""
    return [k for k in ("avx512bf16", "avx512", "avx2", "portable") if not missing_flags(k)]


def params(flavours=tuple(REQUIRED_FLAGS)) -> list:
    out = []
    for k in flavours:
        missing = missing_flags(k)
        out.append(pytest.param(k, id=k, marks=pytest.mark.skipif(
            bool(missing), reason=f"AdamW kernel {k}: this CPU lacks {', '.join(missing)}")))
    return out
