"""RoPE tables (engine/rope.cc) against transformers 5's rotary embedding modules, which apply
ROPE_INIT_FUNCTIONS and dynamic_rope_update: default, linear, dynamic (at and past
max_position_embeddings), llama3, yarn (with mscale, without truncation), longrope (short and long
factors, the attention factor), partial rotary (Phi-3) and Gemma 3's local/global pair.

The engine computes the inverse frequencies with transformers' own op sequence on the same device,
so they must be bit-identical; cos/sin are then the same fp32 cos/sin of the same products, scaled
by the same attention factor: also bit-identical on the same CPU kernels."""
import json
import subprocess

import pytest
import torch
import transformers as T
from safetensors.torch import load_file

from engine_testlib import BINARY_DIR

TOOL = BINARY_DIR / "engine" / "offloadd-model-info"
SMALL = dict(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=32)


def cases():
    yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8)
    longrope = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0 + i / 7 for i in range(16)],
                    long_factor=[1.5 + i for i in range(16)])
    return [
        ("default", T.LlamaConfig(**SMALL, rope_parameters=dict(rope_type="default", rope_theta=500000.0)), 20),
        ("linear", T.LlamaConfig(**SMALL, rope_parameters=dict(rope_type="linear", rope_theta=10000.0,
                                                               factor=2.5)), 20),
        ("dynamic_within", T.LlamaConfig(**SMALL, rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0,
                                                                       factor=3.0)), 32),
        ("dynamic_past", T.LlamaConfig(**SMALL, rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0,
                                                                     factor=3.0)), 45),
        ("llama3", T.LlamaConfig(**SMALL, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=16)), 20),
        ("yarn", T.Qwen2Config(**SMALL, rope_parameters=yarn), 40),
        ("yarn_mscale_untruncated", T.LlamaConfig(**SMALL, rope_parameters=dict(
            yarn, mscale=0.707, mscale_all_dim=1.0, truncate=False, beta_fast=16, beta_slow=2)), 20),
        ("yarn_attention_factor", T.LlamaConfig(**SMALL, rope_parameters=dict(yarn, attention_factor=1.25)), 20),
        ("longrope_short", T.Phi3Config(**SMALL, original_max_position_embeddings=16, rope_parameters=longrope,
                                        pad_token_id=0), 16),
        ("longrope_long", T.Phi3Config(**SMALL, original_max_position_embeddings=16, rope_parameters=longrope,
                                       pad_token_id=0), 30),
        ("phi3_partial", T.Phi3Config(**SMALL, partial_rotary_factor=0.75, pad_token_id=0), 20),
        ("gemma3", T.Gemma3TextConfig(**SMALL, head_dim=32, layer_types=["sliding_attention", "full_attention"],
                                      rope_parameters={
            "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
            "sliding_attention": dict(rope_type="default", rope_theta=1e4)}), 24),
        ("gemma2", T.Gemma2Config(**SMALL, head_dim=32), 24),
    ]


def transformers_tables(config, positions, layer_type=None):
    """cos, sin and inv_freq of the family's own rotary module, as its model's forward calls it."""
    model_cls = {"llama": T.models.llama.modeling_llama.LlamaRotaryEmbedding,
                 "qwen2": T.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding,
                 "phi3": T.models.phi3.modeling_phi3.Phi3RotaryEmbedding,
                 "gemma2": T.models.gemma2.modeling_gemma2.Gemma2RotaryEmbedding,
                 "gemma3_text": T.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding}[config.model_type]
    rotary = model_cls(config)
    x = torch.zeros(1, positions.shape[1], 8)
    if layer_type is None:
        cos, sin = rotary(x, positions)
        inv_freq = rotary.inv_freq
    else:
        cos, sin = rotary(x, positions, layer_type)
        inv_freq = getattr(rotary, f"{layer_type}_inv_freq")
    return cos, sin, inv_freq


@pytest.mark.parametrize("name,config,length", cases(), ids=[c[0] for c in cases()])
def test_tables_equal_transformers(tmp_path, name, config, length):
    if not TOOL.exists():
        pytest.fail(f"{TOOL} not built (build target offloadd-model-info)")
    config.save_pretrained(tmp_path)
    positions = torch.arange(length).unsqueeze(0)
    out = tmp_path / "rope.safetensors"
    r = subprocess.run([str(TOOL), "--rope", str(tmp_path), "--positions", ",".join(map(str, range(length))),
                        "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = load_file(str(out))
    layer_types = [("", "full_attention"), ("local/", "sliding_attention")] if name == "gemma3" else [("", None)]
    for prefix, layer_type in layer_types:
        cos, sin, inv_freq = transformers_tables(config, positions, layer_type)
        assert torch.equal(got[prefix + "inv_freq"], inv_freq.float()), (prefix, got[prefix + "inv_freq"], inv_freq)
        assert got[prefix + "cos"].shape == cos.shape, (got[prefix + "cos"].shape, cos.shape)
        assert torch.equal(got[prefix + "cos"], cos), (cos - got[prefix + "cos"]).abs().max()
        assert torch.equal(got[prefix + "sin"], sin), (sin - got[prefix + "sin"]).abs().max()

