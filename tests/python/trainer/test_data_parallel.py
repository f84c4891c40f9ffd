"""Data parallelism is exact. Two CPU ranks over c10d's Gloo backend, each on its
half of every global micro-batch, equal one rank on the whole batch: the per-block gradients are
reduce-scattered, each rank lands its shard in rank 0's one arena, rank 0's workers update every
block once, and both ranks compute with the weights of that arena.

Tolerances are the CPU parity tests' (test_pipeline_parity.py): per-step loss |diff| <= 1e-5,
final weights max |diff| <= 2e-5 (fp32). The two runs differ only in summation order: two half-
batch matmuls summed by Gloo instead of one whole-batch matmul."""

import re
import socket
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from pipeline_testlib import build_model, read_stats, run_train, write_pretokenized

STEPS = 12


def args(model, data, out, *, batch, accum=1, extra=()):
    out.mkdir(parents=True, exist_ok=True)
    return [f"--model={model}", f"--data={data}", "--format=pretokenized", "--dtype=fp32",
            f"--batch-size={batch}", f"--grad-accum={accum}", f"--max-steps={STEPS}", "--lr=2e-3",
            "--weight-decay=0.1", "--max-grad-norm=0.5", "--scheduler=cosine", "--warmup-steps=3",
            "--seed=7", "--workers=1x1", f"--output-dir={out}", f"--stats-jsonl={out}/stats.jsonl",
            *extra]


def assert_close_runs(a, b, *, bitwise=False):
    sa, sb = read_stats(a / "stats.jsonl"), read_stats(b / "stats.jsonl")
    assert [s["step"] for s in sa] == [s["step"] for s in sb] == list(range(1, STEPS + 1))
    for x, y in zip(sa, sb):
        assert x["tokens"] == y["tokens"], "the same global batches"
        assert abs(x["loss"] - y["loss"]) <= (0 if bitwise else 1e-5), (x["step"], x["loss"], y["loss"])
        assert abs(x["grad_norm"] - y["grad_norm"]) <= (0 if bitwise else 1e-5 * max(1.0, x["grad_norm"]))
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        diff = (wa[name] - wb[name]).abs().max().item()
        assert diff <= (0 if bitwise else 2e-5), f"{name}: max |diff| {diff}"


@pytest.mark.parametrize("tied,accum,device_blocks", [(False, 1, "0"), (True, 2, "0"), (False, 1, "2"), (True, 2, "2"),
                                                     (False, 1, "auto")])
def test_two_cpu_ranks_equal_one_rank_on_the_whole_batch(binary_dir, tmp_path, tied, accum, device_blocks):
    """device_blocks > 0: the lowest blocks' states live on the "device" (here the CPU device's own
    memory), replicated per rank and updated from all-reduced gradients; the rest in the arena."""
    model = build_model(tmp_path / "model", tied=tied, layers=3)
    data = write_pretokenized(tmp_path / "data.jsonl")
    one, two = tmp_path / "one", tmp_path / "two"
    placement = [f"--device-optimizer-blocks={device_blocks}"]
    if device_blocks == "auto":  # rank 0 plans after the first step; rank 1 applies its plan
        placement += ["--gpu-memory-limit=1GiB", f"--profile-dir={tmp_path / 'profile'}"]
    run_train(binary_dir, args(model, data, one, batch=4, accum=accum, extra=placement))
    r = run_train(binary_dir, args(model, data, two, batch=2, accum=accum, extra=["--gpus=2", *placement]))
    assert "data parallel: rank 0 of 2 (gloo" in r.stderr
    stats = read_stats(two / "stats.jsonl")
    # Every parameter is updated once per step, by rank 0's workers (not once per rank).
    params = sum(t.numel() for t in load_file(two / "model.safetensors").values())
    if not tied and device_blocks == "0":
        assert all(s["cpu_update_params"] == params for s in stats), (stats[0]["cpu_update_params"], params)
    if device_blocks == "2":
        assert all(s["device_update_params"] > 0 for s in stats)
    if device_blocks == "auto":  # placed after step 1, on both ranks
        assert stats[0]["device_update_params"] == 0 and stats[-1]["device_update_params"] > 0
    assert_close_runs(one, two)
    # Only rank 0 writes: one checkpoint-less output, one exported model.
    assert not list(two.glob("*.rank1*"))


@pytest.mark.parametrize("device_blocks", [0, 1])
def test_two_rank_resume_equals_uninterrupted_run(binary_dir, tmp_path, device_blocks):
    """With device blocks, rank 1 restores its replica of their states from the checkpoint."""
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    full, part = tmp_path / "full", tmp_path / "part"
    group = ["--gpus=2", f"--device-optimizer-blocks={device_blocks}"]
    run_train(binary_dir, args(model, data, full, batch=2, extra=group))
    run_train(binary_dir, args(model, data, part, batch=2, extra=[*group, "--save-steps=6"]))
    ckpt = part / "checkpoint-6"
    assert ckpt.is_dir()
    resumed = tmp_path / "resumed"
    run_train(binary_dir, args(model, data, resumed, batch=2, extra=[*group, f"--resume-from={ckpt}"]))
    # Same process layout, same order of every sum: bit for bit.
    fa, fb = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    for name in fa:
        assert torch.equal(fa[name], fb[name]), name
    sa = read_stats(full / "stats.jsonl")
    sb = read_stats(resumed / "stats.jsonl")
    assert [s["loss"] for s in sa[6:]] == [s["loss"] for s in sb]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_started_apart_meet_over_tcp(binary_dir, tmp_path):
    """The multi-host form of the rendezvous (tcp://host:port, rank 0 serving), on loopback."""
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    one, two = tmp_path / "one", tmp_path / "two"
    run_train(binary_dir, args(model, data, one, batch=4))
    port = free_port()
    procs = [subprocess.Popen([str(binary_dir / "trainer" / "offloadd-train"),
                               *args(model, data, two, batch=2,
                                     extra=[f"--rank={r}", "--world-size=2",
                                            f"--rendezvous=tcp://127.0.0.1:{port}",
                                            "--parallel-timeout=120"])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e
    assert_close_runs(one, two)


@pytest.mark.parametrize("extra,named", [
    (["--compression=lsp"], "LSP"),
    (["--device-optimizer-blocks=1", "--tier=nvme", "--nvme-dir=/tmp"], "NVMe tier"),
    (["--rendezvous=nowhere://x", "--rank=0", "--world-size=2"], "rendezvous must be"),
])
def test_unsupported_settings_are_refused_by_name(binary_dir, tmp_path, extra, named):
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    a = args(model, data, tmp_path / "out", batch=2)
    group = [] if any(x.startswith("--world-size") for x in extra) else ["--gpus=2"]
    r = run_train(binary_dir, [*a, *extra, *group], check=False, timeout=120)
    assert r.returncode != 0
    assert named in r.stderr, r.stderr


def test_automatic_batch_with_two_cpu_ranks(binary_dir, tmp_path):
    """--batch-size=auto with --gpus=2: each rank prices the candidates on its own device (its own
    budget), rank 0 chooses among those that fit every rank at the group's tokens/s, and every rank
    trains that shape: the run equals a fixed two-rank run of the chosen micro-batch and
    accumulation (the same global batches; test_data_parallel's bounds)."""
    model = build_model(tmp_path / "model", layers=2)
    data = write_pretokenized(tmp_path / "data.jsonl")
    auto, fixed = tmp_path / "auto", tmp_path / "fixed"
    r = run_train(binary_dir, args(model, data, auto, batch="auto:4", extra=["--gpus=2"]))
    # Rank 0 logs the choice (the other ranks log warnings only); their steps prove they took it.
    lead = next(l for l in r.stderr.splitlines() if "batch size (auto" in l)
    assert "micro-batch at most 4 per rank, 2 ranks; tokens/s of the group" in lead, lead
    shape = re.search(r"\): micro-batch (\d+) x (\d+) accumulation", lead)
    micro, acc = int(shape.group(1)), int(shape.group(2))
    assert set(re.findall(r"(\d+x\d+): ", lead)) == {"1x1", "2x1", "4x1"}, lead  # up to the cap
    run_train(binary_dir, args(model, data, fixed, batch=micro, accum=acc, extra=["--gpus=2"]))
    assert_close_runs(auto, fixed)


def test_fp16_overflow_decisions_are_global(binary_dir, tmp_path):
    """fp16 with dynamic loss scaling over two ranks: rank 0 decides from every shard whether the
    step overflowed, and every rank skips the same steps with the same scale trajectory as one rank
    on the whole batch. The scale starts at 1.5 * 2**23 so that the first steps overflow and it grows
    back into overflow (test_pipeline_fp16.py's overflow case; its note explains why not a power of
    two). Losses within that file's 1e-4 relative (fp16 rounding of two half-batch gradients summed)."""
    from test_pipeline_fp16 import LOSS_RTOL, train_args as fp16_args

    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    one, two = tmp_path / "one", tmp_path / "two"
    common = dict(steps=14, init_scale=1.5 * 2.0**23, growth_interval=2)
    run_train(binary_dir, fp16_args(model, data, one, **common))
    a = [x for x in fp16_args(model, data, two, **common) if not x.startswith(("--batch-size", "--dump-batches"))]
    run_train(binary_dir, [*a, "--batch-size=2", "--gpus=2"])
    sa, sb = read_stats(one / "stats.jsonl"), read_stats(two / "stats.jsonl")
    assert [s["skipped"] for s in sa] == [s["skipped"] for s in sb]
    assert sum(s["skipped"] for s in sb) >= 2
    assert [s["loss_scale"] for s in sa] == [s["loss_scale"] for s in sb]
    for x, y in zip(sa, sb):
        assert abs(x["loss"] - y["loss"]) <= LOSS_RTOL * abs(x["loss"]), (x["step"], x["loss"], y["loss"])
