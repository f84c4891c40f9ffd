"""Per-client state is per client, holds across a restart and is
released promptly.

- A CreateJob request_id was global: Bob reusing Alice's id received Alice's job, and his own was
  never created. Request ids are now idempotency keys of one client, kept in the job store.

- server.max_active_jobs_per_client counted only the jobs created since the daemon started: after a
  restart a client at its limit could queue as many again. The count is now rebuilt from the job
  store at startup.
- A cancelled WatchJob stream kept its slot (server.max_watchers_per_client) for about 2 s, until
  its handler's next poll. The stream now ends when gRPC reports the cancellation."""

from __future__ import annotations

import pathlib
import sys
import time

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402
from demo_model import write_demo  # noqa: E402
from test_tcp_tls import start_tls_daemon  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_service_pb2  # noqa: E402


@pytest.fixture()
def daemon(binary_dir, tmp_path, shared_dir, source_dir):
    write_demo(tmp_path, shared_dir, source_dir)
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path)
    d.config_path.write_text(d.config_path.read_text().replace(
        "  shutdown_grace_seconds: 5\n",
        "  shutdown_grace_seconds: 5\n  max_active_jobs_per_client: 1\n  max_watchers_per_client: 1\n"))
    yield d.start()
    d.stop()


def long_job(ws: pathlib.Path, name: str) -> dict:
    return {"display_name": name, "model": {"path": str(ws / "stories260K")},
            "dataset": {"paths": [str(ws / "alpaca.json")], "format": "alpaca", "max_seq_length": 128},
            "training": {"learning_rate": 1e-4, "per_device_train_batch_size": 2, "max_steps": 100000},
            "output_dir": str(ws / f"out-{name}")}


def test_active_jobs_count_after_a_restart(daemon, tmp_path):
    with offloadd.Client(daemon.target) as c:
        first = c.create_job(long_job(tmp_path, "first"))
        with pytest.raises(offloadd.OffloaddError) as e:
            c.create_job(long_job(tmp_path, "second"))
        assert "max_active_jobs_per_client" in e.value.message
    assert daemon.terminate() == 0  # the running job is paused, the queued one stays queued
    daemon.stop()
    daemon.start()
    with offloadd.Client(daemon.target) as c:
        assert offloadd.JobState.of(c.get_job(first.id)) in ("queued", "running", "paused")
        with pytest.raises(offloadd.OffloaddError) as e:
            c.create_job(long_job(tmp_path, "second"))
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
        assert "has 1 active jobs" in e.value.message and "max_active_jobs_per_client" in e.value.message
        assert "1 active jobs counted against their clients' limits" in daemon.log()
        c.cancel_job(first.id)
        c.wait(first.id, timeout=60)
        second = c.create_job(long_job(tmp_path, "second"))  # the ended job no longer counts
        c.cancel_job(second.id)


def open_watch(c: offloadd.Client, request, within: float):
    """A WatchJob stream that has delivered its first event, retrying RESOURCE_EXHAUSTED (the
    client's one slot still taken) for at most `within` seconds. Returns it and the time it took."""
    t0 = time.monotonic()
    while True:
        stream = c._jobs.WatchJob(request, timeout=60)
        try:
            next(stream)
            return stream, time.monotonic() - t0
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
            assert "max_watchers_per_client" in e.details(), e.details()
            took = time.monotonic() - t0
            assert took < within, f"the cancelled stream still held its slot after {took:.2f} s"
            time.sleep(0.01)


def test_a_cancelled_watch_releases_its_slot_at_once(daemon, tmp_path):
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(long_job(tmp_path, "watched"))
        try:
            request = job_service_pb2.WatchJobRequest(job_id=job.id)
            stream, _ = open_watch(c, request, within=0.5)
            times = []
            for _ in range(3):
                stream.cancel()
                # The slot is free as soon as the daemon sees the cancellation: the next stream opens
                # within half a second (it took up to 2 s, the handler's poll interval).
                stream, took = open_watch(c, request, within=0.5)
                times.append(took)
            stream.cancel()
            print("a new stream opened " + ", ".join(f"{t:.3f}" for t in times) + " s after the cancel")
        finally:
            c.cancel_job(job.id)


def test_request_ids_belong_to_their_client(binary_dir, tmp_path, shared_dir, source_dir):
    tokens = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef"}
    d, target, cert, _ = start_tls_daemon(binary_dir, tmp_path, "".join(f"{n} {t}\n" for n, t in tokens.items()))
    write_demo(tmp_path, shared_dir, source_dir)

    def client(name):
        f = tmp_path / f"{name}.token"
        f.write_text(tokens[name] + "\n")
        return offloadd.Client(target, tls_ca_file=str(cert), token_file=str(f), tls_server_name="localhost")

    try:
        with client("alice") as alice, client("bob") as bob:
            a = alice.create_job(long_job(tmp_path, "alice"), request_id="nightly-1")
            b = bob.create_job(long_job(tmp_path, "bob"), request_id="nightly-1")
            assert b.id != a.id, "bob received alice's job"
            assert (b.submitted_by, b.spec.display_name, b.request_id) == ("token:bob", "bob", "nightly-1")
            assert alice.create_job(long_job(tmp_path, "alice"), request_id="nightly-1").id == a.id
            assert len(list(alice.list_jobs())) == 2
        d.terminate()
        d.stop()
        d.start()
        with client("alice") as alice, client("bob") as bob:
            assert alice.create_job(long_job(tmp_path, "alice"), request_id="nightly-1").id == a.id
            assert bob.create_job(long_job(tmp_path, "bob"), request_id="nightly-1").id == b.id
            assert len(list(alice.list_jobs())) == 2
            alice.cancel_job(a.id)
            bob.cancel_job(b.id)
    finally:
        d.stop()
