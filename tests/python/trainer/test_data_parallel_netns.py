"""Two ranks in separate network namespaces, joined over c10d with a TCP
rendezvous, train across a real network interface (a veth pair this test creates, with
addresses only it uses) and equal one rank on the whole batch (test_data_parallel.py's bounds).

The first two tests' ranks still share the host's memory (rank 1 maps rank 0's arena through
/proc): what crosses the network is the rendezvous and every Gloo collective. The last runs two
hosts with separate arenas (ZeRO-1 across hosts). Needs root (ip netns); skips otherwise."""

import os
import random
import shutil
import subprocess

import pytest

from pipeline_testlib import build_model, run_train, write_pretokenized
from test_data_parallel import args, assert_close_runs


def sh(*cmd, check=True):
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


@pytest.fixture
def two_namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns)")
    tag = f"odp{os.getpid() % 100000}"
    ns = [f"{tag}a", f"{tag}b"]
    veth = [f"{tag}va", f"{tag}vb"]
    subnet = random.randrange(0, 64) * 4  # a /30 of 10.213.0.0/24 nobody else here uses
    addrs = [f"10.213.{random.randrange(1, 250)}.{subnet + 1}", None]
    addrs[1] = addrs[0].rsplit(".", 1)[0] + f".{subnet + 2}"
    try:
        if sh("ip", "netns", "add", ns[0], check=False).returncode != 0:
            pytest.skip("cannot create network namespaces here")
        sh("ip", "netns", "add", ns[1])
        sh("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for n, v, a in zip(ns, veth, addrs):
            sh("ip", "link", "set", v, "netns", n)
            sh("ip", "-n", n, "addr", "add", f"{a}/30", "dev", v)
            sh("ip", "-n", n, "link", "set", v, "up")
            sh("ip", "-n", n, "link", "set", "lo", "up")
        yield ns, veth, addrs
    finally:
        for n in ns:
            sh("ip", "netns", "del", n, check=False)  # takes its end of the veth pair with it


def rx_bytes(ns, dev):
    r = sh("ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/rx_bytes")
    return int(r.stdout.strip())


def test_ranks_in_two_network_namespaces_train_over_a_veth_pair(binary_dir, tmp_path, two_namespaces):
    ns, veth, addrs = two_namespaces
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    one, two = tmp_path / "one", tmp_path / "two"
    run_train(binary_dir, args(model, data, one, batch=4))
    before = rx_bytes(ns[1], veth[1])
    exe = str(binary_dir / "trainer" / "offloadd-train")
    procs = []
    for rank in (0, 1):
        cmd = ["ip", "netns", "exec", ns[rank], "env", f"GLOO_SOCKET_IFNAME={veth[rank]}", exe,
               *args(model, data, two, batch=2,
                     extra=[f"--rank={rank}", "--world-size=2", f"--rendezvous=tcp://{addrs[0]}:29731",
                            "--parallel-timeout=120"])]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    moved = rx_bytes(ns[1], veth[1]) - before
    # Every step's reduce-scatters cross the pair: at least rank 0's half of the gradients.
    assert moved > 100_000, f"only {moved} bytes crossed {veth[1]}"
    print(f"\n{moved} bytes received by rank 1 over {veth[1]} ({addrs[1]})")
    assert_close_runs(one, two)


def test_torchrun_environment_across_two_network_namespaces(binary_dir, tmp_path, two_namespaces):
    """The same pair started by the torchrun environment (MASTER_ADDR on rank 0's side of the
    veth pair), as Slurm or a PyTorchJob would start it; LOCAL_WORLD_SIZE=2: the two namespaces
    are one host, so the ranks share rank 0's arena."""
    from test_data_parallel_torchrun import clean_env

    ns, veth, addrs = two_namespaces
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    one, two = tmp_path / "one", tmp_path / "two"
    run_train(binary_dir, args(model, data, one, batch=4))
    exe = str(binary_dir / "trainer" / "offloadd-train")
    procs = []
    for rank in (0, 1):
        env = clean_env(MASTER_ADDR=addrs[0], MASTER_PORT=29733, RANK=rank, WORLD_SIZE=2, LOCAL_RANK=rank,
                        LOCAL_WORLD_SIZE=2, GLOO_SOCKET_IFNAME=veth[rank])
        cmd = ["ip", "netns", "exec", ns[rank], exe,
               *args(model, data, two, batch=2, extra=["--parallel-timeout=120"])]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert f"tcp://{addrs[0]}:29733" in outs[0][1]
    assert_close_runs(one, two)


@pytest.mark.parametrize("per_host", [1, 2])
def test_two_hosts_with_separate_arenas_in_two_namespaces(binary_dir, tmp_path, two_namespaces, per_host):
    """ZeRO-1 across hosts: each host in its own network namespace and, where unshare exists, its
    own PID, mount and IPC namespaces too, so that its ranks cannot open the other host's
    /proc/<pid>/fd: each host holds its half of the optimizer states in its own arena (with two
    ranks per host, shared by them), and the result still equals one rank on the whole batch."""
    import shlex

    from test_data_parallel_torchrun import clean_env

    ns, veth, addrs = two_namespaces
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    one, two = tmp_path / "one", tmp_path / "two"
    run_train(binary_dir, args(model, data, one, batch=4))
    before = rx_bytes(ns[1], veth[1])
    exe = str(binary_dir / "trainer" / "offloadd-train")
    isolate = ["unshare", "--pid", "--fork", "--mount-proc", "--ipc"] if shutil.which("unshare") else []
    world, port = 2 * per_host, 29735 + per_host
    procs = []
    for h in (0, 1):
        ranks = []  # the host's ranks, started together inside its namespaces
        for rank in range(h * per_host, (h + 1) * per_host):
            ranks.append(shlex.join(
                ["env", f"RANK={rank}", f"LOCAL_RANK={rank % per_host}", exe,
                 *args(model, data, two, batch=4 // world, extra=["--parallel-timeout=120"])]))
        script = " ".join(f"{r} & p{i}=$!;" for i, r in enumerate(ranks))
        script += " rc=0;" + "".join(f" wait $p{i} || rc=1;" for i in range(len(ranks))) + " exit $rc"
        env = clean_env(MASTER_ADDR=addrs[0], MASTER_PORT=port, WORLD_SIZE=world,
                        LOCAL_WORLD_SIZE=per_host, GROUP_RANK=h, GLOO_SOCKET_IFNAME=veth[h])
        cmd = ["ip", "netns", "exec", ns[h], *isolate, "sh", "-c", script]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert f"rank 0 of {world}, ZeRO-1 across 2 hosts" in outs[0][1], outs[0][1]
    moved = rx_bytes(ns[1], veth[1]) - before
    # Every step's reduce-scatters and all-gathers cross the pair.
    assert moved > 200_000, f"only {moved} bytes crossed {veth[1]}"
    print(f"\n2 hosts x {per_host}: {moved} bytes received by host 1 over {veth[1]} ({addrs[1]});"
          f" isolated: {bool(isolate)}")
    assert_close_runs(one, two)
