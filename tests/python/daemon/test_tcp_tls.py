"""TCP is served only with TLS and a bearer token; both SDKs authenticate, wrong tokens are refused."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402

import offloadd  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def tls_daemon(binary_dir, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True)
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-tests-0123456789\n")
    os.chmod(token, 0o600)
    port = free_port()
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path)
    text = d.config_path.read_text().replace(
        "  shutdown_grace_seconds: 5\n",
        f"  shutdown_grace_seconds: 5\n  tcp:\n    listen: 127.0.0.1:{port}\n    tls_cert_file: {cert}\n"
        f"    tls_key_file: {key}\n    auth_token_file: {token}\n")
    d.config_path.write_text(text)
    d.start()
    yield d, f"127.0.0.1:{port}", cert, token
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
