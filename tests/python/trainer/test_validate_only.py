"""Issue #29 item 23: offloadd-train --validate-only stops after the plan and prints the predicted
step time and tokens/s with their basis (the node profile, and where the GPU work's figures come
from), without creating the arena or running a step; records of varying length are priced at the
expected padded length of their distribution and tokens/s counts their real tokens.
"""

import json

from pipeline_testlib import build_model, run_train, write_pretokenized


def validate(binary_dir, tmp_path, model, data, *extra):
    out = tmp_path / "out"
    r = run_train(binary_dir, [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cpu",
                               "--dtype=fp32", "--workers=1x2", "--max-steps=5", f"--output-dir={out}",
                               f"--stats-jsonl={tmp_path}/stats.jsonl", f"--profile-dir={tmp_path}/profiles",
                               "--validate-only", *extra])
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("valid: predicted "), r.stdout
    return lines[0], json.loads(lines[1]), r


def test_validate_only_prints_the_priced_step_and_trains_nothing(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=64)
    line, p, r = validate(binary_dir, tmp_path, model, data, "--batch-size=4", "--grad-accum=2")
    assert p["predicted_step_seconds"] > 0 and p["predicted_tokens_per_second"] > 0, p
    assert p["micro_batch"] == 4 and p["accumulation"] == 2
    assert p["bound"] in line and "s/step" in line and "k tokens/s" in line
    assert p["basis"].startswith("node profile ") and "GPU work: " in p["basis"], p
    # Pretokenized records of 6-40 tokens: priced at the expected padded length of 4 rows, and
    # tokens/s counts the real tokens (their mean), not the padding.
    assert "records of " in line and "padded to " in line, line
    assert 8 <= p["seq"] <= 48, p
    mean = sum(len(json.loads(x)["input_ids"]) for x in data.read_text().splitlines()) / 64
    assert abs(p["predicted_tokens_per_second"] * p["predicted_step_seconds"] - 8 * mean) < 1e-6 * 8 * mean
    # Nothing ran: no step reported, no output written, no arena set up.
    assert not (tmp_path / "stats.jsonl").exists() or not (tmp_path / "stats.jsonl").read_text().strip()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert "set-up " not in r.stderr and "step 1/" not in r.stdout + r.stderr


def test_validate_only_refuses_what_the_run_would(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=8)
    r = run_train(binary_dir, [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cpu",
                               "--batch-size=0", "--validate-only"], check=False)
    assert r.returncode != 0 and "batch size must be at least 1" in r.stderr, r.stderr
