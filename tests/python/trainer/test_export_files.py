"""What a run leaves in its output_dir for Hugging Face users: a model card (README.md with the
front matter huggingface_hub reads, the hyperparameters, steps and losses), the chat template in
every checkpoint-N/ (transformers' apply_chat_template works on a checkpoint as on the final model),
and no trace.json among the model's files."""

from __future__ import annotations

import json
import re

import pytest

from pipeline_testlib import build_model, read_stats, run_train

STEPS = 4
MESSAGES = [{"role": "user", "content": "the quick brown fox"},
            {"role": "assistant", "content": "jumps over the lazy dog"}]


@pytest.fixture(scope="module")
def run(binary_dir, tmp_path_factory):
    """A chat job on a model whose tokenizer has no template: the run renders its records with
    offloadd's built-in template, which must travel with every checkpoint and the final model."""
    tmp = tmp_path_factory.mktemp("export")
    model = build_model(tmp / "model")
    # Special tokens but no template of its own.
    (model / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}))
    data = tmp / "chat.jsonl"
    with open(data, "w") as f:
        for i in range(16):
            msgs = [dict(m) for m in MESSAGES]
            msgs[1]["content"] += f" {i}"
            f.write(json.dumps({"messages": msgs}) + "\n")
    evals = tmp / "eval.jsonl"
    evals.write_text(json.dumps({"messages": MESSAGES}) + "\n")
    out = tmp / "out"
    r = run_train(binary_dir, [f"--model={model}", f"--data={data}", "--format=messages", "--dtype=fp32",
                               "--batch-size=2", f"--max-steps={STEPS}", "--save-steps=2", "--lr=1e-3",
                               "--seed=3", "--workers=1x1", "--device=cpu", f"--eval-data={evals}",
                               f"--eval-steps={STEPS}", f"--output-dir={out}",
                               f"--stats-jsonl={tmp}/stats.jsonl", f"--trace={out}/runs/trace.json"])
    return {"model": model, "out": out, "stats": read_stats(tmp / "stats.jsonl"),
            "all": read_stats(tmp / "stats.jsonl", steps_only=False), "log": r.stdout + r.stderr}


def test_every_checkpoint_carries_the_chat_template(run):
    transformers = pytest.importorskip("transformers")
    out = run["out"]
    final = transformers.AutoTokenizer.from_pretrained(out)
    want = final.apply_chat_template(MESSAGES, tokenize=False)
    assert want.strip(), "the final model's template rendered nothing"
    checkpoints = sorted(out.glob("checkpoint-*"))
    assert [c.name for c in checkpoints] == ["checkpoint-2"], checkpoints  # the last step exports
    for ckpt in checkpoints:
        assert (ckpt / "chat_template.jinja").read_text() == (out / "chat_template.jinja").read_text()
        tok = transformers.AutoTokenizer.from_pretrained(ckpt)
        assert tok.apply_chat_template(MESSAGES, tokenize=False) == want, ckpt


def test_model_card_has_front_matter_and_the_runs_facts(run):
    yaml = pytest.importorskip("yaml")
    card = (run["out"] / "README.md").read_text()
    m = re.match(r"---\n(.*?)\n---\n", card, re.S)
    assert m, card[:400]
    meta = yaml.safe_load(m.group(1))
    assert meta["library_name"] == "transformers"
    assert meta["base_model"] == "model"  # a local directory: named by its directory
    assert "offloadd" in meta["tags"] and meta["datasets"] == ["chat.jsonl"]
    try:
        from huggingface_hub import ModelCard
    except ImportError:
        ModelCard = None
    if ModelCard is not None:
        assert ModelCard.load(run["out"] / "README.md").data.library_name == "transformers"
    final_loss = run["stats"][-1]["loss"]
    evals = [r for r in run["all"] if "eval_loss" in r]
    for want in ("- learning_rate: 0.001\n", "- train_batch_size: 2\n", f"- Steps: {STEPS}\n",
                 f"- Final training loss: {final_loss:.4f}\n", "- seed: 3\n", "- offloadd "):
        assert want in card, (want, card)
    assert evals and evals[-1]["step"] == STEPS, run["all"]
    assert f"- Evaluation loss: {evals[-1]['eval_loss']:.4f}\n" in card, (evals[-1], card)


def test_trace_is_kept_out_of_the_model_directory(run):
    out = run["out"]
    assert not (out / "trace.json").exists()
    assert json.loads((out / "runs" / "trace.json").read_text())
