"""The systemd unit (deploy/offloadd.service), rendered as `cmake --install` renders it, keeps its
`systemd-analyze security` exposure below what the hardening achieved, and passes
`systemd-analyze verify`. Both run offline: no systemd needs to be running."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

# Achieved: 1.8 with systemd 252 (Debian 12); it was 5.9 before the hardening. Other systemd
# versions weigh the settings a little differently, hence the margin. Issue #16 asks for < 3.0.
MAX_EXPOSURE = 2.5
# The @VAR@ form that CMake's string(CONFIGURE ... @ONLY) replaces (deploy/CMakeLists.txt).
CMAKE_VARIABLE = re.compile(r"@[A-Za-z_0-9/.+-]+@")


def render(source_dir: pathlib.Path, out_dir: pathlib.Path, bindir: str) -> pathlib.Path:
    text = (source_dir / "deploy" / "offloadd.service").read_text()
    variables = {"OFFLOADD_BINDIR": bindir, "OFFLOADD_DOCDIR": "/usr/share/doc/offloadd"}
    text = CMAKE_VARIABLE.sub(lambda m: variables[m.group(0).strip("@")], text)
    unit = out_dir / "offloadd.service"
    unit.write_text(text)
    return unit


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze not installed (Debian package 'systemd')")
    return path


def test_unit_template_names_only_known_variables(source_dir):
    # `@system-service` and the like must not look like a CMake @VAR@ to string(CONFIGURE).
    text = (source_dir / "deploy" / "offloadd.service").read_text()
    assert set(CMAKE_VARIABLE.findall(text)) == {"@OFFLOADD_BINDIR@", "@OFFLOADD_DOCDIR@"}


def test_security_exposure(source_dir, tmp_path):
    tool = systemd_analyze()
    if "--offline" not in subprocess.run([tool, "--help"], capture_output=True, text=True).stdout:
        pytest.skip("systemd-analyze has no --offline (systemd < 250)")
    unit = render(source_dir, tmp_path, "/usr/bin")
    r = subprocess.run([tool, "security", "--offline=yes", "--no-pager", str(unit)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    score = re.search(r"Overall exposure level for offloadd\.service: ([0-9.]+)", r.stdout)
    assert score, r.stdout + r.stderr
    assert float(score.group(1)) < MAX_EXPOSURE, r.stdout


def test_verify(source_dir, tmp_path):
    tool = systemd_analyze()
    # verify checks that ExecStart's binary exists and is executable: point it at a stand-in.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "offloadd").write_text("#!/bin/sh\n")
    os.chmod(bindir / "offloadd", 0o755)
    unit = render(source_dir, tmp_path, str(bindir))
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, SYSTEMD_LOG_LEVEL="notice"))
    assert r.returncode == 0 and "offloadd.service" not in r.stderr, r.stdout + r.stderr
