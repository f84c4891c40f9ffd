"""Several datasets mixed with weights (dataset.datasets, text/mixture.h): a job with two small
JSON Lines datasets at weights 3:1 trains on the documents in the order the documented rule gives
(mixture_rule.py reimplements it from docs/datasets.md), resumes the same sequence from a
checkpoint, and bad mixtures are refused naming the field."""

import json
import math

import pytest

from mixture_rule import epoch_order, mixture_epoch
from pipeline_testlib import build_model, read_stats, run_train

SIZES = (24, 8)  # documents of dataset 0 and 1
FIRST_ID = (10, 100)  # document j of dataset d is FIRST_ID[d] + j, repeated
SEED = 7


def write_dataset(path, d):
    with open(path, "w") as f:
        for j in range(SIZES[d]):
            f.write(json.dumps({"input_ids": [FIRST_ID[d] + j] * (5 + j % 3)}) + "\n")
    return path


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixture")
    model = build_model(d / "model")
    a, b = write_dataset(d / "a.jsonl", 0), write_dataset(d / "b.jsonl", 1)
    spec = d / "job.yaml"
    spec.write_text(f"""
model: {{path: {model}}}
dataset:
  format: pretokenized
  max_seq_length: 16
  datasets:
    - {{paths: [{a}], weight: 3}}
    - {{paths: [{b}], weight: 1}}
training: {{learning_rate: 1e-3, per_device_train_batch_size: 4, max_steps: 16, seed: {SEED},
           save_steps: 8}}
output_dir: {d / "out"}
""")
    return spec, d, a, b


def documents(batches):
    """The document of each row of each dumped micro-batch, as an index into the datasets'
    concatenation (dataset 1's documents after dataset 0's)."""
    out = []
    for step in batches:
        for m in step:
            T = m["seq"]
            for r in range(m["batch"]):
                first = m["input_ids"][r * T]
                out.append(first - FIRST_ID[0] if first < FIRST_ID[1] else SIZES[0] + first - FIRST_ID[1])
    return out


def test_two_datasets_at_3_to_1_train_in_the_documented_order(binary_dir, job):
    spec, d, _, _ = job
    r = run_train(binary_dir, [str(spec), "--workers=1x1", "--no-export", f"--output-dir={d / 'run'}",
                               f"--stats-jsonl={d / 'run.jsonl'}", f"--dump-batches={d / 'batches.json'}"])
    assert "a mixture of 2 datasets (24 documents at weight 3, 8 documents at weight 1" in r.stdout + r.stderr
    got = documents(json.loads((d / "batches.json").read_text()))
    assert len(got) == 16 * 4
    want = []
    epoch = 0
    while len(want) < len(got):
        want += mixture_epoch(SIZES, [3.0, 1.0], SEED, epoch)
        epoch += 1
    assert epoch >= 2, "the steps do not reach a second epoch"
    assert got == want[:len(got)]
    # Each row holds its document whole (no packing): the rows are documents, not pieces.
    losses = [s["loss"] for s in read_stats(d / "run.jsonl")]
    assert len(losses) == 16 and all(loss == loss for loss in losses)


def test_a_resumed_mixture_continues_the_same_sequence(binary_dir, job):
    spec, d, _, _ = job
    run_train(binary_dir, [str(spec), "--workers=1x1", "--no-export", f"--output-dir={d / 'full'}",
                           f"--stats-jsonl={d / 'full.jsonl'}"])
    ckpt = d / "full" / "checkpoint-8"
    state = json.loads((ckpt / "offloadd_state.json").read_text())
    assert "mixture" in json.dumps(state), "the checkpoint's data cursor does not name the mixture"
    run_train(binary_dir, [str(spec), "--workers=1x1", "--no-export", f"--output-dir={d / 'resumed'}",
                           f"--resume-from={ckpt}", f"--stats-jsonl={d / 'resumed.jsonl'}"])
    full = [s["loss"] for s in read_stats(d / "full.jsonl")]
    again = [s["loss"] for s in read_stats(d / "resumed.jsonl")]
    assert len(again) == 8 and again == full[8:]


def held_out(n, fraction, seed):
    """text::HeldOutIndices: the first ceil(n x fraction) of a salted permutation, sorted."""
    k = min(max(math.ceil(n * fraction), 1), n - 1)
    return sorted(epoch_order(n, seed ^ 0x6576616C73706C74, 0, True)[:k])


def test_eval_split_holds_out_of_each_dataset(binary_dir, job):
    """eval_split 0.25 holds out ceil(n_i / 4) records of each dataset, chosen as for one dataset;
    the mixture draws from the rest, and the eval set is every held-out record."""
    spec, d, _, _ = job
    run_train(binary_dir, [str(spec), "--set", "dataset.eval_split=0.25", "--set", "training.eval_steps=4",
                           "--set", "training.max_steps=8", "--workers=1x1", "--no-export",
                           f"--output-dir={d / 'split'}", f"--stats-jsonl={d / 'split.jsonl'}",
                           f"--dump-batches={d / 'split.json'}"])
    kept, held_tokens = [], 0
    for di, n in enumerate(SIZES):
        held = held_out(n, 0.25, SEED)
        assert len(held) == math.ceil(n / 4)
        offset = sum(SIZES[:di])
        kept += [offset + j for j in range(n) if j not in held]
        held_tokens += sum(5 + j % 3 - 1 for j in held)  # the first token of a document predicts none
    sizes = [n - math.ceil(n / 4) for n in SIZES]
    got = documents(json.loads((d / "split.json").read_text()))
    want, epoch = [], 0
    while len(want) < len(got):
        want += [kept[i] for i in mixture_epoch(sizes, [3.0, 1.0], SEED, epoch)]
        epoch += 1
    assert got == want[:len(got)]
    evals = [r for r in read_stats(d / "split.jsonl", steps_only=False) if "eval_loss" in r]
    assert [e["step"] for e in evals] == [0, 4, 8]
    assert all(e["eval_tokens"] == held_tokens for e in evals), (evals, held_tokens)


@pytest.mark.parametrize("datasets,extra,message", [
    ("[{paths: [A], weight: 0}, {paths: [B], weight: 1}]", "",
     "dataset.datasets[0].weight: must be finite and > 0 (its share of the draws), got 0"),
    ("[{paths: [A], weight: 1}, {paths: [B], weight: -2}]", "",
     "dataset.datasets[1].weight: must be finite and > 0 (its share of the draws), got -2"),
    ("[{paths: [A], weight: 1}, {paths: [B], weight: .nan}]", "",
     "dataset.datasets[1].weight: expected a number"),
    ("[{paths: [A], weight: 1}, {paths: [B], weight: .inf}]", "",
     "dataset.datasets[1].weight: expected a number"),
    ("[]", "", "dataset.paths: required: at least one data file (or dataset.datasets, a mixture)"),
    ("[{paths: [A], weight: 1}, {paths: [MISSING], weight: 1}]", "",
     "dataset.datasets[1].paths[0]:"),
    ("[{paths: [A], weight: 1}, {weight: 1}]", "", "dataset.datasets[1].paths: required"),
    ("[{paths: [A], weight: 1}, {paths: [B], weight: 1}]", "paths: [A]",
     "dataset.datasets: given with dataset.paths"),
    ("[{paths: [A], weight: 1}, {paths: [B], weight: 1}]", "stopping_strategy: all_exhausted_without_replacement",
     "dataset.stopping_strategy: 'all_exhausted_without_replacement': expected first_exhausted or all_exhausted"),
    ("[{paths: [A], weight: 1}, {paths: [B], weight: 1, template: builtin}]", "",
     "dataset.datasets[1].template: 'builtin' is not the job's chat template"),
    # A dataset of the mixture that trains no token (its records' labels all -100).
    ("[{paths: [A], weight: 1}, {paths: [MASKED], weight: 1}]", "",
     "dataset.datasets[1].paths: no record has a token to train on"),
])
def test_bad_mixtures_are_refused_naming_the_field(binary_dir, job, datasets, extra, message):
    spec, d, a, b = job
    masked = d / "masked.jsonl"
    masked.write_text(json.dumps({"input_ids": [5, 6, 7], "labels": [-100, -100, -100]}) + "\n")
    text = datasets.replace("MISSING", str(d / "missing.jsonl")).replace("MASKED", str(masked))
    text = text.replace("[A]", f"[{a}]").replace("[B]", f"[{b}]")
    bad = d / "bad.yaml"
    bad.write_text(f"""
model: {{path: {d / "model"}}}
dataset:
  format: pretokenized
  datasets: {text}
  {extra.replace("[A]", f"[{a}]")}
training: {{max_steps: 1}}
output_dir: {d / "bad-out"}
""")
    r = run_train(binary_dir, [str(bad), "--workers=1x1"], check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr, r.stderr
