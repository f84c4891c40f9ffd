"""Starts the real offloadd binary for integration tests and waits for systemd-style readiness."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import textwrap

import pytest


def self_signed_localhost(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A one-day self-signed certificate for localhost and 127.0.0.1 and its key, made with the
    openssl CLI into `directory` (cert.pem, key.pem); skips the calling test without openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True)
    return cert, key


class DaemonProcess:
    """offloadd on a temp Unix socket with its metrics on a free port (port 0).

    Readiness is observed the way systemd does: the test listens on NOTIFY_SOCKET and waits for
    READY=1, so no polling is needed.
    """

    def __init__(self, binary: pathlib.Path, workdir: pathlib.Path, extra_yaml: str = ""):
        self.binary = binary
        self.workdir = workdir
        self.socket_path = workdir / "run" / "offloadd.sock"
        self.config_path = workdir / "offloadd.yaml"
        self.log_path = workdir / "offloadd.log"
        self.config_path.write_text(
            textwrap.dedent(
                f"""\
                state_dir: {workdir / "state"}
                allowed_roots: [{workdir}]
                server:
                  unix_socket: {self.socket_path}
                  unix_socket_mode: "0600"
                  shutdown_grace_seconds: 5
                metrics:
                  listen: 127.0.0.1:0
                storage:
                  directories:
                    - path: {workdir}
                """
            )
            + extra_yaml
        )
        self.proc: subprocess.Popen | None = None
        self.metrics_port = 0
        self.notifications: list[str] = []

    @property
    def target(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self, timeout: float = 30) -> "DaemonProcess":
        notify_path = str(self.workdir / "notify.sock")
        # A restart on the same workdir (tests of crash recovery): a new notify socket, and the
        # previous run's log kept as offloadd.log.<n>.
        if os.path.exists(notify_path):
            os.unlink(notify_path)
        if self.log_path.exists():
            n = 1
            while self.log_path.with_name(f"{self.log_path.name}.{n}").exists():
                n += 1
            self.log_path.rename(self.log_path.with_name(f"{self.log_path.name}.{n}"))
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(notify_path)
        self._notify.settimeout(timeout)
        env = dict(os.environ, NOTIFY_SOCKET=notify_path)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(self.binary), "--config", str(self.config_path)], stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        try:
            while True:
                msg = self._notify.recv(4096).decode()
                self.notifications.append(msg)
                if "READY=1" in msg:
                    break
        except socket.timeout:
            self.stop()
            raise AssertionError(f"offloadd did not become ready in {timeout}s:\n{self.log()}")
        m = re.search(r"metrics listening on [\d.]+:(\d+)", self.log())
        assert m, self.log()
        self.metrics_port = int(m.group(1))
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def next_notification(self, timeout: float = 10) -> str:
        self._notify.settimeout(timeout)
        msg = self._notify.recv(4096).decode()
        self.notifications.append(msg)
        return msg

    def terminate(self, timeout: float = 30) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
        if getattr(self, "_notify", None):
            self._notify.close()


def tiny_assets(root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The tiny Llama (2 layers, hidden 32) under <root>/model and 64 pretokenized documents in
    <root>/data.jsonl (tests/python/trainer/pipeline_testlib.py; imported here only when used: it
    loads torch)."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "trainer"))
    from pipeline_testlib import build_model, write_pretokenized

    return build_model(root / "model", layers=2), write_pretokenized(root / "data.jsonl", n=64)


def pretokenized_spec(root: pathlib.Path, out: str, *, model: str = "model", steps: int = 2, save_steps: int = 100,
                      accum: int = 1) -> dict:
    """A small fp32 job on <root>/<model> and <root>/data.jsonl (pretokenized, 64 tokens per row)
    writing <root>/<out>: the path-confinement tests' job."""
    return {
        "display_name": out,
        "model": {"path": str(root / model), "compute_dtype": "fp32"},
        "dataset": {"paths": [str(root / "data.jsonl")], "format": "pretokenized", "max_seq_length": 64},
        "training": {"learning_rate": 1e-3, "per_device_train_batch_size": 4, "max_steps": steps,
                     "gradient_accumulation_steps": accum, "seed": 7, "logging_steps": 1,
                     "save_steps": save_steps},
        "output_dir": str(root / out),
    }
