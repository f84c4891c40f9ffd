"""offloadd-train started as the cluster launchers start ranks: the torchrun environment
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) instead of
--rank/--world-size/--rendezvous. Two CPU ranks equal one rank on the whole batch, within
test_data_parallel.py's bounds (loss 1e-5, weights 2e-5: the same arithmetic, summed in a
different order):

- as a Slurm batch script starts them (srun, the script exporting the variables): rank 0 serves
  the c10d TCPStore at MASTER_ADDR:MASTER_PORT;
- under torchrun itself (torch.distributed.run from the test's venv): its agent serves the store
  (TORCHELASTIC_USE_AGENT_STORE=True) and every rank connects as a client.

Bad values are refused by name before anything is loaded, and a group spanning hosts with several
ranks on each is refused as not built (one rank per host: test_data_parallel_hosts.py)."""

import os
import socket
import subprocess
import sys

import pytest

from pipeline_testlib import build_model, run_train, write_pretokenized
from test_data_parallel import args, assert_close_runs, free_port

TORCHRUN_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                 "GROUP_RANK", "GROUP_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture
def runs(binary_dir, tmp_path):
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    one = tmp_path / "one"
    run_train(binary_dir, args(model, data, one, batch=4))
    return model, data, one


def test_ranks_from_the_environment_equal_one_rank(binary_dir, tmp_path, runs):
    model, data, one = runs
    two = tmp_path / "two"
    exe = str(binary_dir / "trainer" / "offloadd-train")
    port = free_port()
    procs = [subprocess.Popen([exe, *args(model, data, two, batch=2, extra=["--parallel-timeout=120"])],
                              env=clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=r, WORLD_SIZE=2,
                                            LOCAL_RANK=r, LOCAL_WORLD_SIZE=2),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert f"data parallel: rank 0 of 2 (gloo, tcp://127.0.0.1:{port}" in outs[0][1]
    assert_close_runs(one, two)


def test_torchrun_starts_the_ranks(binary_dir, tmp_path, runs):
    model, data, one = runs
    two = tmp_path / "two"
    exe = str(binary_dir / "trainer" / "offloadd-train")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--no-python", exe, *args(model, data, two, batch=2, extra=["--parallel-timeout=120"])]
    r = subprocess.run(cmd, env=clean_env(OMP_NUM_THREADS=1), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "data parallel: rank 0 of 2 (gloo" in r.stderr
    assert_close_runs(one, two)


@pytest.mark.parametrize("env,named", [
    ({"RANK": 0, "WORLD_SIZE": 2, "MASTER_PORT": 29500}, "MASTER_ADDR is not set"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29500, "RANK": 2, "WORLD_SIZE": 2}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http", "RANK": 0, "WORLD_SIZE": 2}, "MASTER_PORT='http'"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29500, "RANK": 1, "WORLD_SIZE": 2, "LOCAL_WORLD_SIZE": 2,
      "LOCAL_RANK": 0}, "LOCAL_RANK=0 disagrees with RANK=1"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29500, "RANK": 0, "WORLD_SIZE": 6, "LOCAL_WORLD_SIZE": 4},
     "LOCAL_WORLD_SIZE=4 does not divide WORLD_SIZE=6"),
])
def test_bad_environments_are_refused_by_name(binary_dir, tmp_path, env, named):
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    cmd = [str(binary_dir / "trainer" / "offloadd-train"), *args(model, data, tmp_path / "out", batch=2)]
    r = subprocess.run(cmd, env=clean_env(**env), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert named in r.stderr, r.stderr
    assert not (tmp_path / "out" / "stats.jsonl").exists()


def test_a_killed_rank_fails_the_other_within_the_group_timeout(binary_dir, tmp_path):
    """Started apart, the ranks have no common launcher to kill the others: rank 0 must fail on
    its own, within --parallel-timeout (the Gloo timeout), naming the collective it was in, itself
    and the group's hosts and processes."""
    import signal
    import time

    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    out = tmp_path / "two"
    exe = str(binary_dir / "trainer" / "offloadd-train")
    port, timeout = free_port(), 20
    procs = [subprocess.Popen([exe, *args(model, data, out, batch=2,
                                          extra=["--max-steps=100000", f"--parallel-timeout={timeout}"])],
                              env=clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=r, WORLD_SIZE=2,
                                            LOCAL_WORLD_SIZE=2),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    try:
        stats = out / "stats.jsonl"
        deadline = time.monotonic() + 120
        while not (stats.exists() and stats.read_text().count("\n") >= 2):
            assert procs[0].poll() is None and procs[1].poll() is None, procs[0].stderr.read()
            assert time.monotonic() < deadline, "no step within 120 s"
            time.sleep(0.1)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, err = procs[0].communicate(timeout=timeout + 60)
        waited = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode != 0, err
    assert waited <= timeout + 30, f"rank 0 took {waited:.1f} s to fail"
    # This rank, the collective, and who was in the group (the lost peer's host among them).
    assert "data-parallel" in err and "on rank 0 of 2" in err, err
    assert f"rank 1 on {socket.gethostname()} (pid {procs[1].pid})" in err, err
    print(f"\nrank 0 failed {waited:.1f} s after rank 1 was killed:\n{err.strip().splitlines()[-1]}")
