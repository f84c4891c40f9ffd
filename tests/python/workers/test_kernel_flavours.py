"""The flavour list the tests parametrize over (read from /proc/cpuinfo) is the one the C++
cpuid check selects from, and a forced flavour is refused by name where the CPU lacks it."""

import json

import kernel_flavours


def test_cpuinfo_flags_and_cpuid_agree(tool):
    assert json.loads(tool("paths").stdout) == kernel_flavours.supported()


def test_unsupported_flavour_is_refused_naming_the_instructions(tool):
    for flavour, missing in ((k, kernel_flavours.missing_flags(k)) for k in kernel_flavours.REQUIRED_FLAGS):
        r = tool("norm", f"--path={flavour}", check=False)  # fails later for a missing --n
        if missing:
            assert r.returncode != 0 and "needs instructions this CPU lacks" in r.stderr, r.stderr
        else:
            assert "needs instructions" not in r.stderr
