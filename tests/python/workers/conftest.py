"""Shared helpers for the optimizer worker tests: locate offloadd-optim-tool, run it."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _tool() -> pathlib.Path:
    # Under ctest OFFLOADD_BINARY_DIR names the build being tested: use that one only.
    if os.environ.get("OFFLOADD_BINARY_DIR"):
        candidates = [pathlib.Path(os.environ["OFFLOADD_BINARY_DIR"])]
    else:
        candidates = [ROOT / "build", ROOT / "build-workers"]
    for d in candidates:
        p = d / "workers" / "offloadd-optim-tool"
        if p.exists():
            return p
    pytest.skip("offloadd-optim-tool is not built (ninja offloadd-optim-tool)")


@pytest.fixture(scope="session")
def tool():
    path = _tool()

    def run(*args, check=True):
        proc = subprocess.run([str(path), *map(str, args)], capture_output=True, text=True,
                              timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"{path.name} {' '.join(map(str, args))} failed:\n{proc.stderr}")
        return proc

    run.path = path
    return run


@pytest.fixture(scope="session")
def kernel_paths(tool):
    """Every code path this CPU supports (the tool checks cpuid)."""
    return json.loads(tool("paths").stdout)
