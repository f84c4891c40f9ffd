"""offloadctl watch and submit --watch against the fake JobService: exit codes, one line per event
on a pipe, a status line redrawn in place on a terminal, resuming after a broken stream."""

from __future__ import annotations

import os
import pathlib
import pty
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from fake_job_service import FakeJobService, FakeServer, scripted_events  # noqa: E402

from offloadd.v1 import job_pb2  # noqa: E402


@pytest.fixture()
def offloadctl(binary_dir):
    path = binary_dir / "client" / "offloadctl"
    if not path.exists():
        pytest.skip(f"{path} is not built")
    return str(path)


@pytest.fixture()
def fake(tmp_path):
    servers = []

    def start(service):
        servers.append(FakeServer(service, tmp_path))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def test_watch_on_a_pipe_prints_one_line_per_event_and_resumes(offloadctl, fake):
    server = fake(FakeJobService(scripted_events(), break_calls=1, break_after=2))
    r = subprocess.run([offloadctl, "--target", server.target, "watch", "job-1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split("]")[0] for line in lines] == ["[1", "[2", "[3", "[4", "[5"], r.stdout
    assert lines[0] == "[1] state running started" and lines[-1] == "[5] state succeeded finished"
    assert "\r" not in r.stdout and "\x1b" not in r.stdout
    assert server.service.cursors == [0, 2]


def test_watch_exits_1_when_the_job_failed(offloadctl, fake):
    events = scripted_events()
    events[-1].state_change.state = job_pb2.JOB_STATE_FAILED
    events[-1].state_change.reason = "CUDA out of memory"
    server = fake(FakeJobService(events, final_state=job_pb2.JOB_STATE_FAILED))
    r = subprocess.run([offloadctl, "--target", server.target, "watch", "job-1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert "[5] state failed CUDA out of memory" in r.stdout


def test_submit_watch_waits_for_the_end(offloadctl, fake, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("display_name: demo\n")
    server = fake(FakeJobService(scripted_events()))
    r = subprocess.run([offloadctl, "--target", server.target, "submit", str(job_file), "--watch"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("job job-1  queued")
    assert r.stdout.rstrip().endswith("[5] state succeeded finished")
    r = subprocess.run([offloadctl, "--target", server.target, "submit", str(job_file), "--watch", "--validate-only"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "excludes" in r.stderr, r.stderr


def test_watch_on_a_terminal_redraws_one_status_line(offloadctl, fake):
    server = fake(FakeJobService(scripted_events()))
    pid, fd = pty.fork()
    if pid == 0:  # child: stdout is the pty
        os.execve(offloadctl, [offloadctl, "--target", server.target, "watch", "job-1"],
                  {**os.environ, "TERM": "xterm", "COLUMNS": "100"})
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO once the child has exited
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    text = out.decode()
    assert os.waitstatus_to_exitcode(status) == 0, text
    # The pty turns "\n" into "\r\n".
    assert "\rstep 1/3 [########................]  33%  loss 1.0000" in text
    assert "\x1b[K" in text
    assert "\r\x1b[K[5] state succeeded finished\r\n" in text, repr(text)
    assert text.count("[2] step") == 0, "progress is not printed as event lines on a terminal"
