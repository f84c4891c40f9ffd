"""The grouped expert GEMMs on CUDA against the per-expert loop (skips without CUDA).

A tiny Qwen3-MoE (hidden 128, 16 experts of 64, top-4, expert 0 of layer 0 never routed:
moe_testlib.force_dead_expert) runs one forward and backward through offloadd-engine-check in bf16
on the GPU, once with OFFLOADD_EXPERT_GEMM=loop and once with auto (grouped: the plan line must say
so on compute capability 9.0+, else the test skips), against the same engine in fp32 on the CPU
(the truth; its loop path equals transformers within test_moe.py's bounds).

Bound. The two paths multiply the same bf16 operands and accumulate in fp32 inside the GEMM; they
differ only in the order of that accumulation (one GEMM per expert vs one grouped kernel's tiles),
a relative difference of about K * 2^-24 (K <= 512 here: 3e-5) before the bf16 rounding of each
output (2^-9 relative). So their errors against the truth are the same bf16 roundings, and their
norms are draws of one distribution: test_families_gpu.py's bound on the ratio of two such errors,
per tensor of k elements |g_grouped - g_truth| <= (1.25 + 4 / sqrt(k)) |g_loop - g_truth|
(Frobenius), and over the whole model <= 1.25. The loss, one number: the two within 2 x 2^-8 of
each other, relative (two bf16 roundings of the logits' scale). The never-routed expert's
gradient is exactly zero on both paths, and present."""

import math

import pytest
import torch
import transformers
from safetensors.torch import load_file

from engine_testlib import make_batch, run_check, write_inputs
from moe_testlib import DEAD_EXPERT, force_dead_expert

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def build(out):
    cfg = transformers.Qwen3MoeConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                      moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=32, num_experts=16, num_experts_per_tok=4,
                                      norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=False,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=255, attention_dropout=0.0)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    force_dead_expert(model, "qwen3_moe")
    model.save_pretrained(out)
    return out


def check(model, inputs, out, monkeypatch, *extra, gemm="auto"):
    monkeypatch.setenv("OFFLOADD_EXPERT_GEMM", gemm)
    proc = run_check(model, inputs, out, *extra, expect_ok=False)
    assert proc.returncode == 0, proc.stderr
    return load_file(str(out)), proc.stderr


def test_grouped_expert_gemms_match_the_loop_on_cuda(tmp_path, monkeypatch):
    model = build(tmp_path / "m")
    ids, labels = make_batch(255, batch=4, seq=128, seed=2)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    truth, _ = check(model, tmp_path / "in.safetensors", tmp_path / "t.safetensors", monkeypatch, gemm="loop")
    gpu = ["--device", "cuda", "--dtype", "bf16"]
    loop, log_loop = check(model, tmp_path / "in.safetensors", tmp_path / "l.safetensors", monkeypatch, *gpu,
                           gemm="loop")
    grp, log_grp = check(model, tmp_path / "in.safetensors", tmp_path / "g.safetensors", monkeypatch, *gpu)
    assert "one GEMM per non-empty expert (OFFLOADD_EXPERT_GEMM=loop)" in log_loop, log_loop
    if "grouped expert GEMMs (at::_grouped_mm)" not in log_grp:
        pytest.skip(f"auto does not group on this GPU: {log_grp.strip().splitlines()[-1]}")
    loss_l, loss_g = float(loop["loss"]), float(grp["loss"])
    assert abs(loss_g - loss_l) <= 2 * 2**-8 * abs(loss_l), (loss_g, loss_l)
    err_l = err_g = 0.0
    worst = (0.0, "")
    for name in (k for k in truth if k.startswith("grad/")):
        t = truth[name].double()
        el = (loop[name].double() - t).norm().item()
        eg = (grp[name].double() - t).norm().item()
        err_l, err_g = err_l + el**2, err_g + eg**2
        k = t.numel()
        assert eg <= (1.25 + 4 / math.sqrt(k)) * el, f"{name}: grouped {eg:.3g} vs loop {el:.3g} off fp32"
        worst = max(worst, (eg / max(el, 1e-30), name))
    assert math.sqrt(err_g) <= 1.25 * math.sqrt(err_l), (math.sqrt(err_g), math.sqrt(err_l))
    print(f"\nwhole model: grouped / loop error {math.sqrt(err_g / err_l):.3f}; worst tensor {worst[1]} "
          f"{worst[0]:.3f}")
    for part in ("gate_proj", "up_proj", "down_proj"):
        name = f"grad/model.layers.0.mlp.experts.{DEAD_EXPERT}.{part}.weight"
        assert grp[name].abs().max() == 0 and loop[name].abs().max() == 0, name
