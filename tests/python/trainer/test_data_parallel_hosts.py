"""ZeRO-1 across hosts: ranks started with the torchrun environment and LOCAL_WORLD_SIZE=1 are
each a host of their own. Nothing is shared between them but the c10d group: each rank's own
arena holds the fp32 masters and AdamW states of its contiguous 1/H slice of every block, its
own workers update that slice with the group's reduce-scattered gradient sum, the clipping
decision sums every host's ||g||^2, and the updated slices are all-gathered into every rank's
whole weights. The result equals one rank on the whole batch within test_data_parallel.py's
bounds (loss 1e-5, weights 2e-5: the same arithmetic, summed in a different order).

Checkpoints: every host writes its partition (output_dir/partition-<h>-of-<H>/checkpoint-<step>),
rank 0 commits partition 0 last, once every other one is committed; a resume from partition 0
equals the uninterrupted run bit for bit, and a missing partition is refused, naming it.

Several ranks per host (LOCAL_WORLD_SIZE=2 on 2 hosts): each host's ranks share that host's
arena as on one host, the host's leader updates the host's slice; the same equality, and the same
bit-exact resume. A host whose ranks are SIGKILLed fails the others within the bound, naming it
(the checkpoints and the lost host: test_data_parallel_hosts_faults.py, its own CTest entry).

The same across two network namespaces (and PID namespaces, so that neither rank can even see
the other's /proc): test_data_parallel_netns.py."""

import json
import subprocess
import time

import pytest
from safetensors.torch import load_file

from pipeline_testlib import build_model, read_stats, run_train, write_pretokenized
from test_data_parallel import STEPS, args, assert_close_runs, free_port
from test_data_parallel_torchrun import clean_env


def launch_hosts(binary_dir, model, data, out, *, hosts, per_host=1, accum=1, extra=(), prefix=(),
                 env_of=None, timeout=120):
    """per_host offloadd-train per host, as srun or a PyTorchJob would start them on each node;
    ranks numbered host by host."""
    exe = str(binary_dir / "trainer" / "offloadd-train")
    port = free_port()
    procs = []
    world = hosts * per_host
    for r in range(world):
        # OMP_NUM_THREADS=1 as torchrun sets it for several processes per node: two to four ranks
        # on two cores, each with a full set of intra-op threads, oversubscribe the machine (the
        # file took 408 s beside six builds, 37 s alone).
        env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=r, WORLD_SIZE=world,
                        LOCAL_RANK=r % per_host, LOCAL_WORLD_SIZE=per_host, GROUP_RANK=r // per_host,
                        OMP_NUM_THREADS=1)
        if env_of:
            env.update(env_of(r))
        cmd = [*prefix(r), exe] if prefix else [exe]
        cmd += args(model, data, out, batch=4 // world, accum=accum,
                    extra=[f"--parallel-timeout={timeout}", *extra])
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def wait_for_steps(procs, stats, steps, bound=120):
    """Until the run's stats.jsonl has `steps` lines, every rank still running, within `bound` s."""
    deadline = time.monotonic() + bound
    while not (stats.exists() and stats.read_text().count("\n") >= steps):
        assert all(p.poll() is None for p in procs), procs[0].stderr.read()
        assert time.monotonic() < deadline, f"no step {steps} within {bound} s"
        time.sleep(0.1)


def start_hosts(binary_dir, model, data, out, *, hosts, **kw):
    procs = launch_hosts(binary_dir, model, data, out, hosts=hosts, **kw)
    outs = [p.communicate(timeout=300) for p in procs]
    return procs, outs


@pytest.mark.parametrize("accum,per_host", [(1, 1), (2, 1), (1, 2)])
def test_two_hosts_equal_one_rank_on_the_whole_batch(binary_dir, tmp_path, accum, per_host):
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    one, two = tmp_path / "one", tmp_path / "two"
    run_train(binary_dir, args(model, data, one, batch=4, accum=accum))
    procs, outs = start_hosts(binary_dir, model, data, two, hosts=2, per_host=per_host, accum=accum)
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    world = 2 * per_host
    assert f"rank 0 of {world}, ZeRO-1 across 2 hosts" in outs[0][1], outs[0][1]
    # The clipping decision is the global norm's: some steps clip at 0.5 in both runs alike.
    sa, sb = read_stats(one / "stats.jsonl"), read_stats(two / "stats.jsonl")
    assert any(s["grad_norm"] > 0.5 for s in sa)
    # Host 0's workers update its half of every block only (a block of n: about n / 2).
    params = sum(t.numel() for t in load_file(one / "model.safetensors").values())
    for s in sb:
        assert params // 2 <= s["cpu_update_params"] <= params // 2 + 16, (s["cpu_update_params"], params)
    assert all(s["cpu_update_params"] == params for s in sa)
    assert_close_runs(one, two)


def trace_spans(path):
    """(track, name, start, end) of a trace's spans, by start."""
    events = json.loads(path.read_text())["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [(tracks[e["tid"]], e["name"], e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X"]
    return sorted(spans, key=lambda s: s[2])


def test_each_block_is_gathered_behind_its_own_update_and_ahead_of_its_next_forward(binary_dir, tmp_path):
    """The gather thread: after each step every block's slices are all-gathered in block order
    (the next forward's, the same on every host), each once this host's update of that block is
    done, and the next forward of a block waits for that block's gather only. Before, the step
    loop gathered every block serially after the step's last update (no gather track)."""
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    out = tmp_path / "two"
    procs, outs = start_hosts(binary_dir, model, data, out, hosts=2,
                              extra=[f"--trace={out}/trace.json", "--trace-steps=0"])
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    for path in (out / "trace.json", out / "trace.json.rank1"):
        spans = trace_spans(path)
        forwards = [s for s in spans if s[0] == "gpu compute" and s[1].startswith("forward ")]
        updates = [s for s in spans if s[0] == "cpu update"]
        gathers = [s for s in spans if s[0] == "gather"]
        blocks = [s[1].split(" ", 1)[1] for s in forwards]
        n = blocks.index(blocks[0], 1)  # the first step's forward: the blocks in order
        blocks = blocks[:n]
        assert n == 4, blocks  # the embedding, two layers, the head
        # Every step's gathers (the last one's may end after the trace is taken), in block order.
        assert len(gathers) >= n * (STEPS - 1), [g[1] for g in gathers]
        names = [g[1] for g in gathers]
        assert names == ([f"gather {b}" for b in blocks] * STEPS)[:len(names)], names
        for b in blocks:
            mine = [g for g in gathers if g[1] == f"gather {b}"]
            done = [u for u in updates if u[1] == f"update {b}"]
            nexts = [f for f in forwards if f[1] == f"forward {b}"][1:]
            for k, g in enumerate(mine):  # step k+1's gather of b: after its update, before its use
                assert done[k][3] <= g[2], (b, k, done[k], g)
                assert g[3] <= nexts[k][2], (b, k, g, nexts[k])


def test_what_is_not_built_across_hosts_is_refused_by_name(binary_dir, tmp_path):
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    for extra, named in [(["--device-optimizer-blocks=1"], "device_optimizer_blocks 1")]:
        out = tmp_path / named.split()[0]
        procs, outs = start_hosts(binary_dir, model, data, out, hosts=2, extra=extra)
        for p, (_, err) in zip(procs, outs):
            assert p.returncode != 0, err
            assert named in err and "across 2 hosts" in err and "not built" in err, err
        assert not (out / "stats.jsonl").exists() or not (out / "stats.jsonl").read_text().strip()
    # --hosts must agree with the environment's hosts.
    exe = str(binary_dir / "trainer" / "offloadd-train")
    r = subprocess.run([exe, *args(model, data, tmp_path / "bad", batch=2, extra=["--hosts=3"])],
                       env=clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), RANK=0, WORLD_SIZE=2,
                                     LOCAL_WORLD_SIZE=1),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--hosts=3 disagrees with 2 hosts (GROUP_WORLD_SIZE)" in r.stderr, r.stderr
