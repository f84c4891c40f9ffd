"""Device-resident optimizer states: the lowest blocks' fp32 masters and Adam
moments live on the device and are updated there (trainer/pipeline/device_optimizer.h), the rest by the
CPU workers, with one clipping decision and one fp16 overflow check over all blocks. On a CPU
device the same code runs with its tensors in process memory: these tests cover mixed placements
against PyTorch without a GPU (tests/python/trainer/test_pipeline_gpu.py runs them on CUDA).

Tolerances are those of the all-CPU parity tests: fp32 loss |diff| <= 1e-5 per step and weights
max |diff| <= 2e-5 (test_pipeline_parity.py), fp16 within test_pipeline_fp16.py's bounds with the
skip pattern and loss-scale trajectory exact. The device blocks run ATen's fused AdamW, the
reference's own kernel, on the same clipped fp32 gradients."""

import json

import pytest
import torch
from safetensors.torch import load_file

import test_pipeline_fp16 as fp16
from pipeline_testlib import build_model, read_stats, reference_train, run_train, write_pretokenized
from test_pipeline_parity import COMMON, STEPS, train_args


def check_against_reference(model, out, stats, *, tied=False, **overrides):
    """The run in `out` against PyTorch on the batches it consumed: loss <= 1e-5 per step,
    exported weights <= 2e-5 (test_pipeline_parity.py's bounds)."""
    ref_losses, ref_state = reference_train(model, json.loads((out / "batches.json").read_text()),
                                            **{**COMMON, **overrides})
    for step, (a, b) in enumerate(zip((s["loss"] for s in stats), ref_losses), 1):
        assert abs(a - b) <= 1e-5, f"step {step}: offloadd {a} vs PyTorch {b}"
    exported = load_file(out / "model.safetensors")
    for name, ref in ref_state.items():
        if name == "lm_head.weight" and tied:
            continue  # the tied head is the embedding
        diff = (exported[name] - ref).abs().max().item()
        assert diff <= 2e-5, f"{name}: max |diff| {diff}"


@pytest.mark.parametrize("blocks,tied,accum", [(2, False, 2), (1, True, 1), (4, True, 1), (3, False, 1)])
def test_mixed_placement_matches_pytorch_adamw(binary_dir, tmp_path, blocks, tied, accum):
    # 2 layers: 4 blocks (embedding, 2 decoder layers, head); 4 puts every block on the device.
    model = build_model(tmp_path / "model", tied=tied)
    data = write_pretokenized(tmp_path / "data.jsonl")
    out = tmp_path / "out"
    r = run_train(binary_dir, train_args(model, data, out, accum=accum) +
                  [f"--device-optimizer-blocks={blocks}"])
    assert f"AdamW states of blocks 0-{blocks - 1} on the device" in r.stderr
    stats = read_stats(out / "stats.jsonl")
    assert [s["step"] for s in stats] == list(range(1, STEPS + 1))
    check_against_reference(model, out, stats, tied=tied)
    assert sum(s["grad_norm"] > COMMON["max_grad_norm"] for s in stats) >= STEPS // 2  # it clips
    on_device = sum(_block_params(model)[:blocks])
    assert all(s["device_update_params"] == on_device for s in stats), stats[0]


def test_checkpoints_keep_their_format_and_resume(binary_dir, tmp_path):
    """A checkpoint holds every block's states in the one format, wherever they lived: resuming it
    with the same placement continues bit for bit, and with another placement (all on the CPU)
    within the parity bound of the uninterrupted run."""
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    dev = ["--device-optimizer-blocks=2"]
    full, same, moved = tmp_path / "full", tmp_path / "same", tmp_path / "moved"
    run_train(binary_dir, train_args(model, data, full, accum=1) + dev + ["--save-steps=10"])
    ckpt = f"--resume-from={full}/checkpoint-10"
    run_train(binary_dir, train_args(model, data, same, accum=1) + dev + [ckpt])
    run_train(binary_dir, train_args(model, data, moved, accum=1) + [ckpt])
    a, b, c = (read_stats(d / "stats.jsonl") for d in (full, same, moved))
    assert [s["step"] for s in b] == list(range(11, STEPS + 1))
    assert [(s["loss"], s["grad_norm"]) for s in a[10:]] == [(s["loss"], s["grad_norm"]) for s in b]
    wa, wb, wc = (load_file(d / "model.safetensors") for d in (full, same, moved))
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
        assert (wa[name] - wc[name]).abs().max().item() <= 2e-5, name
    for sa, sc in zip(a[10:], c):
        assert abs(sa["loss"] - sc["loss"]) <= 1e-5


def test_fp16_overflow_skips_device_blocks_too(binary_dir, tmp_path):
    """fp16 with loss scaling: a step whose gradients overflow anywhere (device or CPU blocks)
    leaves every block untouched, as torch.amp.GradScaler does; the rest matches the reference."""
    steps = 14
    out, stats, ref = fp16.run_both(binary_dir, tmp_path, "out", steps=steps,
                                    init_scale=1.5 * 2.0**23, growth_interval=2,
                                    extra=["--device-optimizer-blocks=2"])
    fp16.check_against_reference(stats, ref, exported=load_file(out / "model.safetensors"),
                                 initial=load_file(tmp_path / "model" / "model.safetensors"))
    assert any(s["skipped"] for s in stats) and not all(s["skipped"] for s in stats)
    on_device = sum(_block_params(tmp_path / "model")[:2])
    assert [s["device_update_params"] for s in stats] == [0 if s["skipped"] else on_device for s in stats]


def test_unclipped_updates_run_as_gradients_land(binary_dir, tmp_path):
    """Without clipping or loss scaling nothing waits for a decision: each device block is updated
    right after its backward. Same result as the reference."""
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    out = tmp_path / "out"
    args = train_args(model, data, out, accum=1)
    args = [a for a in args if not a.startswith("--max-grad-norm")] + ["--max-grad-norm=0"]
    run_train(binary_dir, args + ["--device-optimizer-blocks=2"])
    stats = read_stats(out / "stats.jsonl")
    check_against_reference(model, out, stats, max_grad_norm=0.0)


def _block_params(model_dir):
    """Parameters per block of a pipeline_testlib model: embedding, decoder layers, head."""
    names = load_file(model_dir / "model.safetensors")
    layers = sorted({int(k.split(".")[2]) for k in names if k.startswith("model.layers.")})
    blocks = [sum(v.numel() for k, v in names.items() if "embed_tokens" in k)]
    blocks += [sum(v.numel() for k, v in names.items() if k.startswith(f"model.layers.{i}.")) for i in layers]
    # The head: the final norm, and lm_head unless it is the (tied, unsaved) embedding.
    blocks.append(sum(v.numel() for k, v in names.items() if k.startswith(("model.norm.", "lm_head."))))
    return blocks


def test_auto_places_blocks_after_the_first_step_within_the_budget(binary_dir, tmp_path):
    """auto measures the first step's peak (0 on a CPU device, where gpu_memory_limit bounds the
    states kept beside the workers) and then moves as many of the lowest blocks' states as fit:
    here a budget for exactly two. Their updates from step 2 on run on the "device"; the run stays
    within the parity bounds of PyTorch."""
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    n = _block_params(model)
    # DeviceOptimizer::BlockBytes in fp32 without accumulation: 16 B per parameter (master and
    # moments, the gradient buffer; the weights are the master) less the 4 B copy it replaces;
    # a 128 MiB update workspace and PlaceDeviceBlocks' 512 MiB margin.
    budget = (640 << 20) + 12 * (n[0] + n[1]) + 6 * n[2]
    out = tmp_path / "out"
    r = run_train(binary_dir, train_args(model, data, out, accum=1) +
                  ["--device-optimizer-blocks=auto", f"--gpu-memory-limit={budget}"])
    assert "the AdamW states of blocks 0-1 (" in r.stderr and "move to the device" in r.stderr, r.stderr
    # The step planner chose it (job/step_planner.h), from a node profile measured here, and
    # compared its prediction with the second step run under it.
    assert "node profile (measured): host memory" in r.stderr, r.stderr
    assert "step plan: 2 blocks' AdamW states on the GPU, 0 layers' activations kept: predicted" in r.stderr
    assert "step plan check: step 3 took" in r.stderr, r.stderr
    stats = read_stats(out / "stats.jsonl")
    assert [s["device_update_params"] for s in stats] == [0] + [n[0] + n[1]] * (STEPS - 1)
    check_against_reference(model, out, stats)
    # Too small a budget for the first block: everything stays on the CPU, and says so.
    out2 = tmp_path / "small"
    r = run_train(binary_dir, train_args(model, data, out2, accum=1) +
                  ["--device-optimizer-blocks=auto", "--gpu-memory-limit=600MiB"])
    assert "no block's AdamW states fit beside it" in r.stderr, r.stderr


def test_node_profile_is_cached_per_node_and_remeasured_when_unusable(binary_dir, tmp_path):
    """--profile-dir keeps the node profile: the second run reuses it; a corrupt file, or one
    measured under another key (another host, thread count or kernel), is measured again."""
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    prof = tmp_path / "profiles"
    args = ["--device-optimizer-blocks=auto", "--gpu-memory-limit=2GiB", f"--profile-dir={prof}"]
    r = run_train(binary_dir, train_args(model, data, tmp_path / "a", accum=1) + args)
    assert "node profile (measured)" in r.stderr, r.stderr
    saved = json.loads((prof / "node-profile.json").read_text())
    assert saved["host_bytes_per_s"] > 0 and saved["cpu_params_per_s"] > 0 and saved["threads"] >= 1
    # The AdamW rate per thread count, up to the pool's (1, 2, 4, ..., threads); no DMA or store
    # here (a CPU device, no NVMe directory).
    counts = [r["threads"] for r in saved["adamw_by_threads"]]
    assert counts[0] == 1 and counts[-1] == saved["threads"] and counts == sorted(set(counts)), counts
    assert all(r["params_per_s"] > 0 for r in saved["adamw_by_threads"])
    assert saved["adamw_by_threads"][-1]["params_per_s"] == saved["cpu_params_per_s"]
    assert saved["cpu_params_per_s_during_dma"] == 0 and saved["store_dir"] == "", saved
    r = run_train(binary_dir, train_args(model, data, tmp_path / "b", accum=1) + args)
    assert "node profile (cached)" in r.stderr, r.stderr
    saved["key"] = "another host | " + saved["key"]
    (prof / "node-profile.json").write_text(json.dumps(saved))
    r = run_train(binary_dir, train_args(model, data, tmp_path / "c", accum=1) + args)
    assert "node profile (measured)" in r.stderr, r.stderr
    (prof / "node-profile.json").write_text("{not json")
    r = run_train(binary_dir, train_args(model, data, tmp_path / "d", accum=1) + args)
    assert "node profile (measured)" in r.stderr, r.stderr
    assert json.loads((prof / "node-profile.json").read_text())["key"] != saved["key"]
    # With an NVMe directory its write and read rates are measured too (it is part of the key).
    store = tmp_path / "store"
    store.mkdir()
    r = run_train(binary_dir, train_args(model, data, tmp_path / "s", accum=1) + args + [f"--nvme-dir={store}"])
    assert "node profile (measured)" in r.stderr and f"; store {store} write " in r.stderr, r.stderr
    measured = json.loads((prof / "node-profile.json").read_text())
    assert measured["store_dir"] == str(store) and f"store {store}" in measured["key"], measured
    assert measured["store_write_bytes_per_s"] > 0 and measured["store_read_bytes_per_s"] > 0, measured
    assert list(store.iterdir()) == [] or all(p.name != ".offloadd-node-profile.tmp" for p in store.iterdir())
    # A profile directory that cannot be created (under a regular file) only loses the cache: the
    # job warns and trains on.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    bad = ["--device-optimizer-blocks=auto", "--gpu-memory-limit=2GiB", f"--profile-dir={blocker}/profiles"]
    out = tmp_path / "e"
    r = run_train(binary_dir, train_args(model, data, out, accum=1) + bad)
    assert "node profile not cached: " in r.stderr and "it is measured again next run" in r.stderr, r.stderr
    assert len(read_stats(out / "stats.jsonl")) == STEPS
