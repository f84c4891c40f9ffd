"""offloadd-worker started by hand or by a hostile peer: clear errors, no crash, no hang."""
import os
import socket
import struct
import subprocess

import pytest


@pytest.fixture(scope="module")
def worker(tool):
    path = tool.path.parent / "offloadd-worker"
    if not path.exists():
        pytest.skip("offloadd-worker is not built")
    return path


def _start(worker, hello: bytes, nfds: int):
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([str(worker), f"--control-fd={child.fileno()}"],
                            pass_fds=[child.fileno()], stderr=subprocess.PIPE, text=True)
    child.close()
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(nfds)]
    socket.send_fds(parent, [hello], fds)
    for fd in fds:
        os.close(fd)
    reply = parent.recv(4096)
    _, err = proc.communicate(timeout=30)
    parent.close()
    return proc.returncode, reply, err


def test_usage_without_control_fd(worker):
    proc = subprocess.run([str(worker)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "started by the offloadd daemon" in proc.stderr


def test_control_fd_that_is_not_a_socket(worker):
    proc = subprocess.run([str(worker), "--control-fd=0"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "recvmsg" in proc.stderr


def test_malformed_hello_is_refused(worker):
    rc, reply, err = _start(worker, b"garbage", 5)
    assert rc == 1
    assert "malformed hello" in err
    status_code = struct.unpack_from("<i", reply)[0]
    assert status_code == 3  # INVALID_ARGUMENT, reported back to the daemon too


def test_hello_from_another_version_is_refused(worker):
    # WorkerHello (workers/protocol.h): 48 bytes of fields + 256 cpus * 2 bytes; wrong version.
    hello = struct.pack("<IIIIIIIIQiI", 0x4F4C4C45, 999, 0, 1, 0, 1, 0, 0, 0, os.getpid(), 0)
    hello += bytes(512)
    rc, _, err = _start(worker, hello, 5)
    assert rc == 1
    assert "different builds" in err


def test_fds_that_are_not_a_segment_are_refused(worker):
    hello = struct.pack("<IIIIIIIIQiI", 0x4F4C4C45, 1, 0, 1, 0, 1, 0, 0, 0, os.getpid(), 0)
    hello += bytes(512)
    rc, _, err = _start(worker, hello, 5)
    assert rc == 1
    assert "shared segment" in err
