"""Offloadd.AsyncClient (grpc.aio) against the fake JobService: the sync client's
methods as coroutines, watch_job as an async iterator, wait's resume after broken streams, the
result object, the same error mapping (field violations from the status details included) and
the same target handling (TLS plus bearer token, for both clients)."""

from __future__ import annotations

import asyncio
import inspect
import os
import pathlib
import shutil
import subprocess
import sys

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from fake_job_service import FakeJobService, FakeServer, scripted_events  # noqa: E402
from test_states_and_results import ended_events, finished_job  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402


@pytest.fixture()
def server(tmp_path):
    servers = []

    def start(service: FakeJobService, **kw) -> FakeServer:
        s = FakeServer(service, tmp_path, **kw)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def run(coro_fn, target, **client_args):
    """Runs `coro_fn(client)` with an AsyncClient made in the event loop that uses it."""
    async def main():
        async with offloadd.AsyncClient(target, **client_args) as c:
            return await coro_fn(c)

    return asyncio.run(main())


def test_same_public_methods_as_the_sync_client():
    def public(cls):
        return {n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)}

    assert public(offloadd.AsyncClient) == public(offloadd.Client)
    for name in public(offloadd.Client):
        sync, aio = getattr(offloadd.Client, name), getattr(offloadd.AsyncClient, name)
        assert list(inspect.signature(sync).parameters) == list(inspect.signature(aio).parameters), name
        if inspect.isgeneratorfunction(sync):
            assert inspect.isasyncgenfunction(aio), f"{name} is an async iterator"
        else:
            assert inspect.iscoroutinefunction(aio), f"{name} is a coroutine"


def test_unary_calls_and_health(server):
    jobs = [job_pb2.Job(id=f"j{i}", state=s) for i, s in enumerate(
        [job_pb2.JOB_STATE_QUEUED, job_pb2.JOB_STATE_RUNNING, job_pb2.JOB_STATE_RUNNING])]
    service = FakeJobService([], jobs=jobs)
    s = server(service)

    async def calls(c):
        assert await c.health() == "SERVING"
        queued = await c.create_job({"display_name": "demo", "training": {"warmup_steps": 0.1}})
        assert offloadd.JobState.of(queued) == "queued" and queued.spec.training.warmup_ratio == 0.1
        running = [j.id async for j in c.list_jobs(states=["running"], page_size=1)]
        assert running == ["j1", "j2"]
        assert (await c.get_job("j1")).id == "j1"
        assert offloadd.JobState.of(await c.cancel_job("j1", reason="test")) == "cancelled"
        assert offloadd.JobState.of(await c.cancel_job("j2", force=True)) == "cancelled"
        assert offloadd.JobState.of(await c.pause_job("j1")) == "pausing"
        assert offloadd.JobState.of(await c.resume_job("j1")) == "queued"

    run(calls, s.target)
    assert service.cancelled == [("j1", "test"), ("j2", "")]
    assert service.forced == ["j2"]


def test_watch_is_an_async_iterator_and_errors_map_as_in_the_sync_client(server):
    s = server(FakeJobService(scripted_events(), known_jobs={"job-1"}))

    async def watch(c):
        cursors = [e.cursor async for e in c.watch_job("job-1")]
        after = [e.cursor async for e in c.watch_job("job-1", after_cursor=3)]
        with pytest.raises(offloadd.NotFound, match="job nope not found"):
            async for _ in c.watch_job("nope"):
                pass
        with pytest.raises(offloadd.NotFound):
            await c.get_job("nope")
        return cursors, after

    assert run(watch, s.target) == ([1, 2, 3, 4, 5], [4, 5])


def test_field_violations_come_through_both_clients(server):
    service = FakeJobService([], create_violations=[("training.learning_rate", "must be > 0"),
                                                    ("output_dir", "required")])
    s = server(service)
    with offloadd.Client(s.target) as c, pytest.raises(offloadd.InvalidArgument) as sync_err:
        c.create_job({"display_name": "x"})

    async def create(c):
        with pytest.raises(offloadd.InvalidArgument) as e:
            await c.create_job({"display_name": "x"})
        # A spec that does not read: its own problems and the daemon's, at once.
        with pytest.raises(offloadd.JobSpecError) as both:
            await c.create_job({"display_name": "x", "trainig": {}})
        return e.value, both.value

    aio_err, merged = run(create, s.target)
    assert aio_err.field_violations == sync_err.value.field_violations == [
        offloadd.FieldViolation("training.learning_rate", "must be > 0"), offloadd.FieldViolation("output_dir", "required")]
    assert [v.field for v in merged.field_violations] == ["trainig", "training.learning_rate", "output_dir"]
    assert "did you mean `training`" in merged.field_violations[0].description


def test_wait_resumes_after_the_last_cursor_with_an_async_callback(server):
    service = FakeJobService(scripted_events(), break_calls=2, break_after=2)
    s = server(service)
    seen = []

    async def on_event(e):
        await asyncio.sleep(0)
        seen.append(e.cursor)

    job = run(lambda c: c.wait("job-1", on_event=on_event), s.target)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED
    assert seen == [1, 2, 3, 4, 5] and service.cursors == [0, 2, 4]


def test_wait_timeout_and_reconnect_window(server):
    hang = server(FakeJobService(scripted_events()[:-1], hang_at_end=True))
    with pytest.raises(offloadd.WaitTimeout) as e:
        run(lambda c: c.wait("job-1", timeout=0.3), hang.target)
    assert "did not finish within 0.3 s (last seen RUNNING, cursor 4)" in str(e.value)
    assert e.value.last_status == "running"
    broken = server(FakeJobService(scripted_events(), break_calls=1000))
    with pytest.raises(offloadd.Unavailable, match=r"could not resume it for 0.4 s \(watch again with after_cursor=0\)"):
        run(lambda c: c.wait("job-1"), broken.target, reconnect_window=0.4)


def test_submit_and_wait(server):
    service = FakeJobService(scripted_events(), break_calls=1, break_after=3)
    s = server(service)
    done = run(lambda c: c.submit({"display_name": "demo"}, wait=True, timeout=30), s.target)
    assert done.state == job_pb2.JOB_STATE_SUCCEEDED and service.cursors == [0, 3]


def test_results_of_succeeded_failed_and_cancelled_jobs(server):
    ok = server(FakeJobService(ended_events(job_pb2.JOB_STATE_SUCCEEDED, "finished 3 steps, final loss 0.5; model in /m"),
                               job=finished_job()))
    r = run(lambda c: c.result("job-1", raise_on_failure=True), ok.target)
    assert (r.status, r.fine_tuned_model, r.trained_tokens, r.steps, r.final_loss) == ("succeeded", "/m", 1234, 3, 0.5)

    failed = server(FakeJobService(ended_events(job_pb2.JOB_STATE_FAILED), final_state=job_pb2.JOB_STATE_FAILED,
                                   job=finished_job(error=(13, "executor died"))))
    r = run(lambda c: c.result("job-1"), failed.target)
    assert r.status == "failed" and r.error == "executor died" and r.error_code == grpc.StatusCode.INTERNAL
    with pytest.raises(offloadd.JobFailed, match="job job-1 failed: executor died") as e:
        run(lambda c: c.result("job-1", raise_on_failure=True), failed.target)
    assert e.value.result.status == "failed"
    with pytest.raises(offloadd.JobFailed):
        run(lambda c: c.wait("job-1", raise_on_failure=True), failed.target)

    cancelled = server(FakeJobService(ended_events(job_pb2.JOB_STATE_CANCELLED),
                                      final_state=job_pb2.JOB_STATE_CANCELLED, job=finished_job(error=(1, "stop"))))
    with pytest.raises(offloadd.JobCancelled, match="was cancelled: stop"):
        run(lambda c: c.result("job-1", raise_on_failure=True), cancelled.target)

    running = server(FakeJobService(scripted_events(), final_state=job_pb2.JOB_STATE_RUNNING, job=finished_job()))
    r = run(lambda c: c.result("job-1", wait=False), running.target)
    assert r.status == "running" and running.service.cursors == []


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True)
    token = d / "token"
    token.write_text("s3cret-token-for-tests-0123456789\n")
    os.chmod(token, 0o600)
    bad = d / "bad_token"
    bad.write_text("not-the-token\n")
    return cert, key, token, bad


def test_tcp_with_tls_and_a_bearer_token_from_both_clients(server, tls_files):
    cert, key, token, bad = tls_files
    s = server(FakeJobService(scripted_events()),
               tls=(cert.read_bytes(), key.read_bytes(), token.read_text().strip()))
    creds = dict(tls_ca_file=str(cert), token_file=str(token), tls_server_name="localhost")
    with offloadd.Client(s.target, **creds) as c:
        assert c.health() == "SERVING" and c.wait("job-1").state == job_pb2.JOB_STATE_SUCCEEDED

    async def calls(c):
        return await c.health(), offloadd.JobState.of(await c.wait("job-1"))

    assert run(calls, s.target, **creds) == ("SERVING", "succeeded")
    assert set(s.auth.seen) == {"Bearer s3cret-token-for-tests-0123456789"}
    with pytest.raises(offloadd.Unauthenticated, match="invalid bearer token"):
        run(lambda c: c.get_job("job-1"), s.target, **dict(creds, token_file=str(bad)))
    with pytest.raises(ValueError, match="needs tls_ca_file and token_file"):
        offloadd.AsyncClient(s.target)


def test_default_target_from_the_environment(monkeypatch):
    monkeypatch.setenv("OFFLOADD_TARGET", "unix:///tmp/elsewhere.sock")

    async def target(c):
        return c.target

    assert run(target, None) == "unix:///tmp/elsewhere.sock"
    monkeypatch.delenv("OFFLOADD_TARGET")
    assert run(target, None) == offloadd.DEFAULT_TARGET
