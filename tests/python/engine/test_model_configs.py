"""The family table (engine/families.cc) against transformers 5: for each family a tiny config
written by transformers' own config class, parsed by offloadd-model-info, must name exactly the
tensors (names, shapes) save_pretrained writes, count transformers' parameters, and select the
parts the modeling code runs (norm kind and placement, q/k norm, biases, attention scale, soft-
caps, sliding layers, dropout). Configs transformers would run differently are refused naming
the key."""
import json
import subprocess

import pytest
import torch
import transformers as T
from safetensors import safe_open

from engine_testlib import BINARY_DIR

TOOL = BINARY_DIR / "engine" / "offloadd-model-info"

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2)


def families():
    """(id, config, model class) for every family, with the options the engine must follow."""
    return [
        ("llama_bias", T.LlamaConfig(**BASE, attention_bias=True, mlp_bias=True, head_dim=16), None),
        ("llama3_tied", T.LlamaConfig(**BASE, tie_word_embeddings=True, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=64), max_position_embeddings=512), None),
        ("mistral", T.MistralConfig(**BASE, sliding_window=8, head_dim=16), None),
        ("qwen2_sliding", T.Qwen2Config(**BASE, use_sliding_window=True, sliding_window=8, max_window_layers=2),
         None),
        ("qwen3", T.Qwen3Config(**BASE, head_dim=16, tie_word_embeddings=True), None),
        ("qwen3_bias_sliding", T.Qwen3Config(**BASE, head_dim=8, attention_bias=True, use_sliding_window=True,
                                             sliding_window=8, max_window_layers=1), None),
        ("gemma2", T.Gemma2Config(**BASE, head_dim=16, sliding_window=8, query_pre_attn_scalar=24), None),
        ("gemma3_text", T.Gemma3TextConfig(**BASE, head_dim=16, sliding_window=8, sliding_window_pattern=2,
                                           final_logit_softcapping=15.0), None),
        ("gemma3_multimodal", T.Gemma3Config(
            text_config=dict(**BASE, head_dim=16, sliding_window=8),
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14),
            mm_tokens_per_image=4, image_token_index=95, boi_token_index=93, eoi_token_index=94),
         T.Gemma3ForConditionalGeneration),
        ("phi3", T.Phi3Config(**BASE, partial_rotary_factor=0.5, sliding_window=8, resid_pdrop=0.1,
                              pad_token_id=0, bos_token_id=1, eos_token_id=2), None),
        ("olmo2", T.Olmo2Config(**BASE, attention_bias=True, pad_token_id=0, eos_token_id=1), None),
        ("gpt2", T.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                              eos_token_id=0), None),
    ]


def need_tool():
    if not TOOL.exists():
        pytest.fail(f"{TOOL} not built (build target offloadd-model-info)")


def describe(model_dir):
    need_tool()
    r = subprocess.run([str(TOOL), "--config", str(model_dir)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def refusal(model_dir):
    need_tool()
    r = subprocess.run([str(TOOL), "--config", str(model_dir)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout
    return r.stderr


def expected_tensors(j, prefix=""):
    """{name: shape} of the language model as the parsed config names and sizes it."""
    n, h, L = j["names"], j["hidden_size"], j["num_layers"]
    q, kv, inter, d = j["num_heads"] * j["head_dim"], j["num_kv_heads"] * j["head_dim"], j["intermediate_size"], \
        j["head_dim"]
    gpt2 = j["arch"] == "gpt2"
    out = {prefix + n["embed"]: [j["vocab_size"], h], prefix + n["final_norm"]: [h]}
    if n["position_embed"]:
        out[prefix + n["position_embed"]] = [j["max_position_embeddings"], h]
    if n["final_norm_bias"]:
        out[prefix + n["final_norm_bias"]] = [h]
    if not j["tie_word_embeddings"]:
        out[n["lm_head"]] = [j["vocab_size"], h]

    def linear(name, rows, cols, bias):  # nn.Linear [out, in]; GPT-2's Conv1D [in, out]
        out[name + ".weight"] = [cols, rows] if gpt2 else [rows, cols]
        if bias:
            out[name + ".bias"] = [rows]

    for i in range(L):
        p = prefix + n["layer_prefix"] + f"{i}."
        for norm in ("input_norm", "post_attn_norm", "pre_mlp_norm", "post_mlp_norm"):
            if n[norm]:
                out[p + n[norm] + ".weight"] = [h]
                if j["norm"] == "layer":
                    out[p + n[norm] + ".bias"] = [h]
        if n["qkv"]:
            linear(p + n["qkv"], q + 2 * kv, h, j["qkv_bias"])
        else:
            linear(p + n["q"], q, h, j["qkv_bias"])
            linear(p + n["k"], kv, h, j["qkv_bias"])
            linear(p + n["v"], kv, h, j["qkv_bias"])
        linear(p + n["o"], h, q, j["o_bias"])
        if j["qk_norm"] == "per_head":
            out[p + n["q_norm"] + ".weight"] = [d]
            out[p + n["k_norm"] + ".weight"] = [d]
        elif j["qk_norm"] == "whole":
            out[p + n["q_norm"] + ".weight"] = [q]
            out[p + n["k_norm"] + ".weight"] = [kv]
        if n["gate_up"]:
            linear(p + n["gate_up"], 2 * inter, h, j["mlp_bias"])
        elif n["gate"]:
            linear(p + n["gate"], inter, h, j["mlp_bias"])
            linear(p + n["up"], inter, h, j["mlp_bias"])
        else:
            linear(p + n["up"], inter, h, j["mlp_bias"])
        linear(p + n["down"], h, inter, j["mlp_bias"])
    return out


@pytest.mark.parametrize("name,config,cls", families(), ids=[f[0] for f in families()])
def test_parts_and_names_match_transformers(tmp_path, name, config, cls):
    torch.manual_seed(0)
    model = cls(config) if cls else T.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path)
    j = describe(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}

    # Tensor names and shapes: save_pretrained's keys, the vision tower's passing through.
    prefix = "transformer." if name == "gpt2" else ""
    want = expected_tensors(j, prefix)
    lm = {k: v for k, v in saved.items() if not any(k.startswith(p) for p in j["names"]["passthrough_prefixes"])}
    assert lm == want
    assert model.num_parameters() == j["params"]["total"] + (
        sum(p.numel() for n, p in model.named_parameters()
            if any(n.startswith("model." + q) for q in ("vision_tower.", "multi_modal_projector."))))

    # The parts the modeling code runs.
    text = config.get_text_config()
    layers = model.model.language_model.layers if cls else (model.transformer.h if name == "gpt2" else
                                                             model.model.layers)
    assert j["num_layers"] == len(layers)
    if name == "gpt2":
        assert j["norm"] == "layer" and j["mlp"] == "gelu_mlp" and j["qkv_bias"] and j["o_bias"] and j["mlp_bias"]
        assert j["dropout"] == {"embd_pdrop": 0.1, "attn_pdrop": 0.1, "resid_pdrop": 0.1}
        return
    attn = layers[0].self_attn
    assert j["attn_scale"] == pytest.approx(attn.scaling, rel=1e-15)
    assert j["head_dim"] == attn.head_dim
    norm_cls = type(layers[0].post_attention_layernorm).__name__
    assert (j["norm"] == "rms_one_offset") == norm_cls.startswith("Gemma"), norm_cls
    assert j["norm_placement"] == ("sandwich" if hasattr(layers[0], "pre_feedforward_layernorm") else
                                   "post" if not hasattr(layers[0], "input_layernorm") else "pre")
    act = getattr(text, "hidden_activation", None) or text.hidden_act
    assert j["hidden_act"] == act
    assert j["mlp"] == ("geglu_tanh" if act == "gelu_pytorch_tanh" else "swiglu")
    windows = []
    for layer in layers:
        w = getattr(layer.self_attn, "sliding_window", None)
        if w is None and name in ("mistral", "phi3"):  # these read config.sliding_window in every layer
            w = text.sliding_window
        windows.append(w)
    if any(w is not None for w in windows):
        assert j["sliding"] == [w is not None for w in windows]
        assert {j["sliding_window"]} == {w for w in windows if w is not None}
    else:
        assert j["sliding"] == [] and j["sliding_window"] == 0
    assert j["attn_logit_softcap"] == (getattr(text, "attn_logit_softcapping", None) or 0)
    assert j["final_logit_softcap"] == (getattr(text, "final_logit_softcapping", None) or 0)
    assert j["scale_embeddings"] == hasattr(model.get_input_embeddings(), "embed_scale")
    assert j["tie_word_embeddings"] == (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert j["rope"]["rotary_dim"] == int(attn.head_dim * text.rope_parameters.get("partial_rotary_factor", 1.0)
                                          if name == "phi3" else attn.head_dim)
    assert {k: v for k, v in j["dropout"].items()} == ({"resid_pdrop": 0.1} if name == "phi3" else {})


def save_config(tmp_path, config_dict):
    (tmp_path / "config.json").write_text(json.dumps(config_dict))
    return tmp_path


@pytest.mark.parametrize("family,extra,needle", [
    ("gemma2", {"hidden_activation": "gelu"}, 'hidden_activation: "gelu" is not supported'),
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention: true is not supported"),
    ("llama", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}},
     'rope_parameters.rope_type: "proportional" is not supported'),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor: 0.5 is not supported"),
    ("qwen3", {"layer_types": ["full_attention"] * 3 + ["chunked_attention"]},
     'layer_types[3]: unsupported layer type "chunked_attention"'),
    ("phi3", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     'rope_parameters.rope_type: "dynamic" is not supported: phi3 takes default or longrope'),
])
def test_refusals_name_the_key_and_value(tmp_path, family, extra, needle):
    cls = {"gemma2": T.Gemma2Config, "gemma3_text": T.Gemma3TextConfig, "llama": T.LlamaConfig,
           "qwen3": T.Qwen3Config, "phi3": T.Phi3Config}[family]
    d = cls(**BASE).to_dict()
    d.update(extra)
    err = refusal(save_config(tmp_path, d))
    assert needle in err and "config.json" in err, err
