"""Helpers of the Debian package tests (test_deb.py, test_fresh_root.py): where the tree and the
build are, and running a command as a user of the installed package would."""

from __future__ import annotations

import os
import pathlib
import subprocess

SOURCE = pathlib.Path(os.environ.get("OFFLOADD_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[3]))
BUILD = pathlib.Path(os.environ.get("OFFLOADD_BINARY_DIR", SOURCE / "build"))
EXAMPLES = SOURCE / "examples" / "data"  # the demo's model and data, in the repository
PROGRAMS = ["offloadd", "offloadd-executor", "offloadd-worker", "offloadd-store", "offloadd-train", "offloadctl"]


def clean_env(**extra: str) -> dict:
    """The environment of a user of the installed package: no LD_LIBRARY_PATH, no build-tree Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    env.update(extra)
    return env


def run(cmd, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
