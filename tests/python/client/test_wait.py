"""Client.wait and Client.submit(wait=True) against a fake JobService whose streams break."""

from __future__ import annotations

import pathlib
import sys
import time

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from fake_job_service import FakeJobService, FakeServer, scripted_events  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402


@pytest.fixture()
def serve(tmp_path):
    servers = []

    def start(service: FakeJobService, **client_args) -> offloadd.Client:
        server = FakeServer(service, tmp_path)
        servers.append(server)
        return offloadd.Client(server.target, **client_args)

    yield start
    for s in servers:
        s.stop()


def test_resumes_after_the_last_cursor_when_the_stream_breaks(serve):
    service = FakeJobService(scripted_events(), break_calls=2, break_after=2)
    seen = []
    with serve(service) as c:
        job = c.wait("job-1", on_event=lambda e: seen.append(e.cursor))
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED
    assert seen == [1, 2, 3, 4, 5], "every event once, in order"
    assert service.cursors == [0, 2, 4]


def test_after_cursor_starts_the_watch_there_and_resumes_after_the_last_cursor(serve):
    service = FakeJobService(scripted_events(), break_calls=1, break_after=1)
    seen = []
    with serve(service) as c:
        job = c.wait("job-1", on_event=lambda e: seen.append(e.cursor), after_cursor=2)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED
    assert seen == [3, 4, 5], "only the events after the cursor, each once"
    assert service.cursors == [2, 3]


def test_timeout_raises_wait_timeout(serve):
    service = FakeJobService(scripted_events()[:-1], hang_at_end=True)  # never reaches a final state
    with serve(service) as c:
        start = time.monotonic()
        with pytest.raises(offloadd.WaitTimeout) as e:
            c.wait("job-1", timeout=0.3)
    assert time.monotonic() - start < 5
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, offloadd.DeadlineExceeded)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert (e.value.job_id, e.value.cursor, e.value.last_state) == ("job-1", 4, job_pb2.JOB_STATE_RUNNING)
    assert "job job-1 did not finish within 0.3 s (last seen RUNNING, cursor 4)" in str(e.value)


def test_other_errors_are_raised_at_once(serve):
    service = FakeJobService([], refuse=(grpc.StatusCode.NOT_FOUND, "job 'nope' does not exist"))
    with serve(service) as c:
        with pytest.raises(offloadd.NotFound, match="does not exist"):
            c.wait("nope")
    assert service.cursors == [0], "not retried"


def test_gives_up_after_the_reconnect_window_naming_the_cursor(serve):
    service = FakeJobService(scripted_events(), break_calls=1000)  # every call breaks at once
    with serve(service, reconnect_window=0.4) as c:
        with pytest.raises(offloadd.Unavailable) as e:
            c.wait("job-1")
    assert "could not resume it for 0.4 s (watch again with after_cursor=0)" in str(e.value)
    assert len(service.cursors) >= 3, "retried with backoff before giving up"


def test_stream_that_ends_before_the_job_is_final_is_reopened(serve):
    service = FakeJobService(scripted_events(), final_state=job_pb2.JOB_STATE_RUNNING)
    with serve(service, reconnect_window=0.3) as c:
        with pytest.raises(offloadd.Unavailable, match="ended while the job was RUNNING"):
            c.wait("job-1")
    assert service.cursors[:2] == [0, 5]


def test_submit_with_and_without_wait(serve):
    service = FakeJobService(scripted_events(), break_calls=1, break_after=3)
    with serve(service) as c:
        queued = c.submit({"display_name": "demo"})
        assert queued.state == job_pb2.JOB_STATE_QUEUED and queued.spec.display_name == "demo"
        assert service.cursors == []
        done = c.submit({"display_name": "demo"}, wait=True, timeout=30)
    assert done.state == job_pb2.JOB_STATE_SUCCEEDED
    assert service.cursors == [0, 3]


def test_progress_prints_to_stderr(serve, capsys):
    with serve(FakeJobService(scripted_events())) as c:
        c.wait("job-1", progress=True)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[1] state running started"
    assert err[1].startswith("[2] step 1/3 [########................]  33%  loss 1.0000")
    assert err[-1] == "[5] state succeeded finished"
