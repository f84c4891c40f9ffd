"""TCP is served only with TLS and a bearer token; both SDKs authenticate, wrong tokens are refused."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess, self_signed_localhost  # noqa: E402
from demo_model import write_demo  # noqa: E402

import offloadd  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_tls_daemon(binary_dir, tmp_path, token_text: str, server_yaml: str = ""):
    """offloadd with TCP on a free port (a self-signed certificate for localhost) and the given
    token file; returns the daemon, the TCP target, the certificate and the token file."""
    cert, key = self_signed_localhost(tmp_path)
    token = tmp_path / "token"
    token.write_text(token_text)
    os.chmod(token, 0o600)
    port = free_port()
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path)
    text = d.config_path.read_text().replace(
        "  shutdown_grace_seconds: 5\n",
        f"  shutdown_grace_seconds: 5\n  tcp:\n    listen: 127.0.0.1:{port}\n    tls_cert_file: {cert}\n"
        f"    tls_key_file: {key}\n    auth_token_file: {token}\n{server_yaml}")
    d.config_path.write_text(text)
    d.start()
    return d, f"127.0.0.1:{port}", cert, token


@pytest.fixture()
def tls_daemon(binary_dir, tmp_path):
    d, target, cert, token = start_tls_daemon(binary_dir, tmp_path, "s3cret-token-for-tests-0123456789\n")
    yield d, target, cert, token
    d.stop()


def test_tls_with_token_from_both_clients(binary_dir, tls_daemon):
    d, target, cert, token = tls_daemon
    with offloadd.Client(target, tls_ca_file=str(cert), token_file=str(token), tls_server_name="localhost") as c:
        assert c.health() == "SERVING"
        assert c.node_info().memory.total_bytes > 0
    r = subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", target, "--tls-ca", str(cert),
                        "--token-file", str(token), "--tls-server-name", "localhost", "health"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "SERVING"


def test_wrong_token_is_unauthenticated(tls_daemon, tmp_path):
    d, target, cert, _ = tls_daemon
    bad = tmp_path / "bad_token"
    bad.write_text("not-the-right-token-at-all\n")
    with offloadd.Client(target, tls_ca_file=str(cert), token_file=str(bad), tls_server_name="localhost") as c:
        with pytest.raises(offloadd.Unauthenticated) as e:
            c.node_info()
    assert "invalid bearer token" in e.value.message


def test_tcp_without_credentials_is_refused_by_sdk():
    with pytest.raises(ValueError, match="needs tls_ca_file and token_file"):
        offloadd.Client("127.0.0.1:1")


def test_missing_token_is_unauthenticated(tls_daemon):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    d, target, cert, _ = tls_daemon
    creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with grpc.secure_channel(target, creds, options=[("grpc.ssl_target_name_override", "localhost")]) as ch:
        with pytest.raises(grpc.RpcError) as e:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization" in e.value.details()


def test_plaintext_client_cannot_talk_to_the_tls_port(tls_daemon):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    d, target, _, _ = tls_daemon
    with grpc.insecure_channel(target) as ch:
        with pytest.raises(grpc.RpcError) as e:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    with offloadd.Client(d.target) as c:
        assert c.health() == "SERVING", "the daemon stays up"


# One token per client (docs/security.md): "<name> <token> [operator]" lines. Each named client is
# "token:<name>" for the per-client limits and as a job's submitter, even from the same address,
# and controls only its own jobs unless its line says "operator".
TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef",
          "ops": "ops-token-0123456789abcdef"}


def test_named_tokens_are_separate_clients(binary_dir, tmp_path, shared_dir, source_dir):
    text = "# TCP clients\n" + "".join(f"{n} {t}{' operator' if n == 'ops' else ''}\n" for n, t in TOKENS.items())
    d, target, cert, _ = start_tls_daemon(binary_dir, tmp_path, text, "  max_active_jobs_per_client: 1\n")
    write_demo(tmp_path, shared_dir, source_dir)

    def client(name):
        f = tmp_path / f"{name}.token"
        f.write_text(TOKENS[name] + "\n")
        return offloadd.Client(target, tls_ca_file=str(cert), token_file=str(f), tls_server_name="localhost")

    def spec(name):
        return {"display_name": name, "model": {"path": str(tmp_path / "stories260K")},
                "dataset": {"paths": [str(tmp_path / "alpaca.json")], "format": "alpaca", "max_seq_length": 128},
                "training": {"learning_rate": 1e-4, "per_device_train_batch_size": 2, "max_steps": 100000},
                "output_dir": str(tmp_path / f"out-{name}")}

    ids = []
    try:
        with client("alice") as alice, client("bob") as bob, client("ops") as ops:
            a = alice.create_job(spec("alice-1"))
            ids.append(a.id)
            assert a.submitted_by == "token:alice"
            assert f"job {a.id} created by token:alice" in d.log()
            # alice is at her limit; bob, from the same address, is another client.
            with pytest.raises(offloadd.OffloaddError) as e:
                alice.create_job(spec("alice-2"))
            assert "max_active_jobs_per_client" in e.value.message
            b = bob.create_job(spec("bob-1"))
            ids.append(b.id)
            assert b.submitted_by == "token:bob"
            # bob may not touch alice's job; he may cancel his own; the operator may cancel hers.
            for verb in (bob.cancel_job, bob.pause_job):
                with pytest.raises(offloadd.PermissionDenied) as e:
                    verb(a.id)
                assert f"job {a.id} was submitted by token:alice; token:bob may not" in e.value.message
            assert offloadd.JobState.of(ops.get_job(a.id)) in ("queued", "running")
            bob.cancel_job(b.id)
            ops.cancel_job(a.id)
            for i in ids:
                assert offloadd.JobState.of(ops.wait(i, timeout=120)) == "cancelled"
            assert f"job {a.id} cancelled by token:ops" in d.log()
    finally:
        d.stop()


def test_a_bad_token_file_is_refused_naming_the_line(binary_dir, tmp_path):
    token = tmp_path / "token"
    token.write_text(f"alice {TOKENS['alice']}\nbob {TOKENS['alice']}\n")
    os.chmod(token, 0o600)
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path)
    d.config_path.write_text(d.config_path.read_text().replace(
        "  shutdown_grace_seconds: 5\n",
        f"  shutdown_grace_seconds: 5\n  tcp:\n    listen: 127.0.0.1:{free_port()}\n    tls_cert_file: {token}\n"
        f"    tls_key_file: {token}\n    auth_token_file: {token}\n"))
    r = subprocess.run([str(binary_dir / "daemon" / "offloadd"), "--config", str(d.config_path), "--validate-config"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"{token}:2: this token is already given to another client" in r.stderr + r.stdout
    assert TOKENS["alice"] not in r.stderr + r.stdout  # never echo a token
