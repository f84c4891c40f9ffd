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
    (["--activations=swap"], "activation mode must be auto, keep, recompute, offload_cpu or offload_nvme"),
    (["--frobnicate"], "unknown flag --frobnicate"),
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
