"""Shutdown is bounded and hostile input files cannot pin the daemon.

* SIGTERM stops the daemon within server.shutdown_grace_seconds whatever the running job does:
  here its optimizer worker is frozen (SIGSTOP), so the job can neither step nor pause. The job
  resumes on the next start.
* A named pipe (FIFO) or a device given as a dataset file, as the model's config.json or as a chat
  template is refused at CreateJob with an error naming the file, instead of blocking a request
  thread in open(2) for good; the daemon then still stops within the grace period.
Every wait is bounded: gRPC deadlines on the calls, timeouts on the process waits."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import stat
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "trainer"))
from daemon_process import DaemonProcess  # noqa: E402
from pipeline_testlib import build_model, write_pretokenized  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402
from proc_tree import descendants_named  # noqa: E402

S = job_pb2
GRACE_S = 5  # daemon_process.py's server.shutdown_grace_seconds
MARGIN_S = 5  # process exit, log flushing


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    return build_model(root / "model", layers=2), write_pretokenized(root / "data.jsonl", n=64)


@pytest.fixture()
def workspace(tmp_path, assets):
    model, data = assets
    shutil.copytree(model, tmp_path / "model")
    shutil.copy(data, tmp_path / "data.jsonl")
    return tmp_path


@pytest.fixture()
def daemon(binary_dir, workspace):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    yield d
    d.stop()


def spec(ws: pathlib.Path, *, steps: int = 5, model: str = "model", data: str = "data.jsonl",
         template: str = "", fmt: str = "pretokenized") -> dict:
    s = {
        "display_name": "bounded",
        "model": {"path": str(ws / model), "compute_dtype": "fp32"},
        "dataset": {"paths": [str(ws / data)], "format": fmt, "max_seq_length": 64},
        "training": {"learning_rate": 1e-3, "per_device_train_batch_size": 4, "max_steps": steps,
                     "max_grad_norm": 1.0, "logging_steps": 1, "save_steps": 100000},
        "output_dir": str(ws / "out"),
    }
    if template:
        s["dataset"]["template"] = str(ws / template)
    return s


children_named = descendants_named  # the helpers are the executor's children now


def stop_within_grace(d: DaemonProcess) -> float:
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    try:
        d.proc.wait(timeout=GRACE_S + MARGIN_S)
    except Exception:
        pytest.fail(f"offloadd still running {GRACE_S + MARGIN_S} s after SIGTERM "
                    f"(grace {GRACE_S} s):\n{d.log()[-3000:]}")
    took = time.monotonic() - t0
    print(f"offloadd exited with {d.proc.returncode} {took:.1f} s after SIGTERM")
    return took


def test_sigterm_stops_within_the_grace_period_with_a_frozen_job(binary_dir, workspace):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    frozen: list[int] = []
    try:
        with offloadd.Client(d.target, timeout=30) as c:
            job = c.create_job(spec(workspace, steps=100000))
            deadline = time.monotonic() + 60
            while c.get_job(job.id).progress.step < 2:
                assert time.monotonic() < deadline, d.log()[-3000:]
                time.sleep(0.1)  # polling a remote state; no event to wait on in this helper
        frozen = children_named(d.proc.pid, "offloadd-worker")
        assert frozen, "no optimizer worker found"
        for w in frozen:
            os.kill(w, signal.SIGSTOP)
        stop_within_grace(d)
        assert "did not stop within the grace period" in d.log(), d.log()[-3000:]
    finally:
        for w in frozen:
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass
        d.stop()
    # The job was interrupted, not lost: on the next start it is queued to run again.
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    try:
        with offloadd.Client(d.target, timeout=30) as c:
            assert c.get_job(job.id).state in (S.JOB_STATE_QUEUED, S.JOB_STATE_RUNNING)
            c.cancel_job(job.id)
        stop_within_grace(d)
    finally:
        d.stop()


@pytest.mark.parametrize("what", ["dataset", "config.json", "template", "device"])
def test_fifo_or_device_inputs_are_refused_at_create(daemon, workspace, what):
    ws = workspace
    kw = {}
    if what == "dataset":
        os.mkfifo(ws / "fifo.jsonl")
        kw["data"], named = "fifo.jsonl", "fifo.jsonl"
    elif what == "config.json":
        shutil.copytree(ws / "model", ws / "fifo_model")
        (ws / "fifo_model" / "config.json").unlink()
        os.mkfifo(ws / "fifo_model" / "config.json")
        kw["model"], named = "fifo_model", "config.json"
    elif what == "template":
        os.mkfifo(ws / "chat.jinja")
        kw["template"], kw["fmt"], named = "chat.jinja", "messages", "chat.jinja"
        (ws / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
        kw["data"] = "chat.jsonl"
    else:  # a character device (/dev/zero's numbers) inside the allowed roots
        os.mknod(ws / "zero.jsonl", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        kw["data"], named = "zero.jsonl", "zero.jsonl"
    with offloadd.Client(daemon.target, timeout=20) as c:
        t0 = time.monotonic()
        with pytest.raises(offloadd.OffloaddError) as e:
            c.create_job(spec(ws, **kw))
        took = time.monotonic() - t0
    print(f"{what}: refused in {took:.2f} s: {e.value}")
    assert e.value.code.name != "DEADLINE_EXCEEDED", f"CreateJob blocked on the {what} FIFO"
    assert named in str(e.value) and "not a regular file" in str(e.value), str(e.value)
    stop_within_grace(daemon)
