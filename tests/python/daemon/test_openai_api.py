"""The OpenAI-compatible fine-tuning API (docs/openai_api.md), driven by the official `openai`
package, unchanged, pointed at a test daemon with `base_url`: files.create, fine_tuning.jobs.create,
retrieve, list, list_events, checkpoints.list and cancel train the README's demo model
(stories260K) on chat records to `succeeded`; the same jobs are visible through gRPC and the other
way round; and what is wrong is refused in OpenAI's error shape, naming the parameter: a bad token,
an unknown model, a malformed file, an oversized body, unknown or unsupported fields, another
client's job. The same client trains over HTTPS (with a token) and over a Unix socket (as its
user)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import ssl
import subprocess
import sys
import time

import httpx  # the openai package's own HTTP client
import openai  # python-requirements.txt: CI installs it, so a missing package fails here
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from daemon_process import DaemonProcess, self_signed_localhost  # noqa: E402
from demo_model import write_demo  # noqa: E402

import offloadd  # noqa: E402

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef01"
OPS = "ops-token-0123456789abcdef012"
UPLOAD_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def daemon(binary_dir, source_dir, tmp_path_factory):
    ws = tmp_path_factory.mktemp("openai")
    write_demo(ws, None, source_dir, records=64)
    tokens = ws / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\nops {OPS} operator\n")
    os.chmod(tokens, 0o600)
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", ws)
    d.config_path.write_text(d.config_path.read_text().replace(
        "  shutdown_grace_seconds: 5\n",
        "  shutdown_grace_seconds: 5\n  openai_api:\n    listen: 127.0.0.1:0\n"
        f"    auth_token_file: {tokens}\n    model_dir: {ws}\n    max_upload_bytes: {UPLOAD_LIMIT}\n"))
    d.start()
    m = re.search(r"serving the OpenAI fine-tuning API on (http://127\.0\.0\.1:\d+/v1)", d.log())
    assert m, d.log()
    d.openai_url = m.group(1)
    d.ws = ws
    yield d
    assert d.terminate() == 0, d.log()  # SIGTERM stops the HTTP listener and drains cleanly
    d.stop()


def client(d, key=ALICE) -> "openai.OpenAI":
    return openai.OpenAI(api_key=key, base_url=d.openai_url, max_retries=0, timeout=60)


def chat_jsonl(ws: pathlib.Path, first: int, n: int) -> bytes:
    """Alpaca records of the demo as OpenAI chat records."""
    records = json.loads((ws / "alpaca.json").read_text())[first:first + n]
    lines = []
    for r in records:
        prompt = r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")
        lines.append(json.dumps({"messages": [{"role": "user", "content": prompt},
                                              {"role": "assistant", "content": r["output"]}]}))
    return ("\n".join(lines) + "\n").encode()


def wait_for(c, job_id: str, statuses: tuple, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while True:
        job = c.fine_tuning.jobs.retrieve(job_id)
        if job.status in statuses:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job.status} after {timeout} s"
        time.sleep(0.5)


def test_a_job_trains_end_to_end_through_the_openai_client(daemon):
    c = client(daemon)
    train_bytes = chat_jsonl(daemon.ws, 0, 16)
    train = c.files.create(file=("train.jsonl", train_bytes), purpose="fine-tune")
    assert train.id.startswith("file-") and train.object == "file"
    assert train.bytes == len(train_bytes) and train.purpose == "fine-tune" and train.status == "processed"
    assert c.files.retrieve(train.id).filename == "train.jsonl"
    valid = c.files.create(file=("valid.jsonl", chat_jsonl(daemon.ws, 16, 4)), purpose="fine-tune")
    assert {train.id, valid.id} <= {f.id for f in c.files.list()}

    job = c.fine_tuning.jobs.create(model="stories260K", training_file=train.id, validation_file=valid.id,
                                    hyperparameters={"n_epochs": 2, "batch_size": 8}, suffix="tiny", seed=7)
    assert job.object == "fine_tuning.job" and job.status in ("validating_files", "queued", "running")
    assert job.model == "stories260K" and job.training_file == train.id and job.validation_file == valid.id
    assert job.hyperparameters.n_epochs == 2 and job.hyperparameters.batch_size == 8
    assert job.seed == 7 and job.fine_tuned_model is None

    done = wait_for(c, job.id, ("succeeded", "failed", "cancelled"))
    assert done.status == "succeeded", done.error
    model = pathlib.Path(done.fine_tuned_model)
    assert (model / "config.json").is_file() and (model / "model.safetensors").is_file()
    assert model.name.startswith("ft-stories260K-tiny-")
    assert done.finished_at >= done.created_at and done.trained_tokens > 0

    # Events newest first, as OpenAI's; one metrics event per step (16 records in batches of 8, two
    # epochs: 4 steps),
    # and the client's own paging (limit 2, then `after`) walks the same list.
    events = c.fine_tuning.jobs.list_events(job.id, limit=100).data
    metrics = [e for e in events if e.type == "metrics"]
    assert sorted(e.data["step"] for e in metrics) == [1, 2, 3, 4], [e.message for e in events]
    assert all(e.data["total_steps"] == 4 and e.data["train_loss"] > 0 for e in metrics)
    # Each evaluation (before training and after each epoch) is a message of its own, not a second
    # metrics event of its step.
    valid = [e for e in events if e.type == "message" and "valid_loss" in (e.data or {})]
    assert sorted(e.data["step"] for e in valid) == [0, 2, 4], [e.message for e in events]
    assert all(e.data["valid_loss"] > 0 for e in valid)
    cursors = [int(e.id.removeprefix("ftevent-")) for e in events]
    assert cursors == sorted(cursors, reverse=True)
    assert [e.id for e in c.fine_tuning.jobs.list_events(job.id, limit=2)] == [e.id for e in events]
    assert "Job succeeded" in events[0].message

    # A checkpoint at the end of each epoch but the last (whose model is the export).
    checkpoints = c.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [k.step_number for k in checkpoints] == [2]
    assert checkpoints[0].fine_tuning_job_id == job.id
    assert pathlib.Path(checkpoints[0].fine_tuned_model_checkpoint).is_dir()

    assert job.id in [j.id for j in c.fine_tuning.jobs.list(limit=100)]
    # The same job through gRPC: an ordinary job of alice's, training on the uploaded file.
    with offloadd.Client(daemon.target) as g:
        j = g.get_job(job.id)
        assert offloadd.JobState.of(j) == "succeeded"
        assert j.submitted_by == "token:alice"
        assert pathlib.Path(j.spec.dataset.paths[0]).name == f"{train.id}.jsonl"
        assert j.spec.output_dir == done.fine_tuned_model


def test_jobs_page_newest_first_and_grpc_jobs_show_and_cancel(daemon):
    c = client(daemon)
    ws = daemon.ws
    with offloadd.Client(daemon.target) as g:
        grpc_job = g.create_job({
            "display_name": "from-grpc", "model": {"path": str(ws / "stories260K")},
            "dataset": {"paths": [str(ws / "alpaca.json")], "format": "alpaca", "max_seq_length": 128},
            "training": {"learning_rate": 1e-4, "per_device_train_batch_size": 2, "max_steps": 100000},
            "output_dir": str(ws / "out-grpc")})
    train = c.files.create(file=("t.jsonl", chat_jsonl(ws, 0, 64)), purpose="fine-tune")
    long_job = c.fine_tuning.jobs.create(model=str(ws / "stories260K"), training_file=train.id,
                                         hyperparameters={"n_epochs": 50, "batch_size": 1})
    newest = c.fine_tuning.jobs.list(limit=2)
    assert [j.id for j in newest.data] == [long_job.id, grpc_job.id] and newest.has_more
    shown = c.fine_tuning.jobs.retrieve(grpc_job.id)
    assert shown.model == str(ws / "stories260K") and shown.training_file == str(ws / "alpaca.json")
    # Every job, following `after` through pages of one.
    ids = [j.id for j in c.fine_tuning.jobs.list(limit=1)]
    assert ids[:2] == [long_job.id, grpc_job.id] and len(ids) == len(set(ids))
    with offloadd.Client(daemon.target) as g:
        assert len(ids) == len(list(g.list_jobs()))

    # Pause and resume (the client's jobs.pause/resume): a queued job is paused at once.
    assert c.fine_tuning.jobs.pause(long_job.id).status in ("paused", "running")
    wait_for(c, long_job.id, ("paused",))
    assert c.fine_tuning.jobs.resume(long_job.id).status in ("queued", "running")

    # bob may not cancel alice's job; an operator may cancel the Unix socket user's job.
    with pytest.raises(openai.PermissionDeniedError) as e:
        client(daemon, BOB).fine_tuning.jobs.cancel(long_job.id)
    assert "submitted by token:alice" in e.value.body["message"]
    assert c.fine_tuning.jobs.cancel(long_job.id).status == "cancelled"
    assert wait_for(c, long_job.id, ("cancelled",)).finished_at is not None
    assert client(daemon, OPS).fine_tuning.jobs.cancel(grpc_job.id).status == "cancelled"
    with offloadd.Client(daemon.target) as g:
        assert offloadd.JobState.of(g.wait(grpc_job.id, timeout=60)) == "cancelled"
    with pytest.raises(openai.NotFoundError) as e:
        c.fine_tuning.jobs.retrieve("job-that-does-not-exist")
    assert e.value.param == "fine_tuning_job_id"


def test_refusals_name_what_is_wrong(daemon):
    c = client(daemon)
    with pytest.raises(openai.AuthenticationError) as e:
        client(daemon, "not-a-token-of-the-file-at-all").files.list()
    assert e.value.status_code == 401 and e.value.body["message"] == "invalid bearer token"

    bad = chat_jsonl(daemon.ws, 0, 2) + b'{"prompt": "p", "completion": "c"}\n'
    with pytest.raises(openai.BadRequestError) as e:
        c.files.create(file=("bad.jsonl", bad), purpose="fine-tune")
    assert e.value.param == "file" and e.value.code == "invalid_file"
    assert "line 3: expected {\"messages\": [...]}" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.files.create(file=("t.jsonl", chat_jsonl(daemon.ws, 0, 2)), purpose="batch")
    assert e.value.param == "purpose"

    big = chat_jsonl(daemon.ws, 0, 64) * 4
    assert len(big) > UPLOAD_LIMIT
    with pytest.raises(openai.APIStatusError) as e:
        c.files.create(file=("big.jsonl", big), purpose="fine-tune")
    assert e.value.status_code == 413 and e.value.code == "request_too_large"

    train = c.files.create(file=("t.jsonl", chat_jsonl(daemon.ws, 0, 8)), purpose="fine-tune")
    cases = [
        (dict(model="gpt-4o-mini"), "model", "does not exist"),
        (dict(model="/etc"), "model", "allowed_roots"),  # the daemon's own validation (Submit)
        (dict(model="stories260K", training_file="file-000000000000000000000000"), "training_file", "no such file"),
        (dict(model="stories260K", extra_body={"learning_rate": 1e-3}), "learning_rate", "unknown parameter"),
        (dict(model="stories260K", method={"type": "dpo"}), "method.type", "supervised"),
        (dict(model="stories260K", hyperparameters={"n_epochs": 0}), "hyperparameters.n_epochs", "[1, 50]"),
        (dict(model="stories260K", integrations=[{"type": "wandb", "wandb": {"project": "p"}}]), "integrations",
         "not supported"),
    ]
    for kwargs, param, says in cases:
        kwargs.setdefault("training_file", train.id)
        with pytest.raises(openai.BadRequestError) as e:
            c.fine_tuning.jobs.create(**kwargs)
        assert e.value.param == param, (kwargs, e.value.body)
        assert says in e.value.body["message"], (kwargs, e.value.body)
    with pytest.raises(openai.NotFoundError):
        c.files.retrieve("file-ffffffffffffffffffffffff")


# The other transports (docs/security.md): HTTPS with the bearer tokens, and a Unix socket whose
# mode grants access. The unchanged `openai` package is pointed at each through its own httpx
# client, and trains a short job end to end.

def start_api_daemon(binary_dir, source_dir, ws: pathlib.Path, api_yaml: str) -> DaemonProcess:
    write_demo(ws, None, source_dir, records=16)
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", ws)
    d.config_path.write_text(d.config_path.read_text().replace(
        "  shutdown_grace_seconds: 5\n",
        f"  shutdown_grace_seconds: 5\n  openai_api:\n    model_dir: {ws}\n{api_yaml}"))
    d.start()
    d.ws = ws
    return d


def train_short_job(c: "openai.OpenAI", ws: pathlib.Path):
    train = c.files.create(file=("train.jsonl", chat_jsonl(ws, 0, 8)), purpose="fine-tune")
    assert c.files.retrieve(train.id).id == train.id
    job = c.fine_tuning.jobs.create(model="stories260K", training_file=train.id,
                                    hyperparameters={"n_epochs": 1, "batch_size": 8})
    done = wait_for(c, job.id, ("succeeded", "failed", "cancelled"))
    assert done.status == "succeeded", done.error
    assert (pathlib.Path(done.fine_tuned_model) / "model.safetensors").is_file()
    steps = [e.data["step"] for e in c.fine_tuning.jobs.list_events(job.id, limit=100).data
             if e.type == "metrics"]
    assert steps == [1]
    return done


def test_the_openai_client_over_tls_with_a_token(binary_dir, source_dir, tmp_path):
    cert, key = self_signed_localhost(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\n")
    os.chmod(tokens, 0o600)
    api_yaml = (f"    listen: 127.0.0.1:0\n    tls_cert_file: {cert}\n    tls_key_file: {key}\n"
                f"    auth_token_file: {tokens}\n")
    # A key that is not a key is refused by --validate-config (as at startup), naming the setting.
    bad = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path)
    bad.config_path.write_text(bad.config_path.read_text().replace(
        "  shutdown_grace_seconds: 5\n",
        "  shutdown_grace_seconds: 5\n  openai_api:\n" + api_yaml.replace(f"tls_key_file: {key}",
                                                                        f"tls_key_file: {cert}")))
    r = subprocess.run([str(bad.binary), "--config", str(bad.config_path), "--validate-config"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and f"server.openai_api.tls_key_file {cert}: not an unencrypted PEM" in r.stderr, \
        r.stderr
    d = start_api_daemon(binary_dir, source_dir, tmp_path, api_yaml)
    try:
        m = re.search(r"serving the OpenAI fine-tuning API on https://127\.0\.0\.1:(\d+)/v1", d.log())
        assert m, d.log()
        url = f"https://127.0.0.1:{m.group(1)}/v1"  # the certificate names 127.0.0.1 and localhost

        def tls_client(api_key=ALICE, verify=ssl.create_default_context(cafile=str(cert)), base_url=url):
            return openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=60,
                                 http_client=httpx.Client(verify=verify))

        with offloadd.Client(d.target) as g:
            assert g.get_job(train_short_job(tls_client(), tmp_path).id).submitted_by == "token:alice"
        with pytest.raises(openai.AuthenticationError):  # TLS does not replace the token
            tls_client(api_key="not-a-token-of-the-file-at-all").files.list()
        with pytest.raises(openai.APIConnectionError):  # a client that does not trust the cert
            tls_client(verify=True).files.list()
        with pytest.raises(openai.BadRequestError) as e:  # http:// to the https:// port
            tls_client(base_url=url.replace("https://", "http://")).files.list()
        assert e.value.code == "tls_required" and "HTTPS only" in e.value.body["message"]
    finally:
        assert d.terminate() == 0, d.log()
        d.stop()


def test_the_openai_client_over_a_unix_socket(binary_dir, source_dir, tmp_path):
    sock = tmp_path / "openai.sock"
    d = start_api_daemon(binary_dir, source_dir, tmp_path, f"    listen: unix:{sock}\n")
    try:
        assert f"serving the OpenAI fine-tuning API on unix:{sock}" in d.log()
        assert oct(sock.stat().st_mode & 0o7777) == "0o600"  # server.unix_socket_mode, as gRPC's
        # No token file: the socket's mode grants access, and the caller is its user. The openai
        # package wants some api_key; it is not looked at.
        c = openai.OpenAI(api_key="unused", base_url="http://localhost/v1", max_retries=0, timeout=60,
                          http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))))
        done = train_short_job(c, tmp_path)
        with offloadd.Client(d.target) as g:
            assert g.get_job(done.id).submitted_by == f"unix:uid={os.getuid()}"
    finally:
        assert d.terminate() == 0, d.log()
        d.stop()
    assert not sock.exists()  # removed on shutdown
