"""The Debian package under test, built once per session (test_deb.py, test_fresh_root.py).

scripts/build_deb.sh builds it with debhelper (dpkg-buildpackage on debian/, copied into a temporary
directory) from the configured and built tree: about 7 minutes for the CUDA flavour on two shared
cores, and up to 10 GB of disk at the peak, removed at the end. OFFLOADD_DEB=path/to/offloadd_*.deb
tests that package instead of building one."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deb_testlib import BUILD, PROGRAMS, SOURCE, run  # noqa: E402


@pytest.fixture(scope="session")
def deb(tmp_path_factory):
    if os.environ.get("OFFLOADD_DEB"):
        yield pathlib.Path(os.environ["OFFLOADD_DEB"])
        return
    if not (BUILD / "CMakeCache.txt").exists():
        pytest.skip(f"{BUILD} is not configured (or set OFFLOADD_DEB)")
    missing = [p for p in PROGRAMS if not list(BUILD.glob(f"*/{p}"))]
    if missing:
        pytest.skip(f"not built yet: {missing} (cmake --build {BUILD} --target offloadd_installables)")
    tools = [t for t in ("dpkg-buildpackage", "dh", "help2man") if not shutil.which(t)]
    if tools:
        pytest.skip(f"{tools} not found: install dpkg-dev, debhelper and help2man (scripts/setup.sh)")
    out = tmp_path_factory.mktemp("package")
    r = run([SOURCE / "scripts/build_deb.sh", BUILD, out], timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    debs = list(out.glob("offloadd_*.deb"))
    assert len(debs) == 1, r.stdout
    yield debs[0]
    shutil.rmtree(out, ignore_errors=True)
