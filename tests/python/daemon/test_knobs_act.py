"""Every accepted setting acts. The NVMe store's block size (the daemon's
storage.aio.block_size, or the job's offload.aio.block_size, which wins) reaches the store's command
line; settings that would not act (offload_param.device nvme without the optimizer states on NVMe,
pin_memory false) are refused at CreateJob, naming the field."""

from __future__ import annotations

import pathlib
import shutil
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "trainer"))
from daemon_process import DaemonProcess  # noqa: E402
from pipeline_testlib import build_model, write_pretokenized  # noqa: E402
from proc_tree import descendants_named  # noqa: E402
from test_training_jobs import spec  # noqa: E402

import offloadd  # noqa: E402


@pytest.fixture()
def workspace(tmp_path):
    build_model(tmp_path / "model", layers=2)
    write_pretokenized(tmp_path / "data.jsonl", n=64)
    return tmp_path


def store_cmdline(daemon_pid: int, exclude: set[int], timeout: float = 60) -> tuple[int, list[str]]:
    """The pid and arguments of an offloadd-store below the daemon that is not in `exclude` (the
    stores of jobs already cancelled, which may still be exiting). A process that has exited but
    not been reaped keeps its name and has an empty cmdline: it is skipped, not returned."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in descendants_named(daemon_pid, "offloadd-store"):
            if pid in exclude:
                continue
            try:
                raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if raw:
                return pid, raw.decode().rstrip("\0").split("\0")
        time.sleep(0.05)  # the store starts with the job's executor; no event announces it
    raise AssertionError("no offloadd-store below the daemon")


def nvme_job(ws: pathlib.Path, out: str, **aio) -> dict:
    s = spec(ws, out, steps=100000, save_steps=100000)
    s["offload"] = {"offload_optimizer": {"device": "nvme"}, **({"aio": aio} if aio else {})}
    return s


def test_block_size_reaches_the_store(binary_dir, workspace):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace)
    d.config_path.write_text(d.config_path.read_text().replace("storage:\n", "storage:\n  aio:\n    block_size: 128KiB\n", 1))
    d.start()
    try:
        with offloadd.Client(d.target) as c:
            seen: set[int] = set()
            for out, aio, want in (("daemon-default", {}, 128 * 1024), ("job-value", {"block_size": "64KiB"}, 64 * 1024)):
                job = c.create_job(nvme_job(workspace, out, **aio))
                assert job.spec.offload.aio.block_size == want  # what --validate-only shows acts
                pid, args = store_cmdline(d.proc.pid, exclude=seen)
                seen.add(pid)
                assert f"--block-size={want}" in args, args
                c.cancel_job(job.id)
                c.wait(job.id, timeout=120)
    finally:
        d.stop()


@pytest.mark.parametrize("offload,field,why", [
    ({"offload_param": {"device": "nvme"}}, "offload.offload_param.device", "needs offload_optimizer.device nvme"),
    ({"offload_optimizer": {"device": "cpu", "pin_memory": False}}, "offload.offload_optimizer.pin_memory",
     "not built"),
])
def test_settings_that_would_not_act_are_refused(binary_dir, workspace, offload, field, why):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    try:
        with offloadd.Client(d.target) as c:
            s = spec(workspace, "out", steps=2, save_steps=2)
            s["offload"] = offload
            with pytest.raises(offloadd.errors.InvalidArgument) as e:
                c.create_job(s)
            assert field in str(e.value), str(e.value)
            assert why in str(e.value), str(e.value)
    finally:
        d.stop()
