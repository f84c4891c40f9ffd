"""The daemon runs no LibTorch and no CUDA in its own process: training runs in
offloadd-executor processes, and the GPUs are probed by a short-lived executor. Its dynamic section
must not name LibTorch's or CUDA's libraries (a CUDA error, or a crash inside LibTorch, would
otherwise take every job and client stream down with the daemon)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

FORBIDDEN = re.compile(r"^(libtorch|libc10|libcudart|libcuda\.|libcuda_|libcublas|libcudnn|libnccl|libnvrtc)")


def needed(binary) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not installed")
def test_offloadd_needs_no_torch_or_cuda_library(binary_dir):
    daemon = binary_dir / "daemon" / "offloadd"
    if not daemon.is_file():
        pytest.skip(f"{daemon} is not built")
    libs = needed(daemon)
    assert libs, "readelf found no NEEDED entries: not a dynamic executable?"
    bad = [lib for lib in libs if FORBIDDEN.match(lib)]
    assert not bad, f"offloadd links {bad}; LibTorch and CUDA belong in offloadd-executor"


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not installed")
def test_the_executor_is_the_one_that_links_torch(binary_dir):
    executor = binary_dir / "executor" / "offloadd-executor"
    if not executor.is_file():
        pytest.skip(f"{executor} is not built")
    assert any(lib.startswith(("libtorch", "libc10")) for lib in needed(executor))
