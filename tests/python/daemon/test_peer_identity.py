"""Unix-socket clients are known by their user (security review): the daemon accepts its
socket's connections itself, reads each one's SO_PEERCRED and hands it to gRPC, so a job records
who submitted it ("unix:uid=<uid>"), server.max_active_jobs_per_client counts per local user, not
for every local user together, and a local user may cancel, pause or resume only its own jobs (root
and the daemon's user any). The second user's parts need root (to run a client as nobody)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402
from demo_model import write_demo  # noqa: E402

NOBODY = 65534


@pytest.fixture()
def workspace(shared_dir, source_dir):
    # Not pytest's tmp_path: its parents are 0700, and the second user must reach the socket.
    root = pathlib.Path(tempfile.mkdtemp(prefix="offloadd-peer-"))
    write_demo(root, shared_dir, source_dir)
    # A job's files are opened with its submitter's rights: the second user must be able
    # to read the model and data and to create its output directory.
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    root.chmod(0o777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def daemon(binary_dir, workspace):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace)
    config = d.config_path.read_text()
    # Any local user may connect (the test's second user); one active job per client.
    config = config.replace('unix_socket_mode: "0600"', 'unix_socket_mode: "0666"\n  max_active_jobs_per_client: 1')
    d.config_path.write_text(config)
    d.start()
    (workspace / "run").chmod(0o755)
    yield d
    d.stop()


def job_file(ws: pathlib.Path, name: str) -> pathlib.Path:
    # Long enough to stay RUNNING (or QUEUED behind it) for the whole test; cancelled at the end.
    spec = {"display_name": name, "model": {"path": str(ws / "stories260K")},
            "dataset": {"paths": [str(ws / "alpaca.json")], "format": "alpaca", "max_seq_length": 128},
            "training": {"learning_rate": 1e-4, "per_device_train_batch_size": 2, "max_steps": 100000},
            "output_dir": str(ws / f"out-{name}")}
    path = ws / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    path.chmod(0o644)
    return path


def ctl(binary_dir, daemon, *args, user=None):
    return subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", daemon.target, "-o", "json", *args],
                          capture_output=True, text=True, timeout=120, user=user)


def test_a_job_records_the_local_user_that_submitted_it(binary_dir, daemon, workspace):
    r = ctl(binary_dir, daemon, "submit", str(job_file(workspace, "mine")))
    assert r.returncode == 0, r.stdout + r.stderr + daemon.log()[-2000:]
    job = json.loads(r.stdout)
    try:
        assert job.get("submitted_by") == f"unix:uid={os.getuid()}", (job, daemon.log()[-1500:])
        got = json.loads(ctl(binary_dir, daemon, "get", job["id"]).stdout)
        assert got["submitted_by"] == f"unix:uid={os.getuid()}"
        table = subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", daemon.target, "get", job["id"]],
                               capture_output=True, text=True, timeout=60).stdout
        assert f"submitted by unix:uid={os.getuid()}" in table, table
        assert f"job {job['id']} created by unix:uid={os.getuid()}" in daemon.log()
    finally:
        ctl(binary_dir, daemon, "cancel", job["id"])


@pytest.mark.skipif(os.geteuid() != 0, reason="running a client as a second user needs root")
def test_the_active_job_limit_counts_per_local_user(binary_dir, daemon, workspace):
    first = ctl(binary_dir, daemon, "submit", str(job_file(workspace, "first")))
    assert first.returncode == 0, first.stdout + first.stderr
    ids = [json.loads(first.stdout)["id"]]
    try:
        # The same user's second job is over server.max_active_jobs_per_client = 1.
        again = ctl(binary_dir, daemon, "submit", str(job_file(workspace, "second")))
        assert again.returncode != 0, again.stdout
        assert "max_active_jobs_per_client" in again.stderr, again.stderr
        # Another local user is another client: its job is accepted and names it.
        other = ctl(binary_dir, daemon, "submit", str(job_file(workspace, "nobodys")), user=NOBODY)
        assert other.returncode == 0, other.stdout + other.stderr
        job = json.loads(other.stdout)
        ids.append(job["id"])
        assert job["submitted_by"] == f"unix:uid={NOBODY}", job
        # And that user is now at its own limit.
        more = ctl(binary_dir, daemon, "submit", str(job_file(workspace, "nobodys-2")), user=NOBODY)
        assert more.returncode != 0 and "max_active_jobs_per_client" in more.stderr, more.stdout + more.stderr
    finally:
        for i in ids:
            ctl(binary_dir, daemon, "cancel", i)


@pytest.mark.skipif(os.geteuid() != 0, reason="running a client as a second user needs root")
def test_a_local_user_controls_only_its_own_jobs(binary_dir, daemon, workspace):
    mine = json.loads(ctl(binary_dir, daemon, "submit", str(job_file(workspace, "roots"))).stdout)["id"]
    r = ctl(binary_dir, daemon, "submit", str(job_file(workspace, "nobodys")), user=NOBODY)
    assert r.returncode == 0, r.stdout + r.stderr
    theirs = json.loads(r.stdout)["id"]
    try:
        # nobody may not touch root's job...
        for verb in ("cancel", "pause"):
            r = ctl(binary_dir, daemon, verb, mine, user=NOBODY)
            assert r.returncode != 0, (verb, r.stdout)
            assert f"job {mine} was submitted by unix:uid=0; unix:uid={NOBODY} may not {verb} it" in r.stderr, r.stderr
        assert json.loads(ctl(binary_dir, daemon, "get", mine).stdout)["state"] in ("queued", "running")
        # ...but its own, and root (the daemon's user here) may control anyone's.
        r = ctl(binary_dir, daemon, "cancel", theirs, user=NOBODY)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"job {theirs} cancelled by unix:uid={NOBODY}" in daemon.log()
        r = ctl(binary_dir, daemon, "cancel", mine)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        for i in (mine, theirs):
            ctl(binary_dir, daemon, "cancel", i)
