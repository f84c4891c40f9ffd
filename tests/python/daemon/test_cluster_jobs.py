"""A job across hosts through the daemons (resources.hosts): two offloadd daemons on loopback, each
with its own state directory, arena and executors (no memory shared), the second a peer of the first
(cluster.peers, mutual TLS and the cluster token). The coordinator reserves the peer's part, both
start one executor, rank 0 and rank 1 of a Gloo group that meets at the coordinator's c10d store,
each host's arena holding half of the optimizer states (ZeRO-1 across hosts). It trains what one
host trains on the whole batch: losses within 1e-5, weights within 2e-5 (the CPU parity bounds of
tests/python/trainer/test_data_parallel_hosts.py). A peer killed mid-job fails the job within a
bounded time, naming the host; what is not built is refused by name. The same job across two
network namespaces joined by a veth pair runs when the test may create them (root)."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest

from safetensors.torch import load_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "trainer"))
from daemon_process import DaemonProcess  # noqa: E402
from pipeline_testlib import build_model, write_pretokenized  # noqa: E402
from test_training_jobs import Events, logs, progress, spec  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

S = job_pb2
TOKEN = "cluster-token-for-tests-0123456789\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_pki(directory: pathlib.Path, ips: tuple[str, ...] = ()) -> dict[str, pathlib.Path]:
    """A test CA and one certificate it signed for localhost/127.0.0.1, good for both ends of
    mutual TLS, and the cluster's token file (mode 0600); skips without the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    directory.mkdir(parents=True, exist_ok=True)
    p = {k: directory / f"{k}.pem" for k in ("ca", "ca_key", "cert", "key")}
    run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, cwd=directory)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=offloadd-test-ca",
        "-keyout", str(p["ca_key"]), "-out", str(p["ca"]))
    ext = directory / "ext.cnf"
    sans = ",".join(["DNS:localhost", "IP:127.0.0.1", *(f"IP:{ip}" for ip in ips)])
    ext.write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", str(p["key"]),
        "-out", str(directory / "req.csr"))
    run("openssl", "x509", "-req", "-in", str(directory / "req.csr"), "-CA", str(p["ca"]), "-CAkey",
        str(p["ca_key"]), "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(p["cert"]))
    token = directory / "token"
    token.write_text(TOKEN)
    os.chmod(token, 0o600)
    p["token"] = token
    return p


def cluster_yaml(pki, name: str, *, listen: str = "", peers: tuple[tuple[str, str], ...] = (),
                 advertise: str = "127.0.0.1") -> str:
    lines = ["cluster:", f"  name: {name}", f"  tls_cert_file: {pki['cert']}", f"  tls_key_file: {pki['key']}",
             f"  tls_ca_file: {pki['ca']}", f"  token_file: {pki['token']}", "  lost_host_seconds: 5",
             "  reserve_timeout_seconds: 20"]
    if listen:
        lines.append(f"  listen: {listen}")
    if peers:
        lines.append(f"  advertise_address: {advertise}")
        lines.append("  peers:")
        lines += [f"    - {{name: {n}, address: {a}}}" for n, a in peers]
    return "\n".join(lines) + "\njobs:\n  group_timeout_seconds: 60\n"


def daemon(binary_dir, ws: pathlib.Path, name: str, extra: str, netns: str = "") -> DaemonProcess:
    """A daemon in ws/<name> (its own state directory and socket) whose jobs may use all of ws;
    in network namespace `netns` when set (its Unix sockets stay reachable: they are files)."""
    workdir = ws / name
    workdir.mkdir()
    binary = binary_dir / "daemon" / "offloadd"
    if netns:
        wrapper = workdir / "offloadd-in-netns"
        wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {netns} {binary} "$@"\n')
        wrapper.chmod(0o755)
        binary = wrapper
    d = DaemonProcess(binary, workdir, extra)
    d.config_path.write_text(d.config_path.read_text().replace(f"allowed_roots: [{workdir}]",
                                                               f"allowed_roots: [{ws}]"))
    return d


@pytest.fixture(autouse=True)
def cpu_nodes(monkeypatch):
    """Both daemons are CPU nodes, also on a GPU machine: two daemons of one machine would each
    take its GPU 0, and the group's two ranks one device."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture()
def cluster(binary_dir, tmp_path):
    """Daemon "a" coordinating, daemon "b" its peer on a loopback port."""
    pki = cluster_pki(tmp_path / "pki")
    port = free_port()
    b = daemon(binary_dir, tmp_path, "b", cluster_yaml(pki, "b", listen=f"127.0.0.1:{port}")).start()
    a = daemon(binary_dir, tmp_path, "a", cluster_yaml(pki, "a", peers=(("b", f"127.0.0.1:{port}"),)))
    try:
        a.start()
        yield a, b
    finally:
        a.stop()
        b.stop()


def train_one_and_two_hosts(a: DaemonProcess, b: DaemonProcess, ws: pathlib.Path,
                            per_host: int = 1) -> list[str]:
    """A one-host job of one rank and a two-host job of `per_host` ranks per host (the batch split
    between the 2 x per_host ranks) through coordinator `a`; asserts they train alike and returns
    the two-host job's log lines."""
    build_model(ws / "model", layers=2)
    write_pretokenized(ws / "data.jsonl", n=64)
    runs = {}
    with offloadd.Client(a.target) as c:
        for name, hosts, batch in (("one", 1, 4), ("two", 2, 4 // (2 * per_host))):
            s = spec(ws, name, steps=6, save_steps=100)
            s["training"]["per_device_train_batch_size"] = batch
            s["resources"] = {"hosts": hosts}
            if hosts > 1 and per_host > 1:
                s["resources"]["gpus_per_host"] = per_host
            seen = []
            done = c.submit(s, wait=True, timeout=300, on_event=seen.append)
            assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, logs(seen), b.log()[-3000:])
            runs[name] = (progress(seen), logs(seen))
    (one, _), (two, two_logs) = runs["one"], runs["two"]
    assert [p.step for p in one] == [p.step for p in two] == list(range(1, 7))
    for x, y in zip(one, two):
        assert x.tokens_seen == y.tokens_seen
        assert abs(x.loss - y.loss) <= 1e-5 * max(1.0, abs(x.loss)), (x.step, x.loss, y.loss)
    wa, wb = load_file(ws / "one" / "model.safetensors"), load_file(ws / "two" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        assert (wa[name] - wb[name]).abs().max().item() <= 2e-5, name
    return two_logs


def test_a_job_across_two_daemons_trains_like_one_host(cluster, tmp_path):
    a, b = cluster
    two_logs = train_one_and_two_hosts(a, b, tmp_path)
    # One executor per host: rank 0 here, rank 1 started by the peer and reported as its host's.
    assert any(m.startswith("every host reserved its part (2 hosts)") for m in two_logs), two_logs
    assert any(m.startswith("host b: executor started") and " rank 1 " in m for m in two_logs), two_logs
    assert "reserved for a" in b.log(), b.log()


def test_two_daemons_of_two_ranks_each_train_like_one_host(cluster, tmp_path):
    """resources.gpus_per_host 2: each daemon starts two CPU ranks of its host (ranks numbered
    host by host, as torchrun's), sharing that host's arena; the four train what one rank does."""
    a, b = cluster
    two_logs = train_one_and_two_hosts(a, b, tmp_path, per_host=2)
    assert any(m.startswith("every host reserved its part (2 hosts)") for m in two_logs), two_logs
    started = [m for m in two_logs if "executor started" in m]
    here = sorted(m.split(" rank ")[1].split()[0] for m in started if not m.startswith("host b:"))
    peer = sorted(m.split(" rank ")[1].split()[0] for m in started if m.startswith("host b:"))
    assert (here, peer) == (["0", "1"], ["2", "3"]), started


def test_two_daemons_in_two_network_namespaces(binary_dir, tmp_path, monkeypatch):
    """The same across a veth pair: each daemon in its own network namespace, the peer service,
    the rendezvous and every Gloo collective crossing the pair. Needs root (ip netns)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "trainer"))
    from test_data_parallel_netns import two_namespaces as make_namespaces  # noqa: F401

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns)")
    gen = make_namespaces.__wrapped__()
    ns, veth, addrs = next(gen)
    try:
        pki = cluster_pki(tmp_path / "pki", ips=tuple(addrs))
        port = free_port()
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", veth[1])
        b = daemon(binary_dir, tmp_path, "b", cluster_yaml(pki, "b", listen=f"{addrs[1]}:{port}"), ns[1])
        b.start()
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", veth[0])
        a = daemon(binary_dir, tmp_path, "a",
                   cluster_yaml(pki, "a", peers=(("b", f"{addrs[1]}:{port}"),), advertise=addrs[0]), ns[0])
        try:
            a.start()
            two_logs = train_one_and_two_hosts(a, b, tmp_path)
            assert any(m.startswith(f"every host reserved its part (2 hosts); rendezvous tcp://{addrs[0]}:")
                       for m in two_logs), two_logs
        finally:
            a.stop()
            b.stop()
    finally:
        gen.close()


def across_two_hosts(per_host: int) -> dict:
    return {"hosts": 2, "gpus_per_host": per_host} if per_host > 1 else {"hosts": 2}


@pytest.mark.parametrize("per_host", [1, 2])
def test_a_killed_peer_fails_the_job_naming_the_host(cluster, tmp_path, per_host):
    """With two ranks per host too: the peer's daemon and both its executors die at once."""
    a, b = cluster
    build_model(tmp_path / "model", layers=2)
    write_pretokenized(tmp_path / "data.jsonl", n=64)
    with offloadd.Client(a.target) as c:
        s = spec(tmp_path, "killed", steps=100000, save_steps=100000)
        s["training"]["per_device_train_batch_size"] = 2 // per_host
        s["resources"] = across_two_hosts(per_host)
        job = c.create_job(s)
        events = Events(c, job.id)
        deadline = time.monotonic() + 120
        while not any(getattr(p, "step", 0) >= 2 for p in progress(events.events)):
            assert time.monotonic() < deadline, logs(events.events)
            time.sleep(0.2)
        b.proc.send_signal(signal.SIGKILL)  # the host is gone: its daemon and (death signal) executor
        b.proc.wait()
        killed = time.monotonic()
        while c.get_job(job.id).state not in (S.JOB_STATE_FAILED, S.JOB_STATE_SUCCEEDED):
            assert time.monotonic() - killed < 30, "the job did not fail within 30 s of its peer's death"
            time.sleep(0.2)
        failed = c.get_job(job.id)
        print(f"the job failed {time.monotonic() - killed:.1f} s after its peer was killed: {failed.error.message}")
    assert failed.state == S.JOB_STATE_FAILED
    assert "host b (127.0.0.1:" in failed.error.message, failed.error.message


def test_a_silent_peer_fails_the_job_within_the_keepalive_bound(cluster, tmp_path):
    """The peer's daemon SIGSTOPped: its connection stays open and its kernel still acknowledges,
    so only the keepalive finds it (a ping every 1 s of a quiet stream, unanswered for
    cluster.lost_host_seconds, 5 here); the job fails naming the host. Its executor keeps running
    meanwhile: the coordinator's rank is stopped at once (force), as for a killed peer."""
    a, b = cluster
    build_model(tmp_path / "model", layers=2)
    write_pretokenized(tmp_path / "data.jsonl", n=64)
    try:
        with offloadd.Client(a.target) as c:
            s = spec(tmp_path, "silent", steps=100000, save_steps=100000)
            s["training"]["per_device_train_batch_size"] = 2
            s["resources"] = across_two_hosts(1)
            job = c.create_job(s)
            events = Events(c, job.id)
            deadline = time.monotonic() + 120
            while not any(getattr(p, "step", 0) >= 2 for p in progress(events.events)):
                assert time.monotonic() < deadline, logs(events.events)
                time.sleep(0.2)
            b.proc.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            # The keepalive's ping interval and timeout, then the local rank's forced stop (at
            # most jobs' kill_grace_seconds, 5 s by default), and scheduling on two loaded cores.
            bound = 1 + 5 + 5 + 4
            while c.get_job(job.id).state not in (S.JOB_STATE_FAILED, S.JOB_STATE_SUCCEEDED):
                assert time.monotonic() - stopped < bound, f"the job did not fail within {bound} s"
                time.sleep(0.2)
            failed = c.get_job(job.id)
            waited = time.monotonic() - stopped
            print(f"the job failed {waited:.1f} s after its peer was stopped: {failed.error.message}")
    finally:
        b.proc.send_signal(signal.SIGCONT)  # the fixture stops it
    assert failed.state == S.JOB_STATE_FAILED
    assert "host b (127.0.0.1:" in failed.error.message and "was lost" in failed.error.message, \
        failed.error.message
    # Not before the keepalive's timeout: nothing else saw the silence.
    assert waited >= 5 - 0.5, waited


def wait_for(c, job_id: str, states, bound: float = 120):
    deadline = time.monotonic() + bound
    while (job := c.get_job(job_id)).state not in states:
        assert time.monotonic() < deadline, (job.state, job.error)
        time.sleep(0.2)
    return job


@pytest.mark.parametrize("per_host", [1, 2])
def test_pause_resume_and_cancel_reach_the_peer(cluster, tmp_path, per_host):
    """Pause checkpoints on both hosts (one partition each, committed by the coordinator's rank),
    resume continues from partition 0's checkpoint on both, and cancel stops the peer's part too;
    with one rank per host and with two (each host's ranks stop together)."""
    a, b = cluster
    build_model(tmp_path / "model", layers=2)
    write_pretokenized(tmp_path / "data.jsonl", n=64)
    with offloadd.Client(a.target) as c:
        s = spec(tmp_path, "paused", steps=100000, save_steps=100000)
        s["training"]["per_device_train_batch_size"] = 2 // per_host
        s["resources"] = across_two_hosts(per_host)
        job = c.create_job(s)
        events = Events(c, job.id)
        deadline = time.monotonic() + 120
        while not any(p.step >= 2 for p in progress(events.events)):
            assert time.monotonic() < deadline, logs(events.events)
            time.sleep(0.2)
        c.pause_job(job.id)
        paused = wait_for(c, job.id, (S.JOB_STATE_PAUSED, S.JOB_STATE_FAILED))
        assert paused.state == S.JOB_STATE_PAUSED, (paused.error, logs(events.events))
        step = paused.latest_checkpoint_step
        assert step >= 2, (logs(events.events), b.log()[-2000:])
        for h in (0, 1):
            assert (tmp_path / "paused" / f"partition-{h}-of-2" / f"checkpoint-{step}").is_dir(), h
        c.resume_job(job.id)
        deadline = time.monotonic() + 120
        while not any(p.step > step + 1 for p in progress(events.events)):
            assert time.monotonic() < deadline, logs(events.events)
            time.sleep(0.2)
        assert any(m == f"resuming from {tmp_path}/paused/partition-0-of-2/checkpoint-{step}"
                   for m in logs(events.events)), logs(events.events)
        c.cancel_job(job.id)
        cancelled = wait_for(c, job.id, (S.JOB_STATE_CANCELLED, S.JOB_STATE_FAILED), bound=60)
        assert cancelled.state == S.JOB_STATE_CANCELLED, cancelled.error
    # Both parts of the peer ended (paused, then cancelled), and it holds nothing now.
    deadline = time.monotonic() + 30
    while b.log().count(f"job {job.id} host 1 ended: CANCELLED") < 2:
        assert time.monotonic() < deadline, b.log()[-3000:]
        time.sleep(0.2)


def test_a_busy_peer_refuses_and_nothing_starts(cluster, tmp_path):
    """All or nothing: a peer running a job of its own (a node without GPUs runs one at a time)
    refuses its part, so the job across hosts fails naming it, and the coordinator started no
    executor."""
    a, b = cluster
    build_model(tmp_path / "model", layers=2)
    write_pretokenized(tmp_path / "data.jsonl", n=16)
    with offloadd.Client(b.target) as cb, offloadd.Client(a.target) as ca:
        own = cb.create_job(spec(tmp_path, "own", steps=100000, save_steps=100000))
        wait_for(cb, own.id, (S.JOB_STATE_RUNNING,))
        s = spec(tmp_path, "refused", steps=2, save_steps=100)
        s["resources"] = {"hosts": 2}
        seen = []
        done = ca.submit(s, wait=True, timeout=120, on_event=seen.append)
        cb.cancel_job(own.id, force=True)
    assert done.state == S.JOB_STATE_FAILED, done
    assert "not every host of the job reserved its part, so none started: host b (127.0.0.1:" in done.error.message
    assert "host b is busy" in done.error.message, done.error.message
    assert not any(m.startswith("executor started") for m in logs(seen)), logs(seen)


def peer_call(address: str, pki, *, token: str | None, client_cert: bool) -> grpc.RpcError | bytes:
    """One HostPart call to a peer with an empty first message (not a reserve), through a raw
    channel: with the cluster's certificate and token it reaches the service, which refuses it."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=pki["key"].read_bytes() if client_cert else None,
        certificate_chain=pki["cert"].read_bytes() if client_cert else None)
    with grpc.secure_channel(address, creds) as ch:
        call = ch.stream_stream("/offloadd.internal.PeerService/HostPart",
                                request_serializer=lambda m: m, response_deserializer=lambda m: m)
        metadata = [("authorization", f"Bearer {token}")] if token else []
        try:
            return b"".join(call(iter([b""]), metadata=metadata, timeout=10))
        except grpc.RpcError as e:
            return e


def test_the_peer_service_needs_the_cluster_certificate_and_token(binary_dir, tmp_path):
    pki = cluster_pki(tmp_path / "pki")
    port = free_port()
    b = daemon(binary_dir, tmp_path, "b", cluster_yaml(pki, "b", listen=f"127.0.0.1:{port}")).start()
    try:
        address = f"localhost:{port}"
        ok = peer_call(address, pki, token=TOKEN.strip(), client_cert=True)
        assert ok.code() == grpc.StatusCode.INVALID_ARGUMENT and "expected reserve first" in ok.details()
        wrong = peer_call(address, pki, token="not-the-cluster-token-0123456789", client_cert=True)
        assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED, wrong
        missing = peer_call(address, pki, token=None, client_cert=True)
        assert missing.code() == grpc.StatusCode.UNAUTHENTICATED, missing
        no_cert = peer_call(address, pki, token=TOKEN.strip(), client_cert=False)
        assert no_cert.code() == grpc.StatusCode.UNAVAILABLE, no_cert  # refused in the handshake
    finally:
        b.stop()


def test_what_is_not_built_across_hosts_is_refused_by_name(cluster, tmp_path):
    a, _ = cluster
    build_model(tmp_path / "model", layers=2)
    write_pretokenized(tmp_path / "data.jsonl", n=16)
    with offloadd.Client(a.target) as c:
        for resources, field, auto_batch in (
                ({"hosts": 3}, "resources.hosts", False),
                # More ranks per host than this node has cores (or GPUs).
                ({"hosts": 2, "gpus_per_host": 4096}, "resources.gpus_per_host", False),
                # The trainer's data-parallel refusals hold for the group across hosts too.
                ({"hosts": 2, "gpus_per_host": 2}, "training.per_device_train_batch_size", True),
                ({"gpus_per_host": 2}, "resources.gpus_per_host", False)):
            s = spec(tmp_path, "refused", steps=1, save_steps=100)
            s["resources"] = resources
            if auto_batch:
                s["training"]["auto_find_batch_size"] = True
            with pytest.raises(offloadd.OffloaddError) as e:
                c.create_job(s)
            assert field in str(e.value), (resources, str(e.value))
