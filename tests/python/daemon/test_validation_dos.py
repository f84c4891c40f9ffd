"""One client must not turn CreateJob validation, or the server's threads,
into a denial of service for the others.

Item 4: validation was bounded per rendering, not per request: a chat template near the step limit
rendered for 8 preview records of each of 512 paths (the same file allowed 512 times) made ~94
CPU-minutes for one request, and the work went on after the client had gone. Four such calls held
every validation slot and every other client's CreateJob got RESOURCE_EXHAUSTED after 30 s. Now a
repeated path is checked once, all renderings of a request share one step budget, validation stops
when the call is cancelled or past its deadline, and a client holds at most 2 of the 4 slots.

Item 6: CreateJobs waiting for a slot and WatchJob streams each hold a server thread; with
server.max_threads 16, one client's 20 pending CreateJobs locked every other client out, operators'
cancels included. Now a client holds at most its share of the threads left after a reserve for job
control and health, and one call more gets RESOURCE_EXHAUSTED naming the limit.

The two clients are named TCP tokens (token:mallory and token:alice), as in test_tcp_tls.py."""

from __future__ import annotations

import json
import pathlib
import sys
import threading
import time

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_create_job import spec_dict, workspace  # noqa: E402,F401
from test_tcp_tls import start_tls_daemon  # noqa: E402
from demo_model import write_demo  # noqa: E402

import offloadd  # noqa: E402
from offloadd import _shared  # noqa: E402
from offloadd.v1 import job_service_pb2  # noqa: E402

TOKENS = {"mallory": "mallory-token-0123456789abcdef", "alice": "alice-token-0123456789abcdef"}

# ~3M steps per rendering (under the 4M limit of one rendering, ~1-2 s each), prefix-stable.
SLOW_TEMPLATE = ("{% for i in range(700) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
                 "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")


def start(binary_dir, tmp_path, server_yaml: str = ""):
    text = "".join(f"{n} {t}\n" for n, t in TOKENS.items())
    d, target, cert, _ = start_tls_daemon(binary_dir, tmp_path, text, server_yaml)

    def client(name: str, timeout: float = 30.0) -> offloadd.Client:
        f = tmp_path / f"{name}.token"
        f.write_text(TOKENS[name] + "\n")
        return offloadd.Client(target, tls_ca_file=str(cert), token_file=str(f), tls_server_name="localhost",
                               timeout=timeout)

    return d, client


def demo_spec(ws: pathlib.Path, name: str) -> dict:
    """A job on the demo model (stories260K: its tokenizer loads in milliseconds)."""
    return {"display_name": name, "model": {"path": str(ws / "stories260K")},
            "dataset": {"paths": [str(ws / "alpaca.json")], "format": "alpaca", "max_seq_length": 128},
            "training": {"learning_rate": 1e-4, "per_device_train_batch_size": 2, "max_steps": 100000},
            "output_dir": str(ws / f"out-{name}")}


def hostile_request(ws: pathlib.Path):
    """The defect's request: a slow template and the same file as every one of 512 paths."""
    template = ws / "slow.jinja"
    template.write_text(SLOW_TEMPLATE)
    spec = demo_spec(ws, "hostile")
    spec["dataset"]["template"] = str(template)
    spec["dataset"]["paths"] = [str(ws / "alpaca.json")] * 256
    spec["dataset"]["eval_paths"] = [str(ws / "alpaca.json")] * 256
    proto, problem = _shared.read_spec(spec)
    assert problem is None, problem
    return _shared.create_job_request(proto, True, "")


def test_abandoned_slow_validations_do_not_hold_up_another_client(binary_dir, workspace, shared_dir,  # noqa: F811
                                                                   source_dir):
    d, client = start(binary_dir, workspace)
    write_demo(workspace, shared_dir, source_dir)
    try:
        with client("mallory") as mallory, client("alice") as alice:
            request = hostile_request(workspace)
            # 32 abandoned validations: half hit a short deadline, half are cancelled by their client.
            calls = []
            for i in range(32):
                if i % 2 == 0:
                    calls.append(mallory._jobs.CreateJob.future(request, timeout=0.5))
                else:
                    calls.append(mallory._jobs.CreateJob.future(request, timeout=600))
            time.sleep(0.5)  # the clients give up after half a second
            for f in calls[1::2]:
                f.cancel()
            codes = []
            for f in calls:
                try:
                    f.result()
                    codes.append(grpc.StatusCode.OK)
                except grpc.FutureCancelledError:
                    codes.append(grpc.StatusCode.CANCELLED)
                except grpc.RpcError as e:
                    codes.append(e.code())
            assert grpc.StatusCode.OK not in codes, codes
            # Then another client's ordinary CreateJob answers within 2 s.
            t0 = time.monotonic()
            job = alice.create_job(spec_dict(workspace), validate_only=True)
            took = time.monotonic() - t0
            assert job.spec.dataset.paths, job
            assert took < 2.0, f"alice's CreateJob took {took:.2f} s after mallory's abandoned validations"
            print(f"alice's CreateJob answered in {took:.2f} s; mallory's calls ended with "
                  f"{sorted({c.name for c in codes})}")
            # The hostile request itself, waited for, ends with the request's budget named (its
            # 512 paths are one file, checked once), not after an hour.
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as e:
                mallory._jobs.CreateJob(request, timeout=120)
            took = time.monotonic() - t0
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
            assert "steps in all (the budget of one CreateJob" in e.value.details(), e.value.details()
            assert took < 60, f"the hostile validation took {took:.1f} s"
            print(f"the hostile request, waited for, was refused in {took:.1f} s")
        assert "stopped during validation" in d.log()
    finally:
        d.stop()


def test_one_client_cannot_take_every_server_thread(binary_dir, workspace, shared_dir, source_dir):  # noqa: F811
    # 16 threads: 2 reserved for short calls, 2 for gRPC's pollers, 12 for CreateJob and WatchJob
    # calls, at most 6 of them one client's.
    d, client = start(binary_dir, workspace, "  max_threads: 16\n")
    write_demo(workspace, shared_dir, source_dir)
    pending = []
    try:
        with client("mallory", timeout=600) as mallory, client("alice") as alice:
            # alice's job, to look at and cancel while mallory floods.
            job = alice.create_job(demo_spec(workspace, "alice"))
            request = hostile_request(workspace)
            # mallory floods: 20 CreateJobs that validate slowly, then 20 WatchJob streams.
            answered = threading.Semaphore(0)
            for _ in range(20):
                pending.append(mallory._jobs.CreateJob.future(request, timeout=600))
                pending[-1].add_done_callback(lambda _: answered.release())
            for _ in range(14):  # refused at once; 6 stay (2 validating, 4 waiting for a slot)
                assert answered.acquire(timeout=10), "mallory's CreateJobs beyond its share were not refused"
            refused = [f for f in pending if f.done()]
            assert len(refused) == 14, f"{len(refused)} of mallory's 20 CreateJobs answered"
            for f in refused:
                assert f.exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED, f.exception()
                assert "its share" in f.exception().details(), f.exception().details()
            # Every stream is refused at once too: mallory's share is taken by the CreateJobs.
            for _ in range(20):
                stream = mallory._jobs.WatchJob(job_service_pb2.WatchJobRequest(job_id=job.id), timeout=600)
                with pytest.raises(grpc.RpcError) as e:
                    next(stream)
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
                assert "its share" in e.value.details(), e.value.details()
            # alice is served promptly: health, GetJob, a CreateJob of her own, CancelJob.
            t0 = time.monotonic()
            assert alice.health() == "SERVING"
            assert alice.get_job(job.id).id == job.id
            alice.create_job(spec_dict(workspace), validate_only=True)
            alice.cancel_job(job.id)
            took = time.monotonic() - t0
            assert took < 5, f"alice's calls took {took:.1f} s"
            assert sum(f.done() for f in pending) == 14, "mallory's 6 calls were still in progress"
            print(f"alice's health, get, create and cancel answered in {took:.2f} s with mallory's 6 calls pending")
    finally:
        for f in pending:
            f.cancel()
        d.stop()
