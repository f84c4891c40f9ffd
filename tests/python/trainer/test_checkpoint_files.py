"""Checkpoint layer files (trainer/state/checkpoint.h) load with the reference safetensors package and
hold the expected tensors: fp32 master weights under their Hugging Face names in model-layer-*,
Adam moments as "<name>.exp_avg" / "<name>.exp_avg_sq" in optimizer-layer-*. The files come from
the C++ test CheckpointSample.WritesSampleForPython."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file


@pytest.fixture(scope="module")
def checkpoint(binary_dir, tmp_path_factory):
    test = binary_dir / "tests" / "trainer" / "checkpoint_test"
    if not test.exists():
        pytest.skip(f"{test} is not built")
    out = tmp_path_factory.mktemp("ckpt")
    subprocess.run([str(test), "--gtest_filter=CheckpointSample.*"], check=True, capture_output=True,
                   env={**os.environ, "OFFLOADD_CHECKPOINT_SAMPLE_DIR": str(out)})
    return out / "checkpoint-2"


def test_master_weights_are_a_state_dict(checkpoint):
    weights = load_file(checkpoint / "model-layer-00000.safetensors")
    assert sorted(weights) == ["lm_head.weight", "model.norm.weight"]
    assert weights["model.norm.weight"].dtype == np.float32
    np.testing.assert_array_equal(weights["model.norm.weight"], [1, 2, 3])
    np.testing.assert_array_equal(weights["lm_head.weight"], [[10, 11, 12], [13, 14, 15]])
    with safe_open(str(checkpoint / "model-layer-00000.safetensors"), framework="numpy") as f:
        assert f.metadata()["format"] == "pt"
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"lm_head.weight": "model-layer-00000.safetensors",
                                   "model.norm.weight": "model-layer-00000.safetensors"}
    assert index["metadata"]["total_size"] == 9 * 4


def test_optimizer_moments(checkpoint):
    moments = load_file(checkpoint / "optimizer-layer-00000.safetensors")
    assert sorted(moments) == ["lm_head.weight.exp_avg", "lm_head.weight.exp_avg_sq",
                               "model.norm.weight.exp_avg", "model.norm.weight.exp_avg_sq"]
    np.testing.assert_array_equal(moments["model.norm.weight.exp_avg"], [0, 0.5, 1.0])
    np.testing.assert_array_equal(moments["lm_head.weight.exp_avg_sq"].ravel(), 0.25 * np.arange(3, 9))
    with safe_open(str(checkpoint / "optimizer-layer-00000.safetensors"), framework="numpy") as f:
        assert f.metadata()["adam_step"] == "2"


def test_offloadd_state(checkpoint):
    state = json.loads((checkpoint / "offloadd_state.json").read_text())
    assert state["global_step"] == 2
    assert state["num_layers"] == 1
    assert state["model_fingerprint"].startswith("llama/1 layers/9 params/")
    for name, size in state["files"].items():
        assert (checkpoint / name).stat().st_size == size


def test_trainer_state_json_is_huggingfaces(checkpoint):
    """transformers' TrainerState.load_from_json reads it: its schema, no offloadd keys."""
    trainer_callback = pytest.importorskip("transformers.trainer_callback")
    hf = trainer_callback.TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    assert hf.global_step == 2
    raw = json.loads((checkpoint / "trainer_state.json").read_text())
    assert "format" not in raw and "files" not in raw


def crc32c(data: bytes) -> int:
    """Plain bitwise CRC-32C (Castagnoli, reflected 0x82F63B78): independent of the C++ code."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_every_file_has_its_crc32c(checkpoint):
    state = json.loads((checkpoint / "offloadd_state.json").read_text())
    assert "trainer_state.json" in state["files"]  # HF's view is checksummed like the rest
    assert sorted(state["crc32c"]) == sorted(state["files"])
    for name, crc in state["crc32c"].items():
        assert int(crc, 16) == crc32c((checkpoint / name).read_bytes()), name


def test_a_runs_trainer_state_json_has_its_log_history(binary_dir, tmp_path):
    """A real run's checkpoint: HF's TrainerState loads it, and log_history holds each step's loss,
    learning rate, gradient norm and epoch as the run reported them (not zeros)."""
    trainer_callback = pytest.importorskip("transformers.trainer_callback")
    from pipeline_testlib import build_model, read_stats, run_train
    model = build_model(tmp_path / "model", layers=2)
    out = tmp_path / "out"
    out.mkdir()
    run_train(binary_dir, [f"--model={model}", "--random-init", "--synthetic-seq=32", "--dtype=fp32",
                           "--batch-size=2", "--grad-accum=2", "--max-steps=4", "--save-steps=3", "--lr=1e-3",
                           "--scheduler=linear", "--warmup-steps=1", "--workers=1x2", f"--output-dir={out}",
                           f"--stats-jsonl={out}/stats.jsonl", "--no-export"])
    hf = trainer_callback.TrainerState.load_from_json(str(out / "checkpoint-3" / "trainer_state.json"))
    stats = read_stats(out / "stats.jsonl")
    assert hf.global_step == 3 and hf.max_steps == 4 and hf.train_batch_size == 4
    assert [e["step"] for e in hf.log_history] == [1, 2, 3]
    for e, s in zip(hf.log_history, stats):
        assert (e["loss"], e["learning_rate"], e["grad_norm"], e["epoch"]) == \
            (s["loss"], s["learning_rate"], s["grad_norm"], s["epoch"]), (e, s)
    assert all(e["learning_rate"] > 0 and e["grad_norm"] > 0 and e["epoch"] > 0 for e in hf.log_history[1:])
