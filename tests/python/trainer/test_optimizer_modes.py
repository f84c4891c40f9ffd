"""The compact optimizer modes in offloadd-train on the CPU (docs/optimizer-modes.md): bf16 and int8
AdamW states with an fp32 master train a tiny Llama in a smaller arena, track exact AdamW, save
their states in their own format (with the int8 block scales) and resume bit for bit; a checkpoint
of another mode is refused naming both.

The loss bound. Step 1's loss is computed before any update, so it is the same bits in every mode.
After that the modes differ from exact only through their states' rounding: bf16 states are
stochastically rounded to 8 significant bits (a relative error below 2^-7 in m and in v, so below
2^-7 + 2^-8 = 1.2% in each element's update m / sqrt(v)); int8 states round m to 1/254 and sqrt(v)
to 1/510 of their block's largest element. The issue's convergence goal is a loss within 1% of
exact; with the 1.2% bound on each update's error and updates that shrink the loss by a few percent
over these steps, every step's loss stays well inside that 1%, which is what is asserted per step.
"""

import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from pipeline_testlib import build_model, read_stats, run_train, write_pretokenized

BLOCK = 256  # workers::kInt8BlockSize


def region_bytes(state: str, n: int) -> int:
    """workers::StateRegionBytes."""
    if state == "bf16":
        return 2 * n
    return (n + 63) // 64 * 64 + 4 * ((n + BLOCK - 1) // BLOCK)


def args(model, data, out, *, steps, state="fp32", extra=()):
    out.mkdir(parents=True, exist_ok=True)
    return [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cpu",
            "--dtype=bf16", "--batch-size=4", f"--max-steps={steps}", "--lr=2e-3",
            "--weight-decay=0.1", "--max-grad-norm=0.5", "--scheduler=cosine", "--warmup-steps=2",
            "--seed=7", "--workers=1x2", f"--state-dtype={state}", f"--output-dir={out}",
            f"--stats-jsonl={out}/stats.jsonl", *extra]


@pytest.fixture
def inputs(tmp_path):
    return build_model(tmp_path / "model"), write_pretokenized(tmp_path / "data.jsonl")


@pytest.mark.parametrize("state,bytes_per_param", [("bf16", "10"), ("int8", "8.03125")])
def test_each_mode_trains_in_a_smaller_arena_and_tracks_exact(binary_dir, tmp_path, inputs, state,
                                                               bytes_per_param):
    model, data = inputs
    steps = 16
    r_exact = run_train(binary_dir, args(model, data, tmp_path / "exact", steps=steps))
    r_mode = run_train(binary_dir, args(model, data, tmp_path / state, steps=steps, state=state))
    assert "optimizer exact (fp32 master, fp32 states)" in r_exact.stderr, r_exact.stderr
    assert "(14 B/parameter," in r_exact.stderr
    assert f"optimizer not exact: fp32 master, {state} states" in r_mode.stderr, r_mode.stderr
    assert f"({bytes_per_param} B/parameter," in r_mode.stderr, r_mode.stderr
    a = read_stats(tmp_path / "exact" / "stats.jsonl")
    b = read_stats(tmp_path / state / "stats.jsonl")
    assert len(a) == len(b) == steps
    assert a[0]["loss"] == b[0]["loss"], "step 1 runs before any update"
    assert a[0]["grad_norm"] == b[0]["grad_norm"]
    diffs = [abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b)]
    assert max(diffs) < 0.01, diffs
    assert any(d > 0 for d in diffs), "the mode must act: its losses differ from exact's"


@pytest.mark.parametrize("state", ["bf16", "int8"])
def test_resume_is_bit_exact_and_states_keep_their_format(binary_dir, tmp_path, inputs, state):
    model, data = inputs
    full, part = tmp_path / "full", tmp_path / "part"
    run_train(binary_dir, args(model, data, full, steps=8, state=state, extra=["--save-steps=4"]))
    run_train(binary_dir, args(model, data, part, steps=8, state=state,
                               extra=["--save-steps=4", f"--resume-from={full}/checkpoint-4"]))
    a, b = read_stats(full / "stats.jsonl"), read_stats(part / "stats.jsonl")
    assert [s["step"] for s in b] == [5, 6, 7, 8]
    for sa, sb in zip(a[4:], b):
        assert (sa["loss"], sa["grad_norm"]) == (sb["loss"], sb["grad_norm"]), (sa, sb)
    wa, wb = load_file(full / "model.safetensors"), load_file(part / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    ckpt = full / "checkpoint-4"  # the run's last step is exported, not checkpointed
    assert json.loads((ckpt / "offloadd_state.json").read_text())["optimizer"] == \
        {"state_dtype": state, "master_dtype": "fp32"}
    layers = sorted(p.name for p in ckpt.glob("optimizer-layer-*.safetensors"))
    assert layers
    for name in layers:
        with safe_open(str(ckpt / name), framework="pt") as f:
            assert f.metadata()["state_dtype"] == state
            assert f.metadata()["adam_step"] == "4"
            assert sorted(f.keys()) == ["exp_avg", "exp_avg_sq"]
            m = f.get_tensor("exp_avg")
            assert m.dtype == torch.uint8
        n = load_file(ckpt / name.replace("optimizer", "model"))
        numel = sum(t.numel() for t in n.values())
        assert m.numel() == region_bytes(state, numel), name
        if state == "int8":  # the block scales follow the codes: absmax(m) per block, positive
            raw = m.numpy().tobytes()
            at = (numel + 63) // 64 * 64
            scales = struct.unpack(f"<{(numel + BLOCK - 1) // BLOCK}f", raw[at:])
            assert all(s > 0 for s in scales), scales


def test_resuming_in_another_mode_is_refused_naming_both(binary_dir, tmp_path, inputs):
    model, data = inputs
    first = tmp_path / "first"
    run_train(binary_dir, args(model, data, first, steps=4, state="bf16", extra=["--save-steps=2"]))
    r = run_train(binary_dir, args(model, data, tmp_path / "second", steps=4, state="int8",
                                   extra=[f"--resume-from={first}/checkpoint-2"]), check=False)
    assert r.returncode != 0
    assert "fp32 master, bf16 states" in r.stderr and "fp32 master, int8 states" in r.stderr, \
        r.stderr


def test_what_the_trainer_does_not_run_is_refused_by_name(binary_dir, tmp_path, inputs):
    model, data = inputs
    r = run_train(binary_dir, [*args(model, data, tmp_path / "o", steps=2), "--master-dtype=bf16"],
                  check=False)
    assert r.returncode != 0 and "optimizer.master_dtype bf16" in r.stderr, r.stderr
    r = run_train(binary_dir, args(model, data, tmp_path / "o", steps=2, state="int4"), check=False)
    assert r.returncode != 0 and "optimizer.state_dtype: unknown value 'int4'" in r.stderr, r.stderr
