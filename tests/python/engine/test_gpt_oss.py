"""gpt-oss trains as transformers does (CPU, fp32), and loads from MXFP4.

The tiny model (transformers' GptOssConfig): hidden 64, 2 layers (layer 0 sliding with a window
of 16 on 40-64-token sequences, layer 1 full: layer_types alternate), 4 query / 2 key-value heads
of 16, attention biases and sinks, YaRN (factor 4 over 64 positions, truncate false, so the
attention scaling 1 + 0.1 ln 4 multiplies cos/sin), 4 experts of 32, top-2 with the router bias,
the clamped SwiGLU with biases, the load-balancing loss (coefficient 0.05); the gpt-oss tokenizer.
Biases and sinks are perturbed off their zero init. Layer 1's gate_up_proj is scaled so that a
good share of the gate and up values lie beyond the clamp limit (7), in both directions, and the
routers are scaled 5x (top-k margins far above the two sides' rounding). Expert 0 of layer 0 gets
no token: its router bias is -50 (8 steps at lr 3e-3 move a weight by <= 0.024).

Checks, as test_moe.py's: one forward and backward through offloadd-engine-check against
transformers (fp32 eval: loss atol 2e-6 / rtol 1e-5, every gradient atol 2e-5 / rtol 1e-3, the
dead expert's rows exactly zero on both sides); offloadd-train over 8 steps against transformers
in float64 + torch.optim.AdamW + clip_grad_norm_ + the cosine schedule (loss 1e-5 relative,
weights 1e-3 of each tensor's own update in the max and Frobenius norms, or per element the bound
AdamW's arithmetic gives an eps-scale gradient as test_moe.py describes, embeddings 1e-3 absolute,
the dead expert's rows decayed as AdamW decays a zero gradient), greedy ids of the export equal.

MXFP4: the experts of a tiny checkpoint are written as the format's documented layout says
(engine/mxfp4.h: <name>_blocks uint8 [E, B, A/32, 16], two e2m1 values per byte with the even
element in the low nibble, <name>_scales uint8 e8m0 [E, B, A/32] for a parameter [E, A, B]), from
random nibbles and scales, with quantization_config {"quant_method": "mxfp4"}. A reference
dequantisation written here from the OCP MX spec, and transformers' own
(integrations/mxfp4.convert_moe_packed_tensors), must agree bit for bit; the engine's gradients on
the MXFP4 directory equal transformers' on the dequantised weights; offloadd-train trains it and
exports BF16 experts (no quantization_config) that transformers loads; malformed blocks or scales
are refused naming the tensor.
"""

import json
import time

import pytest
import torch
import transformers
from safetensors.torch import load_file as load_checkpoint_file, save_file

import families_testlib
from engine_testlib import hf_reference, make_batch, run_check, write_inputs
from families_testlib import checkpoint_layout, install_tokenizer, load_checkpoint, state_as_checkpoint, write_data
from moe_testlib import AUX_LOG, AdamErrorBound, moe_loss_fn, moe_reference
from pipeline_testlib import read_stats, run_train, train_steps
from test_families import ACCUM, BATCH, OPTIM, STEPS, check_generation, compare_weights, train_args
from test_moe import GRAD_RHO, lr_schedule
from test_model_configs import describe, refusal, save_config

families_testlib.TOKENIZERS.update({"gpt_oss": "gpt-oss"})
DEAD_EXPERT = 0
EXPERTS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
LIMIT = 7.0


def gpt_oss_config(vocab: int, bos: int, eos: int, **extra) -> transformers.GptOssConfig:
    c = dict(vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, pad_token_id=vocab - 1, hidden_size=64,
             intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
             max_position_embeddings=256, output_router_logits=True, router_aux_loss_coef=0.05,
             attention_dropout=0.0, tie_word_embeddings=False,
             rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                              "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})
    c.update(extra)
    return transformers.GptOssConfig(**c)


def prepare(model) -> None:
    """The perturbations of the module doc."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1 or n.endswith("_bias") or n.endswith(".sinks"):
                p.add_(torch.randn_like(p) * 0.1)
        for layer in model.model.layers:
            layer.mlp.router.weight.mul_(5)
        model.model.layers[1].mlp.experts.gate_up_proj.mul_(40)
        model.model.layers[0].mlp.router.bias[DEAD_EXPERT] = -50.0


def build(out, shared, seed=0):
    out.mkdir(parents=True, exist_ok=True)
    tok = install_tokenizer("gpt_oss", shared, out)
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(gpt_oss_config(tok["vocab"], tok["bos"], tok["eos"]))
    prepare(model)
    model.save_pretrained(out, safe_serialization=True)
    return model, tok


def clamped_share(model, ids) -> float:
    """The share of layer 1's gate/up values beyond the clamp (what the test means to exercise)."""
    seen = []
    experts = model.model.layers[1].mlp.experts
    orig = experts._apply_gate

    def spy(gate_up):
        seen.append(((gate_up[..., ::2] > LIMIT).float().mean().item(),
                     (gate_up[..., 1::2].abs() > LIMIT).float().mean().item()))
        return orig(gate_up)

    experts._apply_gate = spy
    with torch.no_grad():
        model(input_ids=ids)
    experts._apply_gate = orig
    return min(min(a for a, _ in seen), min(b for _, b in seen)) if seen else 0.0


@pytest.mark.parametrize("gemm", ["loop", "grouped"])
def test_gpt_oss_gradients_match_transformers(tmp_path, shared_dir, monkeypatch, gemm):
    """Both expert GEMM paths (test_moe.test_moe_gradients_match_transformers): the grouped one
    with gpt-oss's [E, H, 2I] / [E, I, H] layout and its biases added per permuted row."""
    monkeypatch.setenv("OFFLOADD_EXPERT_GEMM", gemm)
    model, _ = build(tmp_path / "m", shared_dir, seed=1)
    model.set_experts_implementation("eager")
    ids, labels = make_batch(model.config.vocab_size - 1, batch=3, seq=40, seed=5)
    assert clamped_share(model, ids) > 0.02, "no value reaches the SwiGLU clamp"
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    ours = run_check(tmp_path / "m", tmp_path / "in.safetensors", tmp_path / "out.safetensors")
    _, loss, grads = hf_reference(model, ids, labels)
    torch.testing.assert_close(ours["loss"].reshape(()), loss, atol=2e-6, rtol=1e-5)
    got = {k[len("grad/"):]: v for k, v in ours.items() if k.startswith("grad/")}
    assert set(got) == set(grads), sorted(set(got) ^ set(grads))[:6]
    for n, g in grads.items():
        torch.testing.assert_close(got[n], g, atol=2e-5, rtol=1e-3, msg=lambda m: f"{n}: {m}")
    for part in EXPERTS:
        name = f"model.layers.0.mlp.experts.{part}"
        assert grads[name][DEAD_EXPERT].abs().max() == 0, "the forced expert got a token"
        assert got[name][DEAD_EXPERT].abs().max() == 0
    assert grads["model.layers.0.self_attn.sinks"].abs().min() > 0


def test_gpt_oss_family_matches_transformers(binary_dir, shared_dir, tmp_path):
    t0 = time.monotonic()
    _, tok = build(tmp_path / "model", shared_dir, seed=7)
    model = tmp_path / "model"
    data = write_data("gpt_oss", model, shared_dir, tmp_path / "data.jsonl", n=BATCH * ACCUM * STEPS, seed=41)
    out = tmp_path / "out"
    out.mkdir()
    run_train(binary_dir, train_args(model, data, out))
    stats = read_stats(out / "stats.jsonl")
    assert [s["step"] for s in stats] == list(range(1, STEPS + 1))
    batches = json.loads((out / "batches.json").read_text())
    t_off = time.monotonic() - t0
    assert checkpoint_layout(out) == checkpoint_layout(model), "the export changed the checkpoint's layout"

    init = load_checkpoint(model)
    ref = moe_reference(model)
    ref.train()
    opt = torch.optim.AdamW(ref.parameters(), lr=OPTIM["lr"], weight_decay=OPTIM["weight_decay"], foreach=False)
    adam = AdamErrorBound(ref, GRAD_RHO)  # test_moe.py's per-element bound, the same for every MoE
    opt.register_step_post_hook(lambda o, args, kwargs: adam.after(o, o.param_groups[0]["lr"]))
    AUX_LOG.clear()
    ref_losses = train_steps(ref, batches, opt, OPTIM["scheduler"], OPTIM["warmup_steps"], OPTIM["max_grad_norm"],
                             moe_loss_fn)
    ours = [s["loss"] for s in stats]
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, ref_losses)]
    for step, (a, b, r) in enumerate(zip(ours, ref_losses, rel), 1):
        assert r <= 1e-5, f"step {step}: offloadd {a} vs transformers {b} (relative {r:.3g})"
    assert any(s["grad_norm"] > OPTIM["max_grad_norm"] for s in stats), "clipping never active"
    ref_aux = [sum(AUX_LOG[i * ACCUM:(i + 1) * ACCUM]) for i in range(STEPS)]
    for step, (s, want, loss) in enumerate(zip(stats, ref_aux, ref_losses), 1):
        assert abs(s["aux_loss"] - want) <= 1e-5 * abs(loss), f"step {step}: aux_loss {s['aux_loss']} vs {want}"

    experts = ref.model.layers[0].mlp.experts
    for p in (experts.gate_up_proj, experts.down_proj, experts.gate_up_proj_bias, experts.down_proj_bias):
        assert opt.state[p]["exp_avg"][DEAD_EXPERT].abs().max() == 0, "the forced expert got a token"

    got = load_checkpoint(out)
    want = state_as_checkpoint(ref, tmp_path / "ref")
    worst = compare_weights(got, want, init, adam.as_checkpoint(ref, tmp_path / "bound"))
    decay = 1.0
    for lr in lr_schedule():
        decay *= 1 - lr * OPTIM["weight_decay"]
    for part in ("gate_up_proj", "down_proj"):  # biases: AdamW decays them too, but they start near 0
        name = f"model.layers.0.mlp.experts.{part}"
        w0, g = init[name][DEAD_EXPERT].double(), got[name][DEAD_EXPERT].double()
        err = (g - w0 * decay).abs().max().item()
        assert err <= 1e-3 * (w0 - w0 * decay).abs().max().item(), f"{name}: {err:.3g} off the decay"

    prompt = json.loads(data.read_text().splitlines()[0])["input_ids"][:24]
    new = check_generation(out, prompt, tmp_path)
    print(f"\ngpt_oss [{tok['name']}]: loss rel max {max(rel):.2g}; weights max diff/update {worst['rel']:.2g} "
          f"({worst['rel_name']}); worst element at {worst['adam_ratio']:.2g} of its bound, {worst['adam']} "
          f"elements bounded by AdamW's arithmetic; Frobenius {worst['fro']:.2g} ({worst['fro_name']}); "
          f"embeddings max abs {worst['embed_abs']:.2g}; greedy ids equal {new}; offloadd {t_off:.1f} s, "
          f"total {time.monotonic() - t0:.1f} s")


# ---- MXFP4 ----------------------------------------------------------------------------------------

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # OCP MX v1.0, FP4 E2M1 magnitudes; bit 3 is the sign


def dequantize_from_spec(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks uint8 [E, B, G, 16], scales uint8 [E, B, G] -> the parameter [E, G * 32, B] (fp32):
    element 2i of a block from the low nibble of byte i, 2i + 1 from the high one, each times
    2^(scale - 127)."""
    e, b, g, _ = blocks.shape
    lo, hi = (blocks & 0x0F).long(), (blocks >> 4).long()
    nib = torch.stack([lo, hi], -1).reshape(e, b, g, 32)
    mag = torch.tensor(E2M1, dtype=torch.float64)[nib & 7]
    val = torch.where((nib & 8) != 0, -mag, mag) * torch.pow(2.0, scales.double() - 127).unsqueeze(-1)
    return val.reshape(e, b, g * 32).transpose(1, 2).float().contiguous()


def random_mxfp4(shape, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks and scales for a parameter of `shape` [E, A, B]: random nibbles, scales 2^-9 .. 2^-4
    (weights of the tiny model's magnitude)."""
    e, a, b = shape
    blocks = torch.randint(0, 256, (e, b, a // 32, 16), generator=gen, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(127 - 9, 127 - 3, (e, b, a // 32), generator=gen, dtype=torch.int32).to(torch.uint8)
    return blocks, scales


def write_mxfp4(src, dst, gen, *, mutate=None) -> dict:
    """Copies the checkpoint `src` to `dst` with every expert weight replaced by random MXFP4
    blocks and scales; returns {parameter name: dequantised fp32 value} (the spec's reference)."""
    dst.mkdir(parents=True, exist_ok=True)
    state, want = load_checkpoint(src), {}
    for name in [k for k in state if k.endswith(".experts.gate_up_proj") or k.endswith(".experts.down_proj")]:
        blocks, scales = random_mxfp4(tuple(state.pop(name).shape), gen)
        state[name + "_blocks"], state[name + "_scales"] = blocks, scales
        want[name] = dequantize_from_spec(blocks, scales)
    if mutate:
        mutate(state)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in src.iterdir():
        if f.suffix in (".json", ".jinja") and f.name != "config.json":
            (dst / f.name).write_bytes(f.read_bytes())
    return want


def test_mxfp4_reference_equals_transformers_dequantisation():
    """The spec reference above and transformers' own CPU dequantisation agree bit for bit (so
    the engine, checked against the reference, matches what transformers loads)."""
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    gen = torch.Generator().manual_seed(0)
    blocks, scales = random_mxfp4((3, 64, 40), gen)
    scales[0, 0, 0] = 0   # 2^-127: subnormal in fp32 and bf16 alike
    scales[1, 0, 0] = 127  # 2^0
    theirs = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    ours = dequantize_from_spec(blocks, scales)
    assert theirs.shape == ours.shape == (3, 64, 40)
    assert torch.equal(theirs, ours)
    assert torch.equal(ours.bfloat16().float(), ours), "MXFP4 values are exact in bf16"


def test_mxfp4_checkpoint_loads_trains_and_exports_bf16(binary_dir, shared_dir, tmp_path):
    model, _ = build(tmp_path / "m", shared_dir, seed=2)
    want = write_mxfp4(tmp_path / "m", tmp_path / "q", torch.Generator().manual_seed(1))
    j = describe(tmp_path / "q")
    assert j["moe"]["mxfp4"] and "MXFP4 experts dequantised on load" in j["parts"]

    # The engine on the MXFP4 directory against transformers on the dequantised weights.
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, value in want.items():
            params[name].copy_(value)
    model.set_experts_implementation("eager")
    ids, labels = make_batch(model.config.vocab_size - 1, batch=2, seq=32, seed=3)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    ours = run_check(tmp_path / "q", tmp_path / "in.safetensors", tmp_path / "out.safetensors")
    _, loss, grads = hf_reference(model, ids, labels)
    torch.testing.assert_close(ours["loss"].reshape(()), loss, atol=2e-6, rtol=1e-5)
    for n, g in grads.items():
        torch.testing.assert_close(ours["grad/" + n], g, atol=2e-5, rtol=1e-3, msg=lambda m: f"{n}: {m}")

    # offloadd-train: the trainer's master weights come from the MXFP4 values; the export is BF16
    # under the parameter names, without quantization_config, and transformers loads it.
    data = write_data("gpt_oss", tmp_path / "q", shared_dir, tmp_path / "data.jsonl", n=8, seed=3)
    out = tmp_path / "out"
    out.mkdir()
    args = [a for a in train_args(tmp_path / "q", data, out) if not a.startswith("--max-steps")]
    r = run_train(binary_dir, args + ["--max-steps=2"])
    assert "MXFP4 expert tensors dequantised to" in r.stdout + r.stderr
    stats = read_stats(out / "stats.jsonl")
    assert len(stats) == 2 and all(s["loss"] == s["loss"] and s["loss"] > 0 for s in stats)
    layout = checkpoint_layout(out)
    for name, value in want.items():
        assert layout[name] == (tuple(value.shape), "BF16"), layout[name]
        assert name + "_blocks" not in layout and name + "_scales" not in layout
    exported = load_checkpoint(out)
    for name, value in want.items():
        moved = (exported[name].float() - value).abs().max().item()
        assert 0 < moved < 0.1, f"{name}: moved {moved} in 2 steps at lr {OPTIM['lr']}"
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert torch.equal(reloaded.model.layers[0].mlp.experts.down_proj.data,
                       exported["model.layers.0.mlp.experts.down_proj"].float())


def test_mxfp4_export_writes_bf16_experts(shared_dir, tmp_path):
    """One SGD step through offloadd-engine-check on the MXFP4 directory, then its export: the
    experts as BF16 under the parameter names (no _blocks / _scales), equal to the updated fp32
    weights rounded once; no quantization_config; transformers loads it. The load and the export
    say so in the log."""
    build(tmp_path / "m", shared_dir, seed=4)
    want = write_mxfp4(tmp_path / "m", tmp_path / "q", torch.Generator().manual_seed(2))
    write_inputs(tmp_path / "in.safetensors", *make_batch(500, batch=2, seq=24, seed=1))
    lr = 0.01
    ours = run_check(tmp_path / "q", tmp_path / "in.safetensors", tmp_path / "o.safetensors", "--sgd-lr", lr,
                     "--export", tmp_path / "exp", expect_ok=False)
    assert ours.returncode == 0, ours.stderr
    log = ours.stdout + ours.stderr
    assert "MXFP4 expert tensors dequantised to Float for full fine-tuning" in log, log
    assert "MXFP4 expert tensors written as BF16" in log, log
    grads = load_checkpoint_file(tmp_path / "o.safetensors")
    layout = checkpoint_layout(tmp_path / "exp")
    exported = load_checkpoint(tmp_path / "exp")
    for name, value in want.items():
        assert layout[name] == (tuple(value.shape), "BF16"), layout[name]
        assert name + "_blocks" not in layout and name + "_scales" not in layout
        assert torch.equal(exported[name], value.sub(grads["grad/" + name], alpha=lr).bfloat16()), name
    assert "quantization_config" not in json.loads((tmp_path / "exp" / "config.json").read_text())
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exp", dtype=torch.float32)
    assert torch.equal(reloaded.model.layers[1].mlp.experts.gate_up_proj.data,
                       exported["model.layers.1.mlp.experts.gate_up_proj"].float())


@pytest.mark.parametrize("mutate,fragment", [
    (lambda s: s.update({"model.layers.0.mlp.experts.down_proj_blocks":
                         s["model.layers.0.mlp.experts.down_proj_blocks"][..., :8].contiguous()}),
     'MXFP4 tensor "model.layers.0.mlp.experts.down_proj_blocks" is U8 [4, 64, 1, 8], config.json implies U8 '
     '[4, 64, 1, 16]'),
    (lambda s: s.update({"model.layers.1.mlp.experts.gate_up_proj_scales":
                         s["model.layers.1.mlp.experts.gate_up_proj_scales"].to(torch.int32)}),
     'MXFP4 tensor "model.layers.1.mlp.experts.gate_up_proj_scales" is I32'),
    (lambda s: s["model.layers.1.mlp.experts.down_proj_scales"].view(-1)[5].fill_(255),
     'MXFP4 tensor "model.layers.1.mlp.experts.down_proj_scales": scale byte 255 (NaN in the OCP MX format)'),
])
def test_mxfp4_malformed_is_refused(tmp_path, shared_dir, mutate, fragment):
    build(tmp_path / "m", shared_dir, seed=2)
    write_mxfp4(tmp_path / "m", tmp_path / "q", torch.Generator().manual_seed(1), mutate=mutate)
    write_inputs(tmp_path / "in.safetensors", *make_batch(64, batch=2, seq=8))
    proc = run_check(tmp_path / "q", tmp_path / "in.safetensors", tmp_path / "o.safetensors", expect_ok=False)
    assert proc.returncode != 0
    assert fragment in proc.stderr + proc.stdout, proc.stderr


# ---- config -----------------------------------------------------------------------------------------

def test_gpt_oss_parts_and_counts_match_transformers(tmp_path):
    """Parameter count (sinks, router bias, expert biases included), layer types, YaRN from the
    config class's default rope_parameters, names; MXFP4 off without quantization_config."""
    config = transformers.GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                                       num_experts_per_tok=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved.pop("rope_parameters", None)  # the config class's default: YaRN
    (tmp_path / "config.json").write_text(json.dumps(saved))
    j = describe(tmp_path)
    assert j["params"]["total"] == model.num_parameters()
    assert j["sliding"] == [t == "sliding_attention" for t in config.layer_types]
    assert j["sliding_window"] == config.sliding_window == 128
    assert j["attention_sinks"] and j["qkv_bias"] and j["o_bias"]
    rope = config.rope_parameters
    assert j["rope"]["type"] == "yarn" and j["rope"]["factor"] == rope["factor"]
    assert j["rope"]["truncate"] is False and j["rope"]["theta"] == rope["rope_theta"]
    moe = j["moe"]
    assert (moe["num_experts"], moe["top_k"], moe["router_bias"], moe["expert_bias"], moe["mxfp4"]) == (4, 2, True, True,
                                                                                                       False)
    assert moe["router_aux_loss_coef"] == config.router_aux_loss_coef
    assert j["names"]["router"] == "mlp.router"
    assert "attention sinks" in j["parts"] and "clamped SwiGLU" in j["parts"]


GPT_OSS = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "vocab_size": 64, "hidden_size": 32,
           "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2}


@pytest.mark.parametrize("change,fragment", [
    ({"quantization_config": {"quant_method": "gptq"}},
     'quantization_config.quant_method: "gptq" is not supported'),
    ({"swiglu_limit": 5.0}, "swiglu_limit: 5.0 is not supported: transformers' GptOssExperts clamps at 7.0"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok: must be <= 4, got 5"),
    ({"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types[1]: unsupported layer type"),
    ({"sliding_window": None}, "sliding_window: null, but layer types include sliding_attention"),
])
def test_gpt_oss_config_refusals(tmp_path, change, fragment):
    err = refusal(save_config(tmp_path, dict(GPT_OSS, **change)))
    assert fragment in err, err


def test_gpt_oss_validate_only(binary_dir, shared_dir, tmp_path):
    """offloadd-train --validate-only plans a tiny gpt-oss stored as MXFP4: the plan prices every
    expert (the host holds fp32 master weights and two AdamW moments of all of them)."""
    model, _ = build(tmp_path / "m", shared_dir, seed=2)
    write_mxfp4(tmp_path / "m", tmp_path / "q", torch.Generator().manual_seed(1))
    data = write_data("gpt_oss", tmp_path / "q", shared_dir, tmp_path / "data.jsonl", n=8, seed=3)
    r = run_train(binary_dir, [f"--model={tmp_path / 'q'}", f"--data={data}", "--format=pretokenized",
                               "--device=cpu", "--dtype=fp32", "--workers=1x2", "--max-steps=2", "--batch-size=2",
                               f"--output-dir={tmp_path / 'out'}", f"--profile-dir={tmp_path}/profiles",
                               "--validate-only"])
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("valid: predicted "), r.stdout
    plan = json.loads(lines[1])
    assert plan["predicted_step_seconds"] > 0, plan
    assert describe(tmp_path / "q")["params"]["total"] == model.num_parameters()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
