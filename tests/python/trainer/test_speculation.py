"""CPU updates overlap backward under max_grad_norm, exactly. With speculation
each block is updated as its gradients land, with clip coefficient 1; if the step then clips by
c < 1, the speculated blocks are corrected (workers/adamw_kernel.h CorrectAdamW). Against
PyTorch (clip_grad_norm_ + AdamW) over 50 steps, where clipping triggers on no step, some steps
and every step, within the fp32 parity bounds of test_pipeline_parity.py (loss 1e-5, weights 2e-5:
the correction adds about one rounding per quantity per corrected step, far below them); and
bit-identical to holding the updates when no step clips."""

import json

import pytest
import torch
from safetensors.torch import load_file

from pipeline_testlib import build_model, read_stats, reference_train, run_train, write_pretokenized

STEPS = 50
COMMON = dict(lr=2e-3, weight_decay=0.1, scheduler="cosine", warmup_steps=3)


def train(binary_dir, model, data, out, *, max_grad_norm, speculate, accum=1, extra=()):
    out.mkdir(parents=True, exist_ok=True)
    run_train(binary_dir, [
        f"--model={model}", f"--data={data}", "--format=pretokenized", "--dtype=fp32", "--batch-size=4",
        f"--grad-accum={accum}", f"--max-steps={STEPS}", f"--lr={COMMON['lr']}",
        f"--weight-decay={COMMON['weight_decay']}", f"--max-grad-norm={max_grad_norm}",
        f"--scheduler={COMMON['scheduler']}", f"--warmup-steps={COMMON['warmup_steps']}", "--seed=7",
        "--workers=1x2", f"--speculate={speculate}", f"--output-dir={out}", f"--stats-jsonl={out}/stats.jsonl",
        f"--dump-batches={out}/batches.json", *extra])
    return read_stats(out / "stats.jsonl"), load_file(out / "model.safetensors")


# max_grad_norm -> which steps clip (each regime asserts its clip pattern below).
REGIMES = {"none": 100.0, "some": 0.9, "all": 0.05}


# Update order: earliest-needed-first (default) and LSP-Offload's static transition (layers below
# block 1 held to the end of the step, with their norms measured instead of speculated).
ORDERS = {"earliest": (), "lsp": ("--transition-layer=0",)}


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_speculation_matches_pytorch_clipping(binary_dir, tmp_path, regime, order):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=256)
    max_norm = REGIMES[regime]
    stats, weights = train(binary_dir, model, data, tmp_path / "out", max_grad_norm=max_norm, speculate="always",
                           extra=ORDERS[order])
    clipped = [s["clipped"] for s in stats]
    if regime == "none":
        assert not any(clipped)
    elif regime == "all":
        assert all(clipped)
    else:
        assert any(clipped) and not all(clipped), clipped
    # Every step speculated until clipping was certain; clipped steps corrected what was speculated.
    assert all(s["speculated_layers"] > 0 for s in stats if not s["clipped"])
    assert all(s["corrected_layers"] == s["speculated_layers"] for s in stats if s["clipped"])
    assert all(s["corrected_layers"] == 0 for s in stats if not s["clipped"])
    # The CPU's work per step: every parameter once, plus once more for each corrected one.
    n_params = sum(w.numel() for w in weights.values())
    assert all(s["cpu_update_params"] == n_params for s in stats if not s["clipped"])
    assert all(n_params < s["cpu_update_params"] <= 2 * n_params for s in stats if s["corrected_layers"])
    batches = json.loads((tmp_path / "out" / "batches.json").read_text())
    ref_losses, ref_state = reference_train(model, batches, **COMMON, max_grad_norm=max_norm)
    worst_loss = max(abs(s["loss"] - r) for s, r in zip(stats, ref_losses))
    worst_w = max((weights[n] - w).abs().max().item() for n, w in ref_state.items())
    print(f"{regime}: clipped {sum(clipped)}/{STEPS} steps, corrected layers "
          f"{sum(s['corrected_layers'] for s in stats)}, loss diff {worst_loss:.3g}, weight diff {worst_w:.3g}")
    assert worst_loss <= 1e-5
    assert worst_w <= 2e-5


def test_speculation_without_clipping_is_bitwise_the_held_update(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=256)
    a_stats, a = train(binary_dir, model, data, tmp_path / "spec", max_grad_norm=100.0, speculate="always", accum=2)
    b_stats, b = train(binary_dir, model, data, tmp_path / "hold", max_grad_norm=100.0, speculate="never", accum=2)
    assert all(s["speculated_layers"] > 0 for s in a_stats) and all(s["speculated_layers"] == 0 for s in b_stats)
    assert [s["loss"] for s in a_stats] == [s["loss"] for s in b_stats]
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_auto_stops_speculating_when_every_step_clips(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=256)
    stats, _ = train(binary_dir, model, data, tmp_path / "out", max_grad_norm=0.05, speculate="auto")
    spec = [s["speculated_layers"] > 0 for s in stats]
    # The first step speculates (no history yet); once it clipped, half of the steps seen did,
    # and every later step holds.
    assert spec[0] and not any(spec[1:]), spec


def test_fp16_loss_scaling_never_speculates(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    run_train(binary_dir, [f"--model={model}", f"--data={data}", "--format=pretokenized", "--dtype=fp16",
                           "--batch-size=4", "--max-steps=4", "--max-grad-norm=0.5", "--speculate=always",
                           "--workers=1x1", f"--stats-jsonl={out}/stats.jsonl", "--no-export"])
    assert all(s["speculated_layers"] == 0 for s in read_stats(out / "stats.jsonl"))
