"""offloadd-train refuses bad jobs with an error naming what is wrong, before training starts."""

import json
import subprocess

import pytest

from pipeline_testlib import VOCAB, build_model, write_pretokenized


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("job")
    return build_model(d / "model"), write_pretokenized(d / "data.jsonl"), d


def run(binary_dir, model, data, *extra):
    cmd = [str(binary_dir / "trainer" / "offloadd-train"), f"--model={model}", f"--data={data}",
           "--format=pretokenized", "--max-steps=2", "--workers=1x1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("extra,message", [
    (["--host-memory-limit=64KiB"], "host_memory_limit"),
    (["--dtype=fp16", "--backoff-factor=1.5"], "backoff_factor"),
    (["--dtype=int8"], "compute dtype must be"),
    (["--device=tpu"], "device must be cpu, cuda or cuda:N"),
    (["--layer-activation=7:recompute"], "activation override for layer 7"),
    (["--batch-size=0"], "batch size must be at least 1"),
    (["--scheduler=sawtooth"], "sawtooth"),
    (["--tier=nvme"], "NVMe tier needs at least one store directory"),
    (["--activations=offload_nvme"], "activations offloaded to NVMe need an NVMe directory"),
    (["--activations=swap"], "activation mode must be auto, keep, recompute, recompute_offload_cpu, offload_cpu or offload_nvme"),
    (["--frobnicate"], "unknown flag --frobnicate"),
    (["--max-grad-norm=nan"], "max_grad_norm must be a finite number, got nan"),
    (["--lr=inf"], "learning_rate must be a finite number"),
    (["--update-depth=0"], "--update-depth: 1..64 updates queued per worker, got 0"),
    (["--device-optimizer-blocks=-3"], "--device-optimizer-blocks: a block count >= 0 or auto, got -3"),
    (["--device-optimizer-blocks=9"], "device_optimizer_blocks 9: the model has 4 blocks"),
    # Numbers are the whole value: trailing garbage and signs on unsigned flags are refused.
    (["--batch-size=4x"], "--batch-size: bad value '4x'"),
    (["--lr=1e-3abc"], "--lr: bad value '1e-3abc'"),
    (["--seed=-1"], "--seed: bad value '-1'"),
    (["--workers=1x2y"], "--workers: bad value '1x2y'"),
    (["--max-steps=2.5"], "--max-steps: bad value '2.5'"),
])
def test_refused_with_a_clear_error(binary_dir, job, extra, message):
    model, data, _ = job
    r = run(binary_dir, model, data, *extra)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert "step 1/" not in r.stdout  # nothing trained


def test_token_outside_the_vocabulary_names_file_and_line(binary_dir, job):
    model, _, d = job
    bad = d / "bad.jsonl"
    bad.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n" + json.dumps({"input_ids": [4, VOCAB + 5]}) + "\n")
    r = run(binary_dir, model, bad)
    assert r.returncode != 0
    assert f"bad.jsonl:2: input_ids: {VOCAB + 5} is not a token id" in r.stderr, r.stderr


def test_model_dropout_is_refused_unless_disabled_and_then_logged(binary_dir, tmp_path):
    """The engine applies no dropout: a model that trains with it in Hugging Face is refused
    until the job says --dropout=disable, and then the log says it trains without it."""
    model = build_model(tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["attention_dropout"] = 0.1
    (model / "config.json").write_text(json.dumps(config))
    data = write_pretokenized(tmp_path / "data.jsonl")
    r = run(binary_dir, model, data)
    assert r.returncode != 0
    assert "attention_dropout=0.1" in r.stderr and "--dropout=disable" in r.stderr, r.stderr
    assert "step 1/" not in r.stdout
    r = run(binary_dir, model, data, "--dropout=disable")
    assert r.returncode == 0, r.stderr
    assert "training WITHOUT dropout (dropout: disable): the model's config.json sets " \
           "attention_dropout=0.1" in r.stderr, r.stderr
    assert "step 2/2" in r.stdout
    r = run(binary_dir, model, data, "--dropout=maybe")
    assert r.returncode != 0 and "--dropout: model or disable" in r.stderr


def test_forced_adamw_kernel_is_used_and_logged(binary_dir, job):
    model, data, _ = job
    r = run(binary_dir, model, data, "--adamw-kernel=portable")
    assert r.returncode == 0, r.stderr
    assert "AdamW kernel portable (requested)" in r.stderr, r.stderr
    r = run(binary_dir, model, data, "--adamw-kernel=sse9")
    assert r.returncode != 0 and "unknown kernel path 'sse9'" in r.stderr, r.stderr


def test_update_depth_is_used_and_logged(binary_dir, job):
    model, data, _ = job
    for depth in (1, 2):
        r = run(binary_dir, model, data, f"--update-depth={depth}")
        assert r.returncode == 0, r.stderr
        assert f"updates earliest-needed first ({depth} queued per worker)" in r.stderr, r.stderr
