"""ZeRO-1 across hosts, its checkpoints and its failures (test_data_parallel_hosts.py has the
equality with one rank): every host writes its partition (output_dir/partition-<h>-of-<H>/
checkpoint-<step>), rank 0 commits partition 0 last, once every other one is committed; a resume
from partition 0 equals the uninterrupted run bit for bit, and a missing partition is refused,
naming it. A host whose ranks are SIGKILLed fails the others within the group timeout's bound,
naming it. Its own CTest entry (python_trainer_hosts_faults), so that each entry stays well inside
its timeout on a loaded two-core machine."""

import shutil
import signal
import socket
import time

import pytest
import torch
from safetensors.torch import load_file

from pipeline_testlib import build_model, read_stats, write_pretokenized
from test_data_parallel_hosts import launch_hosts, start_hosts, wait_for_steps


@pytest.mark.parametrize("per_host", [1, 2])
def test_partitioned_checkpoint_resumes_bit_for_bit(binary_dir, tmp_path, per_host):
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    full, part, resumed = tmp_path / "full", tmp_path / "part", tmp_path / "resumed"
    for out, extra in [(full, []), (part, ["--save-steps=6"])]:
        procs, outs = start_hosts(binary_dir, model, data, out, hosts=2, per_host=per_host, extra=extra)
        for p, (_, err) in zip(procs, outs):
            assert p.returncode == 0, err
    ckpt = part / "partition-0-of-2" / "checkpoint-6"
    for h in (0, 1):  # each host's slice of every layer, committed with its own marker
        d = part / f"partition-{h}-of-2" / "checkpoint-6"
        assert (d / "offloadd_state.json").is_file(), d
        assert (d / "optimizer-layer-00000.safetensors").is_file(), d
    assert not (part / "checkpoint-6").exists()
    procs, outs = start_hosts(binary_dir, model, data, resumed, hosts=2, per_host=per_host,
                              extra=[f"--resume-from={ckpt}"])
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    # Same process layout, same order of every sum: bit for bit.
    fa, fb = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    for name in fa:
        assert torch.equal(fa[name], fb[name]), name
    sa, sb = read_stats(full / "stats.jsonl"), read_stats(resumed / "stats.jsonl")
    assert [s["loss"] for s in sa[6:]] == [s["loss"] for s in sb]

    # A partition gone missing: both hosts refuse the resume, naming it.
    shutil.rmtree(part / "partition-1-of-2" / "checkpoint-6")
    procs, outs = start_hosts(binary_dir, model, data, tmp_path / "again", hosts=2, per_host=per_host,
                              extra=[f"--resume-from={ckpt}"])
    for p, (_, err) in zip(procs, outs):
        assert p.returncode != 0, err
        assert "checkpoint-6: partition 1 of 2 is missing" in err, err


def test_a_lost_host_fails_the_others_naming_it(binary_dir, tmp_path):
    """2 hosts x 2 ranks, host 1's ranks SIGKILLed mid-run: host 0's ranks exit non-zero within
    the bound (the collective fails when the peers' connections close, or at the group timeout),
    and the error names host 1, its ranks and its processes (their heartbeats stood still).
    The group timeout also bounds the join and every wait before the kill, so it is 60 s, not
    less: four ranks starting on a loaded two-core machine can join tens of seconds apart."""
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    out, timeout = tmp_path / "two", 60
    procs = launch_hosts(binary_dir, model, data, out, hosts=2, per_host=2, timeout=timeout,
                         extra=["--max-steps=100000"])
    try:
        wait_for_steps(procs, out / "stats.jsonl", 2, bound=300)
        for p in procs[2:]:
            p.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        errs = [p.communicate(timeout=timeout + 60)[1] for p in procs[:2]]
        waited = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    host = socket.gethostname()
    for r, err in enumerate(errs):
        assert procs[r].returncode != 0, err
        assert f"on rank {r} of 4" in err, err
        assert f"lost: host 1 (rank 2, 3, on host 1 = {host} (pid {procs[2].pid}))" in err, err
        assert "host 0 (" not in err.split("lost:")[1], err
    # The collective's failure, plus 2 s of heartbeats, within the group timeout's bound.
    assert waited <= timeout + 30, f"host 0 took {waited:.1f} s to fail"
    print(f"\nhost 0 failed {waited:.1f} s after host 1 was killed:\n{errs[0].strip().splitlines()[-1]}")
