"""The planner prices a mixture of experts from what it is: offloadd-train --validate-only prints the
total and active parameters, the routed-expert bound, the expert weights' uploads per step, the
router's and the experts' flops and every expert's host RAM, for tiny Qwen3-MoE (a dense layer
between sparse ones) and gpt-oss models built with transformers' own config classes. Each figure
equals the hand count from the config (the total also transformers' num_parameters()); a dense model
prints none of them."""

import json

import pytest
import torch
import transformers

from pipeline_testlib import VOCAB, build_model, build_tokenizer, run_train, write_pretokenized

COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=256, eos_token_id=0, bos_token_id=0, pad_token_id=VOCAB - 1)


def qwen3_moe():
    return transformers.Qwen3MoeConfig(**COMMON, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32,
                                       num_experts=8, num_experts_per_tok=2, mlp_only_layers=[1], decoder_sparse_step=1,
                                       norm_topk_prob=True, tie_word_embeddings=True), transformers.Qwen3MoeForCausalLM


def gpt_oss():
    return transformers.GptOssConfig(**COMMON, num_hidden_layers=2, intermediate_size=32, num_local_experts=4,
                                     num_experts_per_tok=2, sliding_window=16, tie_word_embeddings=False,
                                     attention_dropout=0.0), transformers.GptOssForCausalLM


def hand_counts(c) -> dict:
    """From the config's fields alone: one expert, the sparse layers, the total and active counts."""
    h, experts, k, ff = c.hidden_size, c.num_experts if hasattr(c, "num_experts") else c.num_local_experts, \
        c.num_experts_per_tok, getattr(c, "moe_intermediate_size", c.intermediate_size)
    gpt = c.model_type == "gpt_oss"
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    attn = h * q + 2 * h * kv + q * h + 2 * h  # projections and the two norms
    attn += (q + 2 * kv + h + c.num_attention_heads) if gpt else 2 * c.head_dim  # biases and sinks / q,k norms
    expert = 3 * h * ff + (2 * ff + h if gpt else 0)
    router = experts * h + (experts if gpt else 0)
    mlp_only = set(getattr(c, "mlp_only_layers", []) or [])
    sparse = [i for i in range(c.num_hidden_layers) if i not in mlp_only]
    dense_mlp = 3 * h * c.intermediate_size
    layers = sum(attn + (router + experts * expert if i in sparse else dense_mlp) for i in range(c.num_hidden_layers))
    total = c.vocab_size * h * (1 if c.tie_word_embeddings else 2) + layers + h
    return dict(num_experts=experts, top_k=k, expert=expert, sparse_layers=len(sparse), total=total,
                active=total - len(sparse) * (experts - k) * expert, ff=ff, h=h)


def validate(binary_dir, tmp_path, model, *extra):
    data = write_pretokenized(tmp_path / "data.jsonl", n=32)
    r = run_train(binary_dir, [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cpu",
                               "--dtype=fp32", "--workers=1x1", "--max-steps=2", "--batch-size=2",
                               f"--output-dir={tmp_path / 'out'}", f"--profile-dir={tmp_path}/profiles",
                               "--validate-only", *extra])
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("valid: predicted "), r.stdout
    return json.loads(lines[1]), r.stdout


@pytest.mark.parametrize("family", [qwen3_moe, gpt_oss], ids=["qwen3_moe", "gpt_oss"])
def test_validate_only_prints_the_moe_figures_of_the_config(binary_dir, tmp_path, family):
    config, cls = family()
    model = cls(config)
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    build_tokenizer(tmp_path / "m" / "tokenizer.json")
    n = hand_counts(config)
    assert n["total"] == model.num_parameters()
    p, out = validate(binary_dir, tmp_path, tmp_path / "m")
    m = p["moe"]
    assert (m["num_experts"], m["top_k"], m["sparse_layers"]) == (n["num_experts"], n["top_k"], n["sparse_layers"])
    assert m["total_params"] == n["total"] and m["active_params"] == n["active"], (m, n)
    assert m["expert_params"] == n["expert"]
    # Priced at micro-batch 2 of the expected padded length.
    tokens = 2 * p["seq"]
    assert m["tokens"] == tokens
    assignments = tokens * n["top_k"]
    assert m["routed_experts"] == min(n["num_experts"], assignments)
    assert m["expert_rows"] == pytest.approx(assignments / m["routed_experts"], rel=1e-12)
    # The CPU device keeps its weights resident: one upload per step of the fp32 masters (4 B).
    all_experts = n["sparse_layers"] * n["num_experts"] * n["expert"]
    assert m["expert_upload_bytes"] == 4 * all_experts
    assert m["routed_upload_bytes"] == pytest.approx(4 * all_experts * m["routed_experts"] / n["num_experts"])
    assert m["router_flops"] == n["sparse_layers"] * 2 * tokens * n["h"] * n["num_experts"]
    assert m["expert_flops"] == n["sparse_layers"] * 2 * assignments * 3 * n["h"] * n["ff"]
    # fp32 compute: 16 B of arena per parameter, every expert's included; the arena holds them all.
    assert m["expert_host_bytes"] == 16 * all_experts
    assert p["predicted_host_bytes"] >= 16 * n["total"]
    line = next(x for x in out.splitlines() if x.startswith("mixture of experts: "))
    assert f"{n['total']} parameters, {n['active']} active per token" in line, line
    assert f"= {m['routed_experts']} receive tokens" in line and "s/step" in line, line
    # Priced by flops on the CPU: the experts at the rate of their own GEMM shape.
    assert "the experts' at the rate of " in p["basis"] and " expert GEMMs of " in p["basis"], p["basis"]


def test_a_dense_model_prints_no_moe_figures(binary_dir, tmp_path):
    p, out = validate(binary_dir, tmp_path, build_model(tmp_path / "m"))
    assert "moe" not in p and "mixture of experts" not in out, out
    assert p["predicted_step_seconds"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_times_a_sparse_and_a_dense_layer_and_prints_the_gpu_peak(binary_dir, tmp_path):
    """On CUDA the blocks are timed at the shape: a sparse layer for the sparse ones and, since this
    Qwen3-MoE has a dense layer too, that one for it; the MoE line carries the predicted GPU peak."""
    config, cls = qwen3_moe()
    cls(config).save_pretrained(tmp_path / "m", safe_serialization=True)
    build_tokenizer(tmp_path / "m" / "tokenizer.json")
    data = write_pretokenized(tmp_path / "data.jsonl", n=32)
    r = run_train(binary_dir, [f"--model={tmp_path / 'm'}", f"--data={data}", "--format=pretokenized",
                               "--device=cuda", "--dtype=bf16", "--workers=1x1", "--max-steps=2",
                               "--batch-size=auto:8", "--gpu-memory-limit=4GiB", f"--output-dir={tmp_path / 'out'}",
                               f"--profile-dir={tmp_path}/profiles", "--validate-only"])
    p = json.loads(r.stdout.strip().splitlines()[1])
    assert p["moe"]["total_params"] == hand_counts(config)["total"]
    assert 0 < p["predicted_gpu_bytes"] <= 4 << 30, p
    assert "a dense layer " in r.stdout + r.stderr, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("mixture of experts: "))
    assert "GPU peak " in line, line
