"""Parity of the C++ engine with transformers on tiny models (CPU, fp32).

Tolerances (fp32, CPU): logits and loss atol 2e-5 / rtol 1e-4; gradients atol 2e-5 / rtol 1e-3
(assert_close semantics). The engine uses the fused flash-attention CPU kernel and analytic
backward formulas, so agreement is to float rounding, not bit-exact. Save modes (keep, recompute,
offload, mixed) must agree with each other exactly (same kernels, same inputs).
"""
import json

import pytest
import torch
import transformers
from safetensors import safe_open

from engine_testlib import hf_reference, make_batch, run_check, write_inputs

LOGIT_TOL = dict(atol=2e-5, rtol=1e-4)
GRAD_TOL = dict(atol=2e-5, rtol=1e-3)


def tiny_llama(tmp_path, **kw):
    cfg = dict(vocab_size=96, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               rms_norm_eps=1e-5, tie_word_embeddings=False,
               rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 16})
    cfg.update(kw)
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg, attn_implementation="eager"))
    d = tmp_path / "llama"
    model.save_pretrained(d)
    return model, d


def tiny_qwen2(tmp_path):
    torch.manual_seed(2)
    cfg = transformers.Qwen2Config(vocab_size=80, hidden_size=48, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                                   max_position_embeddings=64, tie_word_embeddings=True,
                                   attn_implementation="eager")
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # biases start at zero; make them matter
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0, 0.5)
    d = tmp_path / "qwen2"
    model.save_pretrained(d)
    return model, d


def tiny_gpt2(tmp_path):
    torch.manual_seed(3)
    cfg = transformers.GPT2Config(vocab_size=72, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                  attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(cfg)
    d = tmp_path / "gpt2"
    model.save_pretrained(d)
    return model, d


MODELS = {"llama_gqa": tiny_llama, "qwen2_bias_tied": tiny_qwen2, "gpt2": tiny_gpt2}


@pytest.fixture(params=list(MODELS))
def model_and_dir(request, tmp_path):
    return MODELS[request.param](tmp_path)


def compare(ours, logits, loss, grads):
    torch.testing.assert_close(ours["logits"], logits, **LOGIT_TOL)
    torch.testing.assert_close(ours["loss"], loss, **LOGIT_TOL)
    names = {k[len("grad/"):] for k in ours if k.startswith("grad/")}
    assert names == set(grads), f"gradient names differ: {names ^ set(grads)}"
    for n, g in grads.items():
        torch.testing.assert_close(ours["grad/" + n], g, **GRAD_TOL, msg=lambda m: f"{n}: {m}")


def test_logits_loss_grads_match_transformers(model_and_dir, tmp_path):
    model, d = model_and_dir
    ids, labels = make_batch(model.config.vocab_size)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    ours = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors")
    compare(ours, *hf_reference(model, ids, labels))


def test_micro_batches_normalise_over_the_whole_step(model_and_dir, tmp_path):
    """Two micro-batches with the step's token count give the full batch's mean-loss gradients."""
    model, d = model_and_dir
    ids, labels = make_batch(model.config.vocab_size, seed=5)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    ours = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors",
                     "--micro-batches", 2)
    compare(ours, *hf_reference(model, ids, labels))


def test_save_modes_give_identical_gradients(model_and_dir, tmp_path):
    model, d = model_and_dir
    ids, labels = make_batch(model.config.vocab_size, seed=7)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    results = {m: run_check(d, tmp_path / "in.safetensors", tmp_path / f"{m}.safetensors", "--mode", m)
               for m in ("keep", "recompute", "offload", "mixed")}
    base = results["keep"]
    for mode, r in results.items():
        assert set(r) == set(base)
        for k in base:
            assert torch.equal(r[k], base[k]), f"{mode}: {k} differs from keep"


def test_position_ids_reset(tmp_path):
    """Per-document position reset (packing) only changes rotary phases; matches transformers."""
    model, d = tiny_llama(tmp_path)
    ids, labels = make_batch(model.config.vocab_size, seed=9)
    pos = torch.cat([torch.arange(5), torch.arange(7)]).expand(ids.shape[0], -1).contiguous()
    write_inputs(tmp_path / "in.safetensors", ids, labels, pos)
    ours = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors")
    compare(ours, *hf_reference(model, ids, labels, position_ids=pos))


def tensor_layout(d):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            for k in s.keys():
                out[k] = (f.name, s.get_slice(k).get_dtype(), tuple(s.get_slice(k).get_shape()))
    return out


def test_export_reloads_in_transformers(model_and_dir, tmp_path):
    """After an SGD step, the exported directory loads in transformers with our logits, and keeps
    the input's tensor names, dtypes and shapes (tied weights stay tied / absent)."""
    model, d = model_and_dir
    ids, labels = make_batch(model.config.vocab_size, seed=11)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    out_dir = tmp_path / "exported"
    ours = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors",
                     "--sgd-lr", "0.5", "--export", out_dir)
    assert tensor_layout(out_dir) == tensor_layout(d)
    assert json.loads((out_dir / "config.json").read_text()) == json.loads((d / "config.json").read_text())
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager")
    reloaded.eval()
    with torch.no_grad():
        logits = reloaded(input_ids=ids).logits
        before = model(input_ids=ids).logits
    torch.testing.assert_close(ours["logits_after"], logits, **LOGIT_TOL)
    assert (logits - before).abs().max() > 1e-3, "the update did not change the model"


def test_sharded_checkpoint_round_trip(tmp_path):
    model, _ = tiny_llama(tmp_path, tie_word_embeddings=True)
    d = tmp_path / "sharded"
    model.save_pretrained(d, max_shard_size="20KB")
    assert (d / "model.safetensors.index.json").exists()
    ids, labels = make_batch(model.config.vocab_size, seed=13)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    out_dir = tmp_path / "exported"
    ours = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors",
                     "--export", out_dir, "--sgd-lr", "0")
    compare(ours, *hf_reference(model, ids, labels))
    assert tensor_layout(out_dir) == tensor_layout(d)
    idx_in = json.loads((d / "model.safetensors.index.json").read_text())
    idx_out = json.loads((out_dir / "model.safetensors.index.json").read_text())
    assert idx_in["weight_map"] == idx_out["weight_map"]


def test_bf16_checkpoint_loads_as_fp32(tmp_path):
    model, _ = tiny_llama(tmp_path)
    model = model.to(torch.bfloat16)
    d = tmp_path / "bf16"
    model.save_pretrained(d)
    ids, labels = make_batch(model.config.vocab_size, seed=15)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    ours = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors")
    ref = model.float()
    compare(ours, *hf_reference(ref, ids, labels))


@pytest.mark.parametrize("patch,needle", [
    ({"model_type": "deepseek_v3"}, "unsupported model type \"deepseek_v3\""),
    ({"architectures": ["MixtralForCausalLM"]}, "MixtralForCausalLM"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 10000.0}}, "proportional"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_unsupported_config_is_rejected_by_name(tmp_path, patch, needle):
    _, d = tiny_llama(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(patch)
    (d / "config.json").write_text(json.dumps(cfg))
    ids, labels = make_batch(96)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    proc = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors", expect_ok=False)
    assert proc.returncode == 1
    assert needle in proc.stderr, proc.stderr


def test_out_of_range_token_is_an_error(tmp_path):
    _, d = tiny_llama(tmp_path)
    ids, labels = make_batch(96)
    ids[0, 0] = 96
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    proc = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors", expect_ok=False)
    assert proc.returncode == 1 and "token id outside" in proc.stderr, proc.stderr


# ---- GPU variants (run on the GPU machine; skipped without CUDA) --------------------------------
# bf16 on both sides (our flash-attention kernels vs transformers' sdpa): relative error of whole
# tensors ||ours - ref|| / ||ref|| below 3e-2 for logits/loss and 8e-2 for gradients (8-bit
# mantissa, different op order). fp32 on CUDA: 2e-3 (attention kernels may use TF32).
def rel_err(a, b):
    a, b = a.float().cpu(), b.float().cpu()
    return ((a - b).norm() / (b.norm() + 1e-12)).item()


# The attention flavour is forced per run (OFFLOADD_ATTENTION_KERNEL): cuDNN's fused kernel (what
# auto picks on Hopper for 16-bit inputs), FlashAttention-2 and the memory-efficient kernel each
# meet the same bounds; fp32 runs the efficient kernel whatever auto finds.
# The RMSNorm/SwiGLU flavour likewise (OFFLOADD_FUSED_KERNELS): the fused CUDA kernels and the
# ATen op sequences meet the same bounds (GPT-2 has neither op, so it checks only that the variable
# is accepted).
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype,kernel,fused", [
    ("bf16", "auto", "auto"), ("bf16", "cudnn", "fused"), ("bf16", "cudnn", "aten"),
    ("bf16", "flash", "auto"), ("bf16", "efficient", "auto"), ("f32", "auto", "fused"),
    ("f32", "auto", "aten")])
def test_gpu_matches_transformers(model_and_dir, tmp_path, dtype, kernel, fused, monkeypatch):
    model, d = model_and_dir
    if kernel == "cudnn" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("cuDNN attention is used from compute capability 9.0")
    monkeypatch.setenv("OFFLOADD_ATTENTION_KERNEL", kernel)
    monkeypatch.setenv("OFFLOADD_FUSED_KERNELS", fused)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    ids, labels = make_batch(model.config.vocab_size, batch=4, seq=32, seed=21)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    ours = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors",
                     "--device", "cuda", "--dtype", dtype)
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="sdpa",
                                                            dtype=tdtype).cuda()
    logits, loss, grads = hf_reference(ref, ids.cuda(), labels.cuda())
    tol, gtol = (3e-2, 8e-2) if dtype == "bf16" else (2e-3, 2e-3)
    assert rel_err(ours["logits"], logits) < tol
    assert rel_err(ours["loss"], loss) < tol
    for n, g in grads.items():
        assert rel_err(ours["grad/" + n], g) < gtol, n


def test_unknown_attention_kernel_is_refused(model_and_dir, tmp_path, monkeypatch):
    """Checked on every device (a CPU run refuses it too), so a typo never goes unnoticed."""
    model, d = model_and_dir
    monkeypatch.setenv("OFFLOADD_ATTENTION_KERNEL", "fa9")
    ids, labels = make_batch(model.config.vocab_size, batch=2, seq=8, seed=1)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    r = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors", expect_ok=False)
    assert r.returncode != 0
    assert "OFFLOADD_ATTENTION_KERNEL must be auto, cudnn, flash or efficient, got 'fa9'" in r.stderr, r.stderr


@pytest.mark.parametrize("value,needle", [
    ("fastest", "OFFLOADD_FUSED_KERNELS must be auto, fused or aten, got 'fastest'"),
    ("fused", None)])
def test_fused_kernel_flavour_is_checked(tmp_path, monkeypatch, value, needle):
    """A typo is refused everywhere; forcing the fused kernels where they cannot run (CPU) is an
    error naming why, never a silent fallback to ATen."""
    _, d = tiny_llama(tmp_path)
    monkeypatch.setenv("OFFLOADD_FUSED_KERNELS", value)
    ids, labels = make_batch(96, batch=2, seq=8, seed=1)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    r = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors", expect_ok=False)
    assert r.returncode != 0
    assert (needle or "fused kernels forced: RMSNorm needs") in r.stderr, r.stderr


def test_packed_documents_do_not_attend_across_segments(model_and_dir, tmp_path):
    """segment_ids + per-document positions == transformers with the block-diagonal causal mask."""
    model, d = model_and_dir
    ids, labels = make_batch(model.config.vocab_size, seed=17)
    b, t = ids.shape
    seg = torch.zeros(b, t, dtype=torch.long)
    seg[:, 5:] = 1
    seg[0, 9:] = 2
    pos = torch.zeros_like(seg)
    for r in range(b):
        for c in range(1, t):
            pos[r, c] = 0 if seg[r, c] != seg[r, c - 1] else pos[r, c - 1] + 1
    allowed = (seg[:, :, None] == seg[:, None, :]) & torch.ones(t, t, dtype=torch.bool).tril()
    mask = torch.zeros(b, 1, t, t).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    t_in = {"input_ids": ids, "labels": labels, "position_ids": pos, "segment_ids": seg}
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in t_in.items()}, str(tmp_path / "in.safetensors"))
    ours = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors", "--mode", "mixed")
    model.eval()
    model.zero_grad()
    out = model(input_ids=ids, labels=labels, position_ids=pos, attention_mask=mask)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    compare(ours, out.logits.detach(), out.loss.detach(), grads)
    # And the mask matters: without segments the result differs.
    plain = run_check(d, tmp_path / "in.safetensors", tmp_path / "plain.safetensors")
    assert torch.equal(plain["logits"], ours["logits"])  # same inputs file -> same segments
    save_file({"input_ids": ids, "labels": labels, "position_ids": pos}, str(tmp_path / "noseg.safetensors"))
    noseg = run_check(d, tmp_path / "noseg.safetensors", tmp_path / "noseg_out.safetensors")
    assert (noseg["logits"] - ours["logits"]).abs().max() > 1e-3


VARIANTS = {
    # Llama with attention_bias (q/k/v and o biases), tied embeddings, linear rope scaling, head_dim
    # different from hidden/heads.
    "llama_attn_bias_linear_rope": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=12, attention_bias=True, tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0},
        attn_implementation="eager")),
    # Mistral (same block math; sliding window longer than the sequence).
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=64, attn_implementation="eager")),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_config_variants_match_transformers(name, tmp_path):
    torch.manual_seed(4)
    model = VARIANTS[name]()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(tmp_path / name)
    ids, labels = make_batch(model.config.vocab_size, seed=23)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    ours = run_check(tmp_path / name, tmp_path / "in.safetensors", tmp_path / "out.safetensors")
    compare(ours, *hf_reference(model, ids, labels))


def test_gpt2_hub_layout_with_mask_buffers(tmp_path):
    """openai-community/gpt2's model.safetensors has no "transformer." prefix and carries the
    causal-mask buffers h.N.attn.bias; both load, and export writes the same tensors back."""
    from safetensors.torch import load_file, save_file
    model, d = tiny_gpt2(tmp_path)
    sd = load_file(str(d / "model.safetensors"))
    hub = {k[len("transformer."):]: v for k, v in sd.items()}
    n_pos = model.config.n_positions
    for i in range(model.config.n_layer):
        hub[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n_pos, n_pos)).view(1, 1, n_pos, n_pos)
    save_file(hub, str(d / "model.safetensors"), metadata={"format": "pt"})
    ids, labels = make_batch(model.config.vocab_size, seed=29)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    out_dir = tmp_path / "exported"
    ours = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors",
                     "--sgd-lr", "0.5", "--export", out_dir)
    logits, loss, grads = hf_reference(model, ids, labels)
    compare(ours, logits, loss, {k.removeprefix("transformer."): g for k, g in grads.items()})
    assert tensor_layout(out_dir) == tensor_layout(d)
    exported = load_file(str(out_dir / "model.safetensors"))
    assert torch.equal(exported["h.0.attn.bias"], hub["h.0.attn.bias"])
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager")
    reloaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours["logits_after"], reloaded(input_ids=ids).logits, **LOGIT_TOL)
