"""per_device_train_batch_size auto (offloadd-train --batch-size=auto[:N],
--train-batch-size=N): the step planner prices each candidate micro-batch (job/batch_planner.h)
and the trainer runs the fastest; the log lists every candidate with its predicted tokens/s.

Checked here on the CPU device: the choice is the candidates' fastest (the smaller within 2%), a
global batch is kept exactly (micro x accumulation, each step consuming that many sequences), the
run then equals a fixed run of the chosen shape bit for bit, and bad settings are refused by name."""

import re

from pipeline_testlib import build_model, read_stats, run_train

SEQ = 32


def args(model, out, *extra):
    out.mkdir(parents=True, exist_ok=True)
    return [f"--model={model}", "--random-init", f"--synthetic-seq={SEQ}", "--dtype=fp32", "--max-steps=3",
            "--workers=1x2", f"--output-dir={out}", f"--stats-jsonl={out}/stats.jsonl", "--no-export",
            f"--profile-dir={out.parent}/profiles", *extra]


def choice(stderr):
    line = next(l for l in stderr.splitlines() if "batch size (auto" in l)
    m = re.search(r"micro-batch (\d+) x (\d+) accumulation", line)
    cands = {(int(a), int(b)): (float(r) * (1000 if k else 1), bound)
             for a, b, r, k, bound in re.findall(r"(\d+)x(\d+): ([\d.]+)(k?) \(([^)]*)\)", line)}
    return (int(m.group(1)), int(m.group(2))), cands, line


def test_the_fastest_candidate_is_chosen_and_trained(binary_dir, tmp_path):
    model = build_model(tmp_path / "model", layers=2)
    r = run_train(binary_dir, args(model, tmp_path / "auto", "--batch-size=auto:8"))
    (micro, acc), cands, line = choice(r.stderr)
    assert set(cands) == {(1, 1), (2, 1), (4, 1), (8, 1)}, line  # powers of two up to the cap
    best = max(rate for rate, _ in cands.values())
    assert cands[(micro, acc)][0] >= best / 1.02, line
    assert all(rate <= cands[(micro, acc)][0] * 1.02 for (m, _), (rate, _) in cands.items() if m < micro), line
    # The steps ran with the chosen micro-batch: each consumed micro x accumulation sequences.
    stats = read_stats(tmp_path / "auto" / "stats.jsonl")
    assert [s["tokens"] for s in stats] == [micro * acc * SEQ] * 3, stats


def test_a_global_batch_is_kept_and_equals_the_fixed_run(binary_dir, tmp_path):
    model = build_model(tmp_path / "model", layers=2)
    r = run_train(binary_dir, args(model, tmp_path / "auto", "--batch-size=auto:8", "--train-batch-size=12"))
    (micro, acc), cands, line = choice(r.stderr)
    assert set(cands) == {(1, 12), (2, 6), (3, 4), (4, 3), (6, 2)}, line  # the divisors of 12 up to 8
    assert micro * acc == 12, line
    fixed = run_train(binary_dir, args(model, tmp_path / "fixed", f"--batch-size={micro}", f"--grad-accum={acc}"))
    assert "batch size (auto" not in fixed.stderr
    a = read_stats(tmp_path / "auto" / "stats.jsonl")
    b = read_stats(tmp_path / "fixed" / "stats.jsonl")
    assert [s["loss"] for s in a] == [s["loss"] for s in b]
    assert [s["tokens"] for s in a] == [12 * SEQ] * 3


def test_bad_settings_are_refused_by_name(binary_dir, tmp_path):
    model = build_model(tmp_path / "model", layers=2)
    for extra, words in [(["--batch-size=auto:0"], "--batch-size: N, auto or auto:N"),
                         (["--batch-size=4", "--train-batch-size=12"], "train_batch_size 12 is not"),
                         (["--batch-size=auto", "--train-batch-size=-2"], "train_batch_size must be positive"),
                         # Activations kept on the CPU device at micro 1 exceed half of this limit.
                         (["--batch-size=auto:4", "--host-memory-limit=64KiB"], "no micro-batch fits: at 1")]:
        r = run_train(binary_dir, args(model, tmp_path / "bad", *extra), check=False)
        assert r.returncode != 0 and words in r.stderr, (extra, r.stderr)


def test_a_resumed_run_keeps_the_chosen_shape(binary_dir, tmp_path):
    """The checkpoint records the automatic choice (offloadd_state.json "auto_batch_size"); resuming
    reuses it instead of pricing again, and continues the same loss curve. A resumed job whose
    settings contradict the recorded shape is refused naming both."""
    import json
    model = build_model(tmp_path / "model", layers=2)
    r = run_train(binary_dir, args(model, tmp_path / "full", "--batch-size=auto:8", "--save-steps=1"))
    (micro, acc), _, _ = choice(r.stderr)
    ckpt = tmp_path / "full" / "checkpoint-1"
    state = json.loads((ckpt / "offloadd_state.json").read_text())
    assert state["auto_batch_size"] == {"per_device_train_batch_size": micro, "gradient_accumulation_steps": acc}
    resumed = run_train(binary_dir, args(model, tmp_path / "resumed", "--batch-size=auto:8", f"--resume-from={ckpt}"))
    assert f"batch size (auto): {micro} x {acc}, as {ckpt} trained" in resumed.stderr, resumed.stderr[-2000:]
    assert "micro-batch" not in next(l for l in resumed.stderr.splitlines() if "batch size (auto" in l)
    full, again = read_stats(tmp_path / "full" / "stats.jsonl"), read_stats(tmp_path / "resumed" / "stats.jsonl")
    assert [s["loss"] for s in again] == [s["loss"] for s in full[1:]]
    bad = run_train(binary_dir, args(model, tmp_path / "bad", "--batch-size=auto:8",
                                     f"--train-batch-size={2 * micro * acc}", f"--resume-from={ckpt}"), check=False)
    assert bad.returncode != 0 and f"trained with micro-batch {micro} x {acc}" in bad.stderr, bad.stderr[-1500:]
