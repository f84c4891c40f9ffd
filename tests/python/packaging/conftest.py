"""The Debian package under test, built once per session (test_deb.py, test_fresh_root.py).

OFFLOADD_DEB=path/to/offloadd_*.deb tests that package instead of building one (cpack -G DEB into a
temporary directory: about a minute and a half for the CUDA flavour on two cores, and up to 10 GB of
disk at the peak, removed at the end)."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deb_testlib import BUILD, PROGRAMS, run  # noqa: E402


@pytest.fixture(scope="session")
def deb(tmp_path_factory):
    if os.environ.get("OFFLOADD_DEB"):
        yield pathlib.Path(os.environ["OFFLOADD_DEB"])
        return
    config = BUILD / "CPackConfig.cmake"
    if not config.exists():
        pytest.skip(f"{config} not found: configure the build first (or set OFFLOADD_DEB)")
    missing = [p for p in PROGRAMS if not list(BUILD.glob(f"*/{p}"))]
    if missing:
        pytest.skip(f"not built yet: {missing} (cmake --build {BUILD} --target offloadd_installables)")
    out = tmp_path_factory.mktemp("package")
    r = run(["cpack", "-G", "DEB", "--config", config, "-B", out], timeout=900, cwd=BUILD)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # CPack's staging tree is as large as the installed package: gone at once, the rest at the
    # end (pytest would keep GBs of each of its last three runs).
    shutil.rmtree(out / "_CPack_Packages", ignore_errors=True)
    debs = list(out.glob("offloadd_*.deb"))
    assert len(debs) == 1, r.stdout
    yield debs[0]
    shutil.rmtree(out, ignore_errors=True)
