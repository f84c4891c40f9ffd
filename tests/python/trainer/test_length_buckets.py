"""Records of varying length padded to length buckets (the default on a GPU,
--length-buckets=on elsewhere), so that a job meets a few padded lengths, which the planner warms
before they are met, instead of a new one most steps.

- Every micro-batch's padded length is its longest row's bucket (job/batch_planner.h
  PaddedLength: multiples of 16 up to 64, then quarter octaves), and the rows are the same.
- The loss is the same as with padding to a multiple of 8: padding has no target and causal
  attention keeps real tokens from seeing it; only the GEMMs' row counts differ (fp32 on the CPU).
"""

import json
import math

from pipeline_testlib import build_model, read_stats, run_train, write_pretokenized


def bucket(longest: int, cap: int) -> int:
    step = 16
    octave = 64
    while octave < longest:
        step = octave // 4
        octave *= 2
    return min(max(cap, longest), math.ceil(longest / step) * step)


def run(binary_dir, tmp_path, name, model, data, *extra):
    out = tmp_path / name
    out.mkdir()
    run_train(binary_dir, [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cpu",
                           "--dtype=fp32", "--batch-size=4", "--workers=1x2", "--max-steps=3", "--no-export",
                           "--lr=0", "--max-seq-length=200", f"--stats-jsonl={out}/stats.jsonl",
                           f"--dump-batches={out}/batches.json", *extra])
    return json.loads((out / "batches.json").read_text()), read_stats(out / "stats.jsonl")


def test_micro_batches_pad_to_the_bucket_of_their_longest_row(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=48, seed=3)
    plain, plain_stats = run(binary_dir, tmp_path, "plain", model, data)
    bucketed, bucketed_stats = run(binary_dir, tmp_path, "buckets", model, data, "--length-buckets=on")
    differs = False
    for p_step, b_step in zip(plain, bucketed):
        for p, b in zip(p_step, b_step):
            T, B = p["seq"], b["seq"]
            rows = [p["input_ids"][r * T:(r + 1) * T] for r in range(p["batch"])]
            longest = max(max((i + 1 for i, t in enumerate(row) if t != 0), default=0) for row in rows)
            assert T == math.ceil(longest / 8) * 8 or T == 200, (T, longest)
            assert B == bucket(longest, 200), (B, longest)
            differs |= B != T
            for r in range(p["batch"]):  # the same rows, padded further
                assert b["input_ids"][r * B:r * B + T] == p["input_ids"][r * T:(r + 1) * T]
                assert set(b["input_ids"][r * B + T:(r + 1) * B]) <= {0}
                assert set(b["targets"][r * B + T:(r + 1) * B]) <= {-100}
    assert differs, "no micro-batch padded differently: the test data does not exercise buckets"
    # lr 0: every step sees the same weights; the losses agree to fp32 rounding over the tokens.
    for p, b in zip(plain_stats, bucketed_stats):
        assert p["tokens"] == b["tokens"] and p["trained_tokens"] == b["trained_tokens"]
        assert math.isclose(p["loss"], b["loss"], rel_tol=1e-5), (p["loss"], b["loss"])


def test_length_buckets_flag_is_checked(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=8)
    r = run_train(binary_dir, [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cpu",
                               "--max-steps=1", "--length-buckets=sometimes"], check=False)
    assert r.returncode != 0 and "--length-buckets: on or off" in r.stderr
