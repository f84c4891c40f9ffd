"""Packed documents at seq 2048 (CPU, fp32): the engine's attention within documents, which builds
no [T, T] mask (engine/doc_attention.h), against transformers' eager attention with the
block-diagonal causal mask (a Llama with grouped-query heads; a Mistral whose sliding window of 256
is shorter than its documents). Logits, loss and every parameter gradient.

Tolerances: those of test_engine_parity.py (fp32: logits atol 2e-5 / rtol 1e-4, gradients atol
2e-5 / rtol 1e-3). Both sides compute each score and softmax row alike; they differ in the order
of sums over up to 2048 tokens, ~sqrt(n) * eps * sum|terms| ~ 1e-5 relative for n = 2048, inside
rtol 1e-4 for activations and 1e-3 for the weight gradients (sums over every token).
"""
import pytest
import torch
import transformers
from safetensors.torch import save_file

from engine_testlib import run_check

LOGIT_TOL = dict(atol=2e-5, rtol=1e-4)
GRAD_TOL = dict(atol=2e-5, rtol=1e-3)
SEQ = 2048
DOCS = [700, 600, 500, 248]  # the first two are longer than one of the tiled path's query tiles


def llama(path):
    torch.manual_seed(11)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=56,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=SEQ, rms_norm_eps=1e-5,
                                   tie_word_embeddings=False, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg), None


def mistral(path):
    torch.manual_seed(12)
    cfg = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=40,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=SEQ, sliding_window=256,
                                     attn_implementation="eager")
    return transformers.MistralForCausalLM(cfg), 256


MODELS = {"llama_gqa": llama, "mistral_window_256": mistral}


def packed_batch(vocab, window):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, vocab, (1, SEQ), generator=g)
    labels = ids.clone()
    seg = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(DOCS)])[None]
    pos = torch.cat([torch.arange(n) for n in DOCS])[None]
    starts = torch.tensor([0] + DOCS[:-1]).cumsum(0)
    labels[0, starts] = -100  # no document's first token predicts across the boundary
    i = torch.arange(SEQ)
    allowed = (seg[0, :, None] == seg[0, None, :]) & (i[None, :] <= i[:, None])
    if window:
        allowed &= (i[:, None] - i[None, :]) < window
    mask = torch.zeros(1, 1, SEQ, SEQ).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return ids, labels, pos, seg, mask


@pytest.mark.parametrize("name", list(MODELS))
def test_packed_seq_2048_matches_transformers(name, tmp_path):
    model, window = MODELS[name](tmp_path)
    model.save_pretrained(tmp_path / "m")
    ids, labels, pos, seg, mask = packed_batch(model.config.vocab_size, window)
    save_file({"input_ids": ids, "labels": labels, "position_ids": pos, "segment_ids": seg},
              str(tmp_path / "in.safetensors"))
    ours = run_check(tmp_path / "m", tmp_path / "in.safetensors", tmp_path / "out.safetensors",
                     "--mode", "mixed")
    model.eval()
    model.zero_grad()
    out = model(input_ids=ids, labels=labels, position_ids=pos, attention_mask=mask)
    out.loss.backward()
    torch.testing.assert_close(ours["logits"], out.logits.detach(), **LOGIT_TOL)
    torch.testing.assert_close(ours["loss"], out.loss.detach(), **LOGIT_TOL)
    for n, p in model.named_parameters():
        torch.testing.assert_close(ours["grad/" + n], p.grad, **GRAD_TOL, msg=lambda m: f"{n}: {m}")
