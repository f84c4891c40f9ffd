"""ZeRO-1 across hosts: a host that goes silent without closing anything. A SIGSTOPped rank keeps
its sockets open and its kernel still acknowledges what the others send, so no collective fails
on a closed connection (test_data_parallel_hosts.py kills the host instead): the others wait until
the group's timeout (parallel.timeout_seconds, the Gloo timeout), and then name the silent host,
whose heartbeat counter stood still (DataParallel::LostHosts). Its own CTest entry
(python_trainer_hosts_silent): each case waits out a group timeout."""

import signal
import socket
import time

from pipeline_testlib import build_model, write_pretokenized
from test_data_parallel_hosts import launch_hosts, wait_for_steps

# What rank 0 does after its collective times out: reads the heartbeat counters 8 beats of
# 0.25 s apart (2 s), then waits at most 16 beats (4 s) for the live ranks to read them too
# (DataParallel::LostHosts).
HEARTBEAT_READ_S = 2 + 4


def test_a_silent_host_fails_the_others_within_the_timeout_naming_it(binary_dir, tmp_path):
    """2 hosts x 1 rank, host 1's rank SIGSTOPped mid-run: rank 0 exits non-zero within the group
    timeout (its pending collective's), plus the heartbeat read, plus one step (the collective
    that waits may start up to a step after the stop) and the exit; the error names host 1, its
    rank and its pid."""
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    out, timeout = tmp_path / "two", 10
    procs = launch_hosts(binary_dir, model, data, out, hosts=2, per_host=1, timeout=timeout,
                         extra=["--max-steps=100000"])
    try:
        stats = out / "stats.jsonl"
        wait_for_steps(procs, stats, 2)
        start = time.monotonic()
        wait_for_steps(procs, stats, 3)
        step_s = time.monotonic() - start
        procs[1].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        err = procs[0].communicate(timeout=3 * timeout + 60)[1]
        waited = time.monotonic() - stopped
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode != 0, err
    assert "on rank 0 of 2" in err, err
    assert f"lost: host 1 (rank 1, on host 1 = {socket.gethostname()} (pid {procs[1].pid}))" in err, err
    assert "host 0 (" not in err.split("lost:")[1], err
    # Exit: the workers and the gather thread stop; a few seconds on the loaded two-core machine.
    bound = timeout + HEARTBEAT_READ_S + step_s + 10
    print(f"\nrank 0 failed {waited:.1f} s after host 1 was stopped (bound {bound:.1f} s):\n"
          f"{err.strip().splitlines()[-1]}")
    assert waited <= bound, f"rank 0 took {waited:.1f} s to fail, more than {bound:.1f} s"
