"""Startup hardening: one daemon per state directory, a Unix socket
that never exists with another mode than the configured one, and `--validate-config` refusing
what startup refuses."""

from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import sys
import threading

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402

import offloadd  # noqa: E402


def offloadd_bin(binary_dir):
    return binary_dir / "daemon" / "offloadd"


def test_second_daemon_on_the_same_state_dir_is_refused(binary_dir, tmp_path):
    first = DaemonProcess(offloadd_bin(binary_dir), tmp_path).start()
    try:
        # Another socket, the same state_dir.
        other = tmp_path / "other.yaml"
        other.write_text(first.config_path.read_text().replace(str(first.socket_path), str(tmp_path / "b.sock")))
        r = subprocess.run([str(offloadd_bin(binary_dir)), "--config", str(other)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0
        assert f"state_dir {tmp_path / 'state'} is in use by another offloadd (pid {first.proc.pid})" in r.stdout + r.stderr
        with offloadd.Client(first.target) as c:
            assert c.health() == "SERVING"
    finally:
        first.stop()
    # The lock dies with its holder (kill -9 above): a new daemon starts.
    again = DaemonProcess(offloadd_bin(binary_dir), tmp_path).start()
    again.stop()


def test_socket_never_has_another_mode_than_configured(binary_dir, tmp_path):
    d = DaemonProcess(offloadd_bin(binary_dir), tmp_path)
    seen = set()
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                seen.add(stat.S_IMODE(os.lstat(d.socket_path).st_mode))
            except FileNotFoundError:
                pass

    t = threading.Thread(target=watch)
    old = os.umask(0)  # the daemon inherits umask 000: gRPC would create the socket 0777
    try:
        t.start()
        d.start()
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.lstat(d.socket_path).st_mode) == 0o600
        stop.set()
        t.join()
        # The watcher samples while the daemon binds; on a loaded machine it may see the socket only
        # after start() returned (or not at all: the lstat above is the sample then). Whatever it
        # saw must be the configured mode: never the umask's 0777 of a socket not yet chmod'ed.
        assert seen <= {0o600}, {oct(m) for m in seen}
        assert not [p for p in d.socket_path.parent.iterdir() if p.name.startswith(".offloadd-")]
    finally:
        stop.set()
        d.stop()


def validate(binary_dir, config: pathlib.Path):
    return subprocess.run([str(offloadd_bin(binary_dir)), "--config", str(config), "--validate-config"],
                          capture_output=True, text=True, timeout=60)


def test_validate_config_refuses_what_startup_refuses_and_warns(binary_dir, tmp_path):
    d = DaemonProcess(offloadd_bin(binary_dir), tmp_path)
    token = tmp_path / "token"
    token.write_text("0123456789abcdef0123\n")
    token.chmod(0o644)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True, timeout=60)
    base = d.config_path.read_text()
    tcp = (f"  tcp:\n    listen: 127.0.0.1:0\n    tls_cert_file: {cert}\n    tls_key_file: {key}\n"
           f"    auth_token_file: {token}\n")
    cfg = tmp_path / "tcp.yaml"
    cfg.write_text(base.replace("  shutdown_grace_seconds: 5\n", "  shutdown_grace_seconds: 5\n" + tcp))
    r = validate(binary_dir, cfg)
    assert r.returncode == 2 and "is readable by group or others; chmod 600 it" in r.stderr, r.stderr
    token.chmod(0o600)
    assert validate(binary_dir, cfg).returncode == 0
    loose = tmp_path / "loose.yaml"
    loose.write_text(base.replace('unix_socket_mode: "0600"', 'unix_socket_mode: "0777"')
                     .replace(f"allowed_roots: [{tmp_path}]", "allowed_roots: [/]"))
    r = validate(binary_dir, loose)
    assert r.returncode == 0, r.stderr
    assert "warning: server.unix_socket_mode 0777 lets every local user submit jobs" in r.stderr, r.stderr
    assert "warning: allowed_roots includes /" in r.stderr, r.stderr


def test_metrics_listen_beyond_loopback_is_warned(binary_dir, tmp_path):
    """/metrics has no authentication, so a metrics.listen other hosts reach is
    warned about by --validate-config and in the daemon's log at startup; loopback is not."""
    d = DaemonProcess(offloadd_bin(binary_dir), tmp_path)
    base = d.config_path.read_text()
    warning = "warning: metrics.listen 0.0.0.0:0 is not a loopback address: /metrics has no authentication"
    for listen, warned in (("127.0.0.1:0", False), ("'[::1]:0'", False), ("localhost:0", False),
                           ("0.0.0.0:0", True), ("'[::]:0'", True)):
        cfg = tmp_path / "metrics.yaml"
        cfg.write_text(base.replace("listen: 127.0.0.1:0", f"listen: {listen}"))
        r = validate(binary_dir, cfg)
        assert r.returncode == 0, r.stderr
        assert ("is not a loopback address: /metrics has no authentication" in r.stderr) == warned, (listen, r.stderr)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    daemon = DaemonProcess(offloadd_bin(binary_dir), open_to_all)
    daemon.config_path.write_text(daemon.config_path.read_text().replace("listen: 127.0.0.1:0", "listen: 0.0.0.0:0"))
    daemon.start()
    try:
        assert warning.removeprefix("warning: ") in daemon.log(), daemon.log()
    finally:
        daemon.stop()
