"""Issue #29 item 23: offloadd-train --validate-only stops after the plan and prints the predicted
step time and tokens/s with their basis (the node profile, and where the GPU work's figures come
from), without creating the arena or running a step; records of varying length are priced at the
expected padded length of their distribution and tokens/s counts their real tokens.
"""

import json
import os

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


def test_validate_only_prints_host_memory_per_tier_under_the_default_limit(binary_dir, tmp_path):
    # offloadd-train applies the daemon's default host limit (what the node can give: MemAvailable
    # less a reserve of max(4 GiB, 6% of RAM), capped by its cgroup) when none is given, and
    # --validate-only prints the predicted host RAM and disk with each tier of the optimizer states.
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=16)
    _, p, r = validate(binary_dir, tmp_path, model, data, "--batch-size=2")
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    reserve = max(4 << 30, ram // 100 * 6)
    # MemAvailable moves while the test runs: within 1 GiB of what it is now, less the reserve.
    available = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemAvailable:"))
    assert 0 < p["host_memory_limit"] <= max(0, available - reserve) + (1 << 30), (p, available, reserve)
    assert p["predicted_host_bytes"] == p["tiers"]["ram"]["host_bytes"] > 0 and p["predicted_disk_bytes"] == 0, p
    nvme = p["tiers"]["nvme"]
    # 12 B per parameter (fp32 master, exp_avg, exp_avg_sq) and the versions in flight on disk.
    assert nvme["disk_bytes"] > 0 and nvme["disk_bytes"] % 12 == 0 and nvme["host_bytes"] > 0, p
    assert "host memory: host RAM " in r.stdout and "available less a reserve of" in r.stdout, r.stdout
    assert "per tier of the optimizer states: RAM: host " in r.stdout, r.stdout


def test_a_job_over_the_host_limit_is_refused_with_its_numbers(binary_dir, tmp_path):
    # Refused before the arena is made (never killed by the kernel), naming what it needs, the
    # limit and the smallest change that fits.
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=16)
    for extra in ([], ["--validate-only"]):
        r = run_train(binary_dir, [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cpu",
                                   "--dtype=fp32", "--workers=1x1", "--max-steps=2", "--batch-size=2",
                                   f"--output-dir={tmp_path}/out", "--host-memory-limit=256MiB", *extra],
                      check=False)
        assert r.returncode != 0, r.stdout
        assert "RESOURCE_EXHAUSTED" in r.stderr and "the job needs host RAM " in r.stderr, r.stderr
        assert "more than the host memory limit of 256 MiB (host_memory_limit)" in r.stderr, r.stderr
        assert "it would fit with a host memory limit of at least " in r.stderr, r.stderr
        assert "step 1/" not in r.stdout + r.stderr


def test_validate_only_prices_each_row_length(binary_dir, tmp_path):
    # The planner prices sequence length: the same step at powers of two up to the model's
    # max_position_embeddings (256 here: 64, 128, 256) and at max_seq_length, each with its
    # predicted step time and tokens/s (and on CUDA its GPU peak against gpu_memory_limit).
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=16)
    _, p, r = validate(binary_dir, tmp_path, model, data, "--batch-size=2", "--grad-accum=2",
                       "--max-seq-length=192")
    lengths = p["lengths"]
    assert [x["seq"] for x in lengths] == [64, 128, 192, 256], lengths
    assert all(x["fits"] and x["predicted_gpu_bytes"] == 0 for x in lengths), lengths  # a CPU device
    steps = [x["predicted_step_seconds"] for x in lengths]
    # Longer rows, more work per step (the GEMM rate is measured once; the other terms are fixed).
    assert all(a <= b for a, b in zip(steps, steps[1:])) and steps[0] < steps[-1], steps
    for x in lengths:
        tokens = 2 * 2 * x["seq"]
        assert abs(x["predicted_tokens_per_second"] * x["predicted_step_seconds"] - tokens) < 1e-6 * tokens, x
        assert f"at {x['seq']} tokens: " in r.stdout and " s/step, " in r.stdout, r.stdout


def test_validate_only_prints_the_capacity_arithmetic(binary_dir, tmp_path):
    # The largest-trainable arithmetic (job/capacity.h) beside the host memory: this job against
    # (the host limit + the store directories' free space) / 12 B, and what its plan holds per
    # parameter, part by part (the parts add up to the whole, to the printed rounding).
    import re
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=16)
    store = tmp_path / "store"
    store.mkdir()
    number = r"([\d.]+)"
    # The RAM tier keeps no 16-bit copy; the NVMe tier with no limit named puts every block's
    # states on NVMe, and each keeps its copy in RAM.
    for tier, limit, copies in (("cpu", ["--host-memory-limit=2GiB"], None), ("nvme", [], 2.0)):
        _, p, r = validate(binary_dir, tmp_path, model, data, "--batch-size=2", "--dtype=bf16",
                           f"--tier={tier}", f"--nvme-dir={store}", *limit)
        line = next(x for x in r.stdout.splitlines() if x.startswith("host memory: "))
        m = re.search(r"capacity: [\d.]+( [MB])? parameters, [\d.]+% of the [\d.]+( [MB])? this node "
                      r"holds for exact AdamW \(\(host memory limit [\d.]+ [KMGT]?i?B \+ [\d.]+ [KMGT]?i?B free in "
                      r"the store directories\) / 12 B per parameter\); the plan holds " + number +
                      r" B per parameter in RAM and on disk: " + number + r" master and optimizer states, "
                      + number + r" gradients(?:, " + number + r" weight copies beside the masters)?, "
                      + number + r" the rest", line)
        assert m, line
        held, states, grads, weights, rest = (float(g) if g else None for g in m.groups()[2:])
        assert states == 12 and grads == 2 and weights == copies, (tier, line)
        parts = states + grads + (weights or 0) + rest
        assert abs(parts - held) <= 0.01 * held, (parts, held, line)
