"""Jobs train in offloadd-executor processes. When an executor dies (here SIGKILL, as
the OOM killer or a CUDA fault would end it), the daemon stays up and serves other calls, and the
job starts again from its last checkpoint by itself, up to jobs.max_executor_restarts times; with
no restarts left it fails, its error naming the cause. Every executor start is a job event naming
its pid, rank and GPU."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "trainer"))
from daemon_process import DaemonProcess  # noqa: E402
from pipeline_testlib import build_model, write_pretokenized  # noqa: E402
from test_training_jobs import Events, logs, progress, spec  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

S = job_pb2
STARTED = re.compile(r"executor started: pid (\d+) rank (\d+) gpu (\S+)")


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


JOB = dict(steps=40, save_steps=4, accum=4)  # killed after step 4: 36 slow steps to spare


def executor_pids(events) -> list[int]:
    return [int(m.group(1)) for m in (STARTED.search(x) for x in logs(events)) if m]


def kill_executor_after_checkpoint(c: offloadd.Client, job_id: str) -> tuple[Events, int]:
    """Watches the job until its first checkpoint, then SIGKILLs its executor. The job's steps are
    four micro-batches (JOB), so the kill lands well before its last step even on a loaded
    machine: with one micro-batch the 36 steps after checkpoint 4 are a few hundred ms, and the
    event's way to this thread can take longer under load."""
    ev = Events(c, job_id)
    ev.wait_for(lambda e: e.HasField("checkpoint_saved"), timeout=180)
    started = ev.wait_for(lambda e: e.HasField("log") and STARTED.search(e.log.message))
    pid = int(STARTED.search(started.log.message).group(1))
    assert STARTED.search(started.log.message).group(2) == "0"
    # The executor is the daemon's child, not the daemon itself.
    with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    assert ppid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    return ev, pid


def test_killed_executor_resumes_from_its_last_checkpoint(binary_dir, workspace):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    try:
        with offloadd.Client(d.target) as c:
            job = c.create_job(spec(workspace, "out", **JOB))
            ev, pid = kill_executor_after_checkpoint(c, job.id)
            # The daemon lives on and answers.
            assert d.proc.poll() is None
            assert c.node_info().hostname
            assert c.get_job(job.id).state in (S.JOB_STATE_RUNNING, S.JOB_STATE_SUCCEEDED)
            done = c.wait(job.id, timeout=300)
            ev.join()
            messages = logs(ev.events)
            assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, messages[-10:], d.log()[-3000:])
            restart = [m for m in messages if "restarting the job from its last checkpoint" in m]
            assert len(restart) == 1, messages
            assert f"pid {pid}" in restart[0] and "killed by signal 9" in restart[0], restart
            assert "(restart 1 of 2)" in restart[0]
            pids = executor_pids(ev.events)
            assert len(pids) == 2 and pids[0] == pid and pids[1] != pid, messages
            resumed = [m for m in messages if m.startswith("resuming from ")]
            assert resumed and re.search(r"checkpoint-\d+$", resumed[-1]), messages
            # Every step is reported, none twice after the restart.
            steps = [p.step for p in progress(ev.events)]
            assert steps == list(range(1, 41)), steps
    finally:
        d.stop()


def test_killed_executor_fails_the_job_when_no_restart_is_left(binary_dir, workspace):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace,
                      extra_yaml="jobs:\n  max_executor_restarts: 0\n").start()
    try:
        with offloadd.Client(d.target) as c:
            job = c.create_job(spec(workspace, "out", **JOB))
            ev, pid = kill_executor_after_checkpoint(c, job.id)
            done = c.wait(job.id, timeout=120)
            assert done.state == S.JOB_STATE_FAILED, done
            assert "killed by signal 9" in done.error.message, done.error
            assert f"pid {pid}" in done.error.message
            assert "max_executor_restarts is 0" in done.error.message
            # The daemon still runs jobs: a second one trains to the end.
            again = c.create_job(spec(workspace, "out2", steps=3, save_steps=10))
            assert c.wait(again.id, timeout=120).state == S.JOB_STATE_SUCCEEDED
    finally:
        d.stop()
