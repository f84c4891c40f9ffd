"""The job database under faults, with the real daemon:

* jobs.db deleted while the daemon runs: the daemon notices (at the next write, or within its
  5 s check), logs it, recreates the file from the database it has open, and a restart still lists
  every job with its events. While the file cannot be recreated (every write to the state
  directory failing, through the LD_PRELOAD shim), health is NOT_SERVING naming the file.
* the state directory failing while a job ends: GetJob shows how the job ended (it showed
  RUNNING), health is NOT_SERVING with the reason (it said SERVING), and the end is recorded
  once the directory takes writes again, durable across a restart."""

from __future__ import annotations

import errno
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from faultlib import (Events, FaultDaemon, build_fault_shim, make_assets, make_workspace, spec,  # noqa: E402
                      wait_until)

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

S = job_pb2


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("store_assets"))


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> pathlib.Path:
    return build_fault_shim(tmp_path_factory.mktemp("shim"))


@pytest.fixture()
def ws(tmp_path, assets) -> pathlib.Path:
    return make_workspace(tmp_path, assets)


def failing_state_dir(shim: pathlib.Path, ws: pathlib.Path, err: int) -> tuple[dict, pathlib.Path]:
    """The environment that makes every write and sync under <ws>/state fail with `err` while the
    returned arm file exists."""
    arm = ws / "arm"
    return {"LD_PRELOAD": str(shim), "OFFLOADD_FAULT_PREFIX": str(ws / "state") + "/",
            "OFFLOADD_FAULT_ARM": str(arm), "OFFLOADD_FAULT_ERRNO": str(err)}, arm


@pytest.mark.timeout(120)
def test_deleted_jobs_db_is_recreated_and_a_restart_lists_every_job(binary_dir, ws, figures):
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws)
    d.start()
    db = ws / "state" / "jobs.db"
    try:
        with offloadd.Client(d.target) as c:
            first = c.submit(spec(ws, "one", steps=2, save_steps=10, nvme=False), wait=True, timeout=60)
            assert first.state == S.JOB_STATE_SUCCEEDED, first.error
            inode = db.stat().st_ino
            db.unlink()  # an operator's mistake; the daemon keeps the unlinked file open
            figures.did.append("deleted jobs.db under a running daemon, then submitted a job")
            second = c.submit(spec(ws, "two", steps=2, save_steps=10, nvme=False), wait=True, timeout=60)
            assert second.state == S.JOB_STATE_SUCCEEDED, second.error
            wait_until(lambda: db.exists() and "recreated from the open database" in d.log(), 15,
                       "jobs.db recreated")
            assert db.stat().st_ino != inode
            log = d.log()
            assert "was deleted while the daemon ran" in log and str(db) in log, log[-3000:]
            assert c.health() == "SERVING" and c.node_info().serving_problem == ""
        d.stop()
        d.start()
        with offloadd.Client(d.target) as c:
            jobs = {j.id: j for j in c.list_jobs()}
            assert set(jobs) == {first.id, second.id}, jobs.keys()
            assert all(j.state == S.JOB_STATE_SUCCEEDED for j in jobs.values())
            steps = [e.progress.step for e in c.watch_job(first.id) if e.HasField("progress")]
            assert steps == [1, 2], steps
        figures.happened.append("the daemon logged the deletion and recreated jobs.db; after a restart both "
                                "jobs and their events are listed")
    finally:
        d.stop()


@pytest.mark.timeout(120)
def test_jobs_db_that_cannot_be_recreated_turns_health_not_serving(binary_dir, ws, shim, figures):
    env, arm = failing_state_dir(shim, ws, errno.EIO)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws, env=env)
    d.start()
    db = ws / "state" / "jobs.db"
    try:
        with offloadd.Client(d.target) as c:
            job = c.submit(spec(ws, "one", steps=2, save_steps=10, nvme=False), wait=True, timeout=60)
            arm.touch()
            db.unlink()
            # The scheduler's check finds it within 5 s; the copy into a new file fails (EIO).
            problem = wait_until(lambda: c.node_info().serving_problem, 20, "a serving problem")
            assert str(db) in problem and "cannot be recreated" in problem, problem
            assert c.health() == "NOT_SERVING"
            assert c.get_job(job.id).state == S.JOB_STATE_SUCCEEDED  # still served from the open file
            node = subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", d.target, "node"],
                                  capture_output=True, text=True, timeout=60)
            assert "health      NOT_SERVING: " in node.stdout and str(db) in node.stdout, node.stdout
            figures.happened.append(f"while it could not be recreated: NOT_SERVING, {problem[:200]}")
            arm.unlink()
            wait_until(lambda: c.health() == "SERVING", 20, "health SERVING once jobs.db is recreated")
            assert db.exists() and c.node_info().serving_problem == ""
        d.stop()
        d.start()
        with offloadd.Client(d.target) as c:
            assert [j.id for j in c.list_jobs()] == [job.id]
    finally:
        arm.unlink(missing_ok=True)
        d.stop()


@pytest.mark.timeout(180)
def test_state_dir_failing_at_a_jobs_end_shows_the_end_and_not_serving(binary_dir, ws, shim, figures):
    env, arm = failing_state_dir(shim, ws, errno.ENOSPC)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws, env=env)
    d.start()
    try:
        with offloadd.Client(d.target) as c:
            # The fault is armed once step 2 is reported, and must be before the job's end: 46 steps
            # to spare (with 10, a loaded machine could deliver the event after the end).
            job = c.create_job(spec(ws, "out", steps=48, save_steps=100, nvme=False))
            ev = Events(c, job.id)
            assert ev.wait_for(lambda e: e.HasField("progress") and e.progress.step >= 2, 60) is not None
            arm.touch()  # the state directory is "full" from here on
            wait_until(lambda: "cannot record it" in d.log(), 90, "the job's end refused by the store")
            shown = c.get_job(job.id)
            assert shown.state == S.JOB_STATE_SUCCEEDED, S.JobState.Name(shown.state)
            assert [j.state for j in c.list_jobs()] == [S.JOB_STATE_SUCCEEDED]
            assert c.health() == "NOT_SERVING"
            problem = c.node_info().serving_problem
            assert job.id in problem and "SUCCEEDED" in problem and "full" in problem, problem
            figures.happened.append(f"while the state dir was full: GetJob SUCCEEDED, NOT_SERVING: {problem[:200]}")
            arm.unlink()
            wait_until(lambda: c.health() == "SERVING", 30, "health SERVING once the end is recorded")
        d.stop()
        d.start()
        with offloadd.Client(d.target) as c:
            assert c.get_job(job.id).state == S.JOB_STATE_SUCCEEDED, "the end is durable"
    finally:
        arm.unlink(missing_ok=True)
        d.stop()
