"""A standing cross-check of offloadd-train against transformers.

For each family (Llama; Qwen2 with tied embeddings and q/k/v biases; Mistral; GPT-2), a tiny
random-init model with a real tokenizer from ../shared/data is trained for 8 steps by
offloadd-train on the CPU in fp32, on Alpaca, messages (LIMA) and ShareGPT (Glaive tool calls)
records rendered through the chat template, packed and shuffled. The reference trains the
transformers model on the batches offloadd-train dumped, with torch.optim.AdamW, clip_grad_norm_
and transformers' scheduler, running every packed document on its own forward (from position 0,
with nothing else in its context), which is what "packing without cross-contamination" must equal.

The dump is checked to be what the reference assumes (positions restart per document, no target
across a boundary, several documents per row, all three formats present) and, for the families
whose tokenizer carries a chat template (Qwen2's ChatML, Phi-3's on Mistral), each document is
checked to equal transformers' apply_chat_template + tokenizer on its record (the other two use
offloadd's built-in template, which transformers does not have).

Bounds (the weight bounds are the per-tensor form; the elementwise form would be stricter):
  * per-step loss: |got - want| <= 1e-5 * |want|. The loss is a mean of a few hundred token losses
    evaluated in fp32 (relative rounding ~1e-7 each); measured <= 3.2e-7.
  * weights, per tensor: max |got - want| <= 1e-3 * max |want - initial|. Adam normalises every
    element's update to ~lr whatever the size of its gradient, so an element whose gradient is
    near zero (cancellation, |g| ~ 1e-3 of the tensor's typical one) carries its gradient's
    float32 rounding (~1e-6 of the tensor's scale) into the update magnified ~1e3 times. Large
    tensors (lm_head, 1M elements) hold a few such elements: measured <= 3.1e-4 (lm_head; the
    other tensors of Llama/Mistral/Qwen2 <= 6e-5, GPT-2's <= 2.5e-4).
  * token/position embedding tables: max |got - want| <= 1e-3 absolute. Rows seen once or twice
    get their whole update from one or two such normalised gradients, so the relative form is
    meaningless for them; the update itself is <= lr * steps = 2.4e-2. Measured <= 4.9e-5.
  * first-step gradients (test_first_step_gradients), read back through one invertible AdamW step:
    max |g - g64| <= 1e-5 * max |g64| per tensor against transformers in float64; measured
    <= 1.4e-6, the same as transformers' own float32 gradients (<= 1e-6). This is where a
    modelling difference would show first; the weight bounds above are loose by construction.
The exported directory then loads with AutoModelForCausalLM/AutoTokenizer and generates.
"""

import json
import subprocess

import pytest
import torch
import transformers
from safetensors.torch import load_file
from tokenizers import Tokenizer

from hf_crosscheck_lib import (build_family_model, first_step_gradients, first_user_text,
                               gradients_from_update, hf_chat_documents, packed_micro_batch_loss,
                               split_documents, write_data)
from pipeline_testlib import read_stats, reference_train, run_train

STEPS = 8
OPTIM = dict(lr=3e-3, weight_decay=0.1, max_grad_norm=0.5, scheduler="cosine", warmup_steps=2)
EMBEDDINGS = {"model.embed_tokens.weight", "transformer.wte.weight", "transformer.wpe.weight"}
CHAT_TEMPLATE_FAMILIES = ("qwen2", "mistral")  # tokenizer_config.json has a chat_template
# family -> (batch size, gradient accumulation, max sequence length, seed)
FAMILIES = {
    "llama": (2, 2, 192, 11),
    "qwen2": (2, 2, 160, 12),
    "mistral": (3, 1, 192, 13),
    "gpt2": (2, 2, 176, 14),
}


def train_args(model, data, out, *, batch, accum, seq, seed, steps=STEPS):
    return [f"--model={model}", *[f"--data={p}" for p, _ in data.values()], "--format=auto",
            "--packing", f"--max-seq-length={seq}", "--dtype=fp32", "--device=cpu",
            f"--batch-size={batch}", f"--grad-accum={accum}", f"--max-steps={steps}",
            f"--lr={OPTIM['lr']}", f"--weight-decay={OPTIM['weight_decay']}",
            f"--max-grad-norm={OPTIM['max_grad_norm']}", f"--scheduler={OPTIM['scheduler']}",
            f"--warmup-steps={OPTIM['warmup_steps']}", f"--seed={seed}", "--workers=1x2",
            f"--output-dir={out}", f"--stats-jsonl={out}/stats.jsonl"]


def check_packing(batches, tokenizer: Tokenizer, data: dict) -> list[list[int]]:
    """The dump is what the reference assumes: every document restarts at position 0 and its last
    token predicts nothing (no target across a boundary); a row's trailing padding run (positions
    continuing, not restarting) trains nothing; rows do hold several documents; and all three
    record formats made it through the chat template. Returns the documents' token ids."""
    texts, multi, ids = [], 0, []
    for step in batches:
        for m in step:
            assert m["segment_ids"], "packing must dump segment ids"
            rows = {}
            for d in split_documents(m):
                rows.setdefault(d["row"], []).append(d)
            for row in rows.values():
                if row[-1]["position_ids"][0] != 0:  # padding
                    assert all(t == -100 for t in row[-1]["targets"])
                    row = row[:-1]
                multi += len(row) > 1
                for d in row:
                    assert d["position_ids"] == list(range(len(d["input_ids"])))
                    assert d["targets"][-1] == -100
                    texts.append(tokenizer.decode(d["input_ids"], skip_special_tokens=False))
                    ids.append(d["input_ids"])
    assert multi > 0, "no row holds two documents: packing is not exercised"
    for fmt, (_, records) in data.items():
        needles = [first_user_text(fmt, r).strip()[:24] for r in records]
        assert any(n in t for n in needles for t in texts), f"no {fmt} record in the dumped batches"
    return ids


def compare_weights(exported: dict, ref: dict, init: dict, tied: bool) -> dict:
    worst = {"rel": 0.0, "embed_abs": 0.0}
    for name, want in ref.items():
        if name == "lm_head.weight" and tied:
            assert name not in exported or torch.equal(exported[name], exported["model.embed_tokens.weight"])
            continue
        assert name in exported, f"{name} missing from the exported model"
        got = exported[name]
        assert got.dtype == torch.float32 and got.shape == want.shape, name
        diff = (got - want).abs().max().item()
        moved = (want - init[name]).abs().max().item()
        assert moved > 0, f"{name} did not train"
        if name in EMBEDDINGS:
            assert diff <= 1e-3, f"{name}: max |diff| {diff:.3g} > 1e-3 (update up to {moved:.3g})"
            worst["embed_abs"] = max(worst["embed_abs"], diff)
        else:
            assert diff <= 1e-3 * moved, f"{name}: max |diff| {diff:.3g} > 1e-3 * update {moved:.3g}"
            worst["rel"] = max(worst["rel"], diff / moved)
    return worst


def check_generates(out) -> str:
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok("Give three tips for staying healthy.", return_tensors="pt")
    gen = model.generate(**enc, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                         pad_token_id=model.config.eos_token_id)
    assert gen.shape[1] == enc["input_ids"].shape[1] + 4
    return tok.decode(gen[0, enc["input_ids"].shape[1]:])


@pytest.fixture(scope="module")
def jobs(shared_dir, tmp_path_factory):
    """family -> (model directory, data files), built once per module."""
    made = {}

    def get(family):
        if family not in made:
            root = tmp_path_factory.mktemp(family)
            model = build_family_model(family, shared_dir / "data" / "tokenizers", root / "model")
            made[family] = (model, write_data(shared_dir / "data", root / "data", FAMILIES[family][3]))
        return made[family]
    return get


@pytest.mark.parametrize("family", list(FAMILIES))
def test_matches_transformers(binary_dir, jobs, tmp_path, family):
    batch, accum, seq, seed = FAMILIES[family]
    model, data = jobs(family)
    out = tmp_path / "out"
    out.mkdir()
    args = train_args(model, data, out, batch=batch, accum=accum, seq=seq, seed=seed)
    run_train(binary_dir, args + [f"--dump-batches={out}/batches.json"])
    stats = read_stats(out / "stats.jsonl")
    assert [s["step"] for s in stats] == list(range(1, STEPS + 1))
    batches = json.loads((out / "batches.json").read_text())
    docs = check_packing(batches, Tokenizer.from_file(str(model / "tokenizer.json")), data)
    if family in CHAT_TEMPLATE_FAMILIES:  # the others use offloadd's built-in template
        want = hf_chat_documents(model, data)
        for d in docs:  # a document is a record's tokens, cut at max_seq_length
            assert any(w[:len(d)] == d for w in want), \
                f"document not tokenized as transformers' apply_chat_template: {d[:40]}"

    init = load_file(model / "model.safetensors")
    ref_losses, ref_state = reference_train(model, batches, loss_fn=packed_micro_batch_loss, **OPTIM)
    ours = [s["loss"] for s in stats]
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, ref_losses)]
    for step, (a, b, r) in enumerate(zip(ours, ref_losses, rel), 1):
        assert r <= 1e-5, f"step {step}: offloadd {a} vs transformers {b} (relative {r:.3g})"
    assert any(s["grad_norm"] > OPTIM["max_grad_norm"] for s in stats), "clipping never active"
    tied = family in ("qwen2", "gpt2")
    if "model.embed_tokens.weight" in init and tied:
        init["lm_head.weight"] = init["model.embed_tokens.weight"]
    worst = compare_weights(load_file(out / "model.safetensors"), ref_state, init, tied)
    text = check_generates(out)
    print(f"\n{family}: loss rel max {max(rel):.3g}, weights max diff/update {worst['rel']:.3g}, "
          f"embeddings max abs {worst['embed_abs']:.3g}; generates {text!r}")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_first_step_gradients(binary_dir, jobs, tmp_path, family):
    """A sharper view than the weights after 8 Adam steps (where Adam's per-element normalisation
    magnifies rounding in near-zero gradients): offloadd's gradients of the first step, read back
    through one invertible AdamW step, against transformers' in float64. Bound per tensor:
    max |g - g64| <= 1e-5 * max |g64|; float32 forward/backward over a few hundred tokens gives
    ~1e-6 (transformers' own float32 gradients, printed alongside, measure the same)."""
    batch, accum, seq, seed = FAMILIES[family]
    model, data = jobs(family)
    out = tmp_path / "out"
    out.mkdir()
    lr = 1e4
    args = train_args(model, data, out, batch=batch, accum=accum, seq=seq, seed=seed, steps=1)
    args = [a for a in args if not a.startswith(("--lr=", "--weight-decay=", "--max-grad-norm=",
                                                  "--scheduler=", "--warmup-steps="))]
    run_train(binary_dir, args + [f"--lr={lr}", "--eps=1", "--weight-decay=0", "--max-grad-norm=0",
                                  "--scheduler=constant", f"--dump-batches={out}/batches.json"])
    step = json.loads((out / "batches.json").read_text())[0]
    init = load_file(model / "model.safetensors")
    exported = load_file(out / "model.safetensors")
    if family in ("qwen2", "gpt2"):
        exported.pop("lm_head.weight", None)
    ours = gradients_from_update(init, exported, lr)
    want = first_step_gradients(model, step, torch.float64)
    hf32 = first_step_gradients(model, step, torch.float32)
    worst, worst_hf = 0.0, 0.0
    for name, g64 in want.items():
        scale = g64.abs().max().item()
        assert scale > 0, f"{name} has no gradient"
        err = (ours[name] - g64).abs().max().item() / scale
        assert err <= 1e-5, f"{name}: max |g - g64| = {err:.3g} * max |g64|"
        worst = max(worst, err)
        worst_hf = max(worst_hf, (hf32[name] - g64).abs().max().item() / scale)
    print(f"\n{family}: first-step gradients vs float64: offloadd {worst:.3g}, transformers fp32 {worst_hf:.3g}")


def test_dropout_config_needs_disable(binary_dir, shared_dir, tmp_path):
    """A GPT-2 config with its stock dropout of 0.1 is refused unless the job says
    --dropout=disable (offloadd would otherwise train without the dropout HF applies)."""
    help_text = run_train(binary_dir, ["--help"]).stdout
    if "--dropout" not in help_text:
        pytest.skip("offloadd-train has no --dropout flag yet")
    model = build_family_model("gpt2", shared_dir / "data" / "tokenizers", tmp_path / "model")
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    (model / "config.json").write_text(json.dumps(cfg))
    data = write_data(shared_dir / "data", tmp_path / "data", 1)
    out = tmp_path / "out"
    out.mkdir()
    args = train_args(model, data, out, batch=1, accum=1, seq=64, seed=1, steps=1) + ["--no-export"]
    cmd = [str(binary_dir / "trainer" / "offloadd-train"), *args]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "dropout" in refused.stderr, refused.stderr
    run_train(binary_dir, args + ["--dropout=disable"])
