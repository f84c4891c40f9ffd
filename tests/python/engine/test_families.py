"""Every supported family trains as transformers does (CPU, fp32).

For each variant (llama 3.x with attention_bias, mlp_bias and llama3 RoPE; mistral with a sliding
window of 16 on 40-64-token sequences; qwen2 tied and untied; qwen3 (head_dim 16 != hidden/heads,
q/k norm, tied); gemma2 (sandwich norms, soft caps 2 and 3, query_pre_attn_scalar 24, alternating
sliding window 16); gemma3_text (q/k norm, local/global RoPE with linear scaling on the global
layers); Gemma3ForConditionalGeneration's text half (language_model.* keys, a tiny SigLIP tower);
phi3 (partial_rotary_factor 0.5, longrope); olmo2 (post-norm, q/k norm over the projection); gpt2)
a tiny random-init model is built with transformers' own config class (fp32, seeded; norm weights
and biases perturbed off their init), saved, and trained for 8 steps by offloadd-train on the CPU
and by transformers (float64) + torch.optim.AdamW + clip_grad_norm_ + transformers' cosine schedule
on the batches offloadd-train dumped (families_testlib.run_reference).

Data: Alpaca records tokenized with the family's real tokenizer from ../shared/data and its chat
template (transformers' apply_chat_template; prompt tokens masked): llama3.1 (Llama), mistral-7b-
v0.3 (Mistral), qwen3 (Qwen2.5 and Qwen3: the same 151,643-token BPE), phi3-mini (Phi-3), gpt2
(GPT-2, no template: "instruction\\n\\nresponse"). Gemma (256k-262k vocabulary; only Gemma 3's
template is in ../shared) and OLMo 2 (its dolma2 tokenizer is not in ../shared) use a synthetic
512-token byte-level BPE trained on Alpaca text. Tokenisation is not under test here
(tests/python/text and tests/python/trainer/test_hf_crosscheck.py cover it): the records go in as
pretokenized lines, so every family sees real token statistics on the same code path.

Bounds, with w0 the initial tensor, w_ref transformers' after 8 steps and w_off offloadd's export:
  * per-step loss: |loss_off - loss_ref| <= 1e-5 * |loss_ref| (a mean of ~200 token losses in
    fp32; measured ~1e-7).
  * weights, per tensor ("within 1e-3 of the tensor's own update"), in two norms, both asserted:
    Frobenius |w_off - w_ref|_2 <= 1e-3 * |w_ref - w0|_2, and max-norm max_i |w_off[i] - w_ref[i]|
    <= 1e-3 * max_i |w_ref[i] - w0[i]|. Adam normalises each element's update to ~lr, so an element
    whose gradient is near zero carries its gradient's fp32 rounding into the update magnified;
    test_hf_crosscheck.py measured <= 3.1e-4 on the largest tensors in the max norm. The reference
    is transformers in float64 (model, AdamW and loss): against transformers' own fp32 run the
    max-norm error of a 4.9M-element lm_head reached 2.2e-3, transformers' fp32 rounding, not
    offloadd's (offloadd against float64: 1.7e-4).
  * embedding tables (and a tied head): max_i |w_off[i] - w_ref[i]| <= 1e-3 absolute: rows seen
    once or twice get their update from one or two such normalised gradients (update <= lr *
    steps = 2.4e-2).
  * export: the same tensor names, shapes and dtypes as the input checkpoint; tensors outside the
    language model (Gemma 3's vision tower and projector) bitwise unchanged; the directory loads
    with AutoModelForCausalLM and its greedy generation (generate(), 8 new tokens, KV cache)
    equals the engine's greedy ids on the exported model (offloadd-engine-check --generate, no
    cache) token for token.
Measured (2026-11-28, the 2-core dev machine shared with six builds, load average 8-10): all 11
variants pass in 140-164 s for the whole file (two runs; the 128k-152k vocabularies take 25-30 s, the
synthetic-vocabulary ones 2-5 s); worst loss error 1.2e-7 relative; worst weight error 3.9e-4 of
the update in the max norm and 2.9e-4 in the Frobenius norm (Llama's k_proj.bias); embeddings
<= 8.1e-5 absolute; greedy ids equal for every variant. Per-variant figures print with -s.
"""

import json
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from engine_testlib import CHECK, need_check_binary
from families_testlib import (EMBEDDINGS, SEQ, VARIANTS, build_variant, checkpoint_layout,
                              load_checkpoint, reference_model, run_reference, state_as_checkpoint,
                              write_data)
from pipeline_testlib import read_stats, run_train

STEPS = 8
BATCH, ACCUM = 2, 2
OPTIM = dict(lr=3e-3, weight_decay=0.1, max_grad_norm=0.5, scheduler="cosine", warmup_steps=2)
GENERATE = 8


def train_args(model, data, out):
    return [f"--model={model}", f"--data={data}", "--format=pretokenized", f"--max-seq-length={SEQ}",
            "--dtype=fp32", "--device=cpu", f"--batch-size={BATCH}", f"--grad-accum={ACCUM}",
            f"--max-steps={STEPS}", f"--lr={OPTIM['lr']}", f"--weight-decay={OPTIM['weight_decay']}",
            f"--max-grad-norm={OPTIM['max_grad_norm']}", f"--scheduler={OPTIM['scheduler']}",
            f"--warmup-steps={OPTIM['warmup_steps']}", "--seed=5", "--workers=1x2",
            f"--output-dir={out}", f"--stats-jsonl={out}/stats.jsonl", f"--dump-batches={out}/batches.json"]


def compare_weights(got: dict, want: dict, init: dict, adam_bound: dict | None = None) -> dict:
    """The bounds of the module doc; returns the worst ratios seen. With `adam_bound` ({name:
    per-element bound}, test_moe.py's moe_testlib.AdamErrorBound) an element's max-norm bound is
    the larger of 1e-3 of its tensor's update and that bound, and the Frobenius bound applies to
    what each element's error exceeds its AdamW bound by."""
    worst = {"rel": 0.0, "rel_name": "", "embed_abs": 0.0, "fro": 0.0, "fro_name": "", "adam": 0,
             "adam_ratio": 0.0}
    for name, w in want.items():
        if name not in init:  # e.g. a tied lm_head transformers did not save
            continue
        if name not in got:
            raise AssertionError(f"{name} missing from the exported model")
        g, w, w0 = got[name].double(), w.double(), init[name].double()
        diff = (g - w).abs().max().item()
        moved = (w - w0).abs().max().item()
        if moved == 0:  # untrained (a vision tower): must be untouched
            assert torch.equal(got[name], init[name]), f"{name} changed but transformers left it"
            continue
        bound = adam_bound.get(name) if adam_bound is not None else None
        excess = (g - w).abs() if bound is None else ((g - w).abs() - bound.double()).clamp_min(0)
        fro = excess.norm().item() / (w - w0).norm().item()
        assert fro <= 1e-3, f"{name}: |w_off - w_ref| = {fro:.3g} x |w_ref - w0| (Frobenius)"
        if fro > worst["fro"]:
            worst["fro"], worst["fro_name"] = fro, name
        if name in EMBEDDINGS:
            assert diff <= 1e-3, f"{name}: max |diff| {diff:.3g} > 1e-3 (update up to {moved:.3g})"
            worst["embed_abs"] = max(worst["embed_abs"], diff)
        elif bound is not None:
            bound = bound.double()
            ratio = ((g - w).abs() / bound.clamp_min(1e-3 * moved)).flatten()
            i = int(ratio.argmax())
            assert ratio[i] <= 1, (f"{name}: |diff| {(g - w).abs().flatten()[i]:.3g} at element {i} > "
                                   f"max(1e-3 * update {moved:.3g}, AdamW bound {bound.flatten()[i]:.3g})")
            worst["adam"] += int((bound > 1e-3 * moved).sum())
            worst["adam_ratio"] = max(worst["adam_ratio"], ratio[i].item())
            if diff / moved > worst["rel"]:
                worst["rel"], worst["rel_name"] = diff / moved, name
        else:
            assert diff <= 1e-3 * moved, f"{name}: max |diff| {diff:.3g} > 1e-3 * update {moved:.3g}"
            if diff / moved > worst["rel"]:
                worst["rel"], worst["rel_name"] = diff / moved, name
    return worst


def engine_generate(model_dir, prompt: list[int], n: int, tmp) -> list[int]:
    need_check_binary()
    out = tmp / "generated.safetensors"
    cmd = [str(CHECK), "--model", str(model_dir), "--out", str(out), "--generate", str(n),
           "--prompt", ",".join(map(str, prompt))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return load_file(str(out))["generated"].tolist()


def check_generation(out, prompt: list[int], tmp) -> list[int]:
    """transformers' generate() on the exported directory (KV cache, its own sliding-window cache)
    against the engine's greedy decoding of the same directory."""
    model = reference_model(out)
    model.eval()
    with torch.no_grad():
        gen = model.generate(torch.tensor([prompt]), max_new_tokens=GENERATE, do_sample=False,
                             eos_token_id=None, pad_token_id=0, use_cache=True)[0].tolist()
    assert len(gen) == len(prompt) + GENERATE, f"generate stopped early: {gen}"
    ours = engine_generate(out, prompt, GENERATE, tmp)
    assert ours == gen, f"greedy ids differ:\n transformers {gen[len(prompt):]}\n offloadd     {ours[len(prompt):]}"
    return gen[len(prompt):]


@pytest.mark.parametrize("variant", VARIANTS)
def test_family_matches_transformers(binary_dir, shared_dir, tmp_path, variant):
    t0 = time.monotonic()
    model, tok = build_variant(variant, shared_dir, tmp_path / "model", seed=VARIANTS.index(variant))
    data = write_data(variant, model, shared_dir, tmp_path / "data.jsonl", n=BATCH * ACCUM * STEPS,
                      seed=17 + VARIANTS.index(variant))
    out = tmp_path / "out"
    out.mkdir()
    run_train(binary_dir, train_args(model, data, out))
    stats = read_stats(out / "stats.jsonl")
    assert [s["step"] for s in stats] == list(range(1, STEPS + 1))
    batches = json.loads((out / "batches.json").read_text())
    t_off = time.monotonic() - t0

    # The export keeps the checkpoint's layout: names, shapes, dtypes.
    want_layout, got_layout = checkpoint_layout(model), checkpoint_layout(out)
    assert set(got_layout) == set(want_layout), \
        f"exported names differ: missing {sorted(set(want_layout) - set(got_layout))[:5]}, " \
        f"extra {sorted(set(got_layout) - set(want_layout))[:5]}"
    for k, v in want_layout.items():
        assert got_layout[k] == v, f"{k}: exported {got_layout[k]}, checkpoint {v}"

    init = load_checkpoint(model)
    ref = reference_model(model, torch.float64)
    ref_losses = run_reference(ref, batches, **OPTIM)
    ours = [s["loss"] for s in stats]
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, ref_losses)]
    for step, (a, b, r) in enumerate(zip(ours, ref_losses, rel), 1):
        assert r <= 1e-5, f"step {step}: offloadd {a} vs transformers {b} (relative {r:.3g})"
    assert any(s["grad_norm"] > OPTIM["max_grad_norm"] for s in stats), "clipping never active"
    want = state_as_checkpoint(ref, tmp_path / "ref")
    worst = compare_weights(load_checkpoint(out), want, init)
    t_ref = time.monotonic() - t0 - t_off

    prompt = json.loads(data.read_text().splitlines()[0])["input_ids"][:24]
    new = check_generation(out, prompt, tmp_path)
    print(f"\n{variant} [{tok['name']}]: loss rel max {max(rel):.2g}; weights max diff/update "
          f"{worst['rel']:.2g} ({worst['rel_name']}), Frobenius {worst['fro']:.2g} ({worst['fro_name']}); "
          f"embeddings max abs {worst['embed_abs']:.2g}; "
          f"greedy ids equal {new}; offloadd {t_off:.1f} s, reference+checks "
          f"{time.monotonic() - t0 - t_off:.1f} s (reference {t_ref:.1f} s)")


def test_pad_row_gradient(tmp_path):
    """transformers builds every rotary family's embedding as nn.Embedding(vocab, hidden,
    padding_idx=pad_token_id): an input occurrence of the pad id contributes nothing to that row's
    gradient. Configs whose pad id is a real token (Phi-3: pad = eos = 32000; Gemma: pad 0; many
    fine-tuned Llama/Qwen checkpoints set pad = eos) then train that row differently if the engine
    treats it as any other row. One forward/backward through offloadd-engine-check on a tiny
    Llama whose pad id is in the input: every gradient within the fp32 bounds of
    test_engine_parity.py (atol 2e-5, rtol 1e-3)."""
    import transformers
    from engine_testlib import hf_reference, make_batch, run_check, write_inputs
    torch.manual_seed(4)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   pad_token_id=7, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(tmp_path / "m")
    ids, labels = make_batch(96, seed=2)
    ids[:, 4] = 7  # the pad id as an input token of every row
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    ours = run_check(tmp_path / "m", tmp_path / "in.safetensors", tmp_path / "out.safetensors")
    _, _, grads = hf_reference(model, ids, labels)
    assert grads["model.embed_tokens.weight"][7].abs().max() == 0  # transformers' rule
    for n, g in grads.items():
        torch.testing.assert_close(ours["grad/" + n], g, atol=2e-5, rtol=1e-3, msg=lambda m: f"{n}: {m}")
