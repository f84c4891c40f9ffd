"""Held-out evaluation in the trainer (--eval-data / --eval-steps; TrainConfig::eval_data): the
reported loss is the mean token cross-entropy over every evaluation record, checked against
Hugging Face transformers on the same records with the model's weights at that step (the initial
model before training, the exported model at the end). fp32 on the CPU: the sums differ only in
order and in batching (padding masked), so the bound is 1e-5 relative."""
import json

import torch
import transformers

from pipeline_testlib import build_model, run_train, write_pretokenized
from test_pipeline_parity import train_args


def hf_eval_loss(model_dir, records):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for r in records:
            ids = torch.tensor([r["input_ids"]])
            labels = torch.tensor(r["labels"][1:])  # position t predicts token t + 1
            logits = model(input_ids=ids).logits[0, :-1].float()
            total += torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100,
                                                       reduction="sum").item()
            count += int((labels != -100).sum())
    return total / count, count


def test_eval_loss_matches_transformers_before_and_after_training(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    held = write_pretokenized(tmp_path / "eval.jsonl", n=13, seed=5)  # not a multiple of the batch
    out = tmp_path / "out"
    args = [a for a in train_args(model, data, out, accum=1) if not a.startswith("--max-steps")]
    run_train(binary_dir, args + ["--max-steps=7", f"--eval-data={held}", "--eval-steps=3"])
    evals = [json.loads(line) for line in (out / "stats.jsonl").read_text().splitlines()]
    evals = [e for e in evals if "eval_loss" in e]
    assert [e["step"] for e in evals] == [0, 3, 6, 7]
    records = [json.loads(line) for line in held.read_text().splitlines()]
    for step, model_dir in ((0, model), (7, out)):
        want, count = hf_eval_loss(model_dir, records)
        got = next(e for e in evals if e["step"] == step)
        assert got["eval_tokens"] == count
        assert abs(got["eval_loss"] - want) <= 1e-5 * want, (step, got, want)
    assert evals[-1]["eval_loss"] != evals[0]["eval_loss"]  # evaluated with the trained weights


def test_eval_settings_are_checked(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    r = run_train(binary_dir, train_args(model, data, tmp_path / "a", accum=1) + [f"--eval-data={data}"],
                  check=False)
    assert r.returncode != 0 and "eval data given without eval_steps" in r.stderr, r.stderr[-800:]
    r = run_train(binary_dir, train_args(model, data, tmp_path / "b", accum=1) + ["--eval-steps=5"], check=False)
    assert r.returncode != 0 and "eval_steps 5 given without eval data" in r.stderr, r.stderr[-800:]
    r = run_train(binary_dir, train_args(model, data, tmp_path / "c", accum=1) +
                  [f"--eval-data={tmp_path}/missing.jsonl", "--eval-steps=5"], check=False)
    assert r.returncode != 0 and "missing.jsonl" in r.stderr, r.stderr[-800:]
