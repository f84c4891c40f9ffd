"""Mixture-of-experts families train as transformers does (CPU, fp32).

Variants (tiny random-init models from transformers' config classes, hidden 64, 2-3 layers):
  * qwen3_moe: 8 experts, top-2 renormalised (norm_topk_prob), layer 1 dense (mlp_only_layers),
    q/k norm per head, the load-balancing loss (output_router_logits, coefficient 0.05), tied head;
    the qwen3 tokenizer.
  * olmoe: 8 experts, top-3 not renormalised, q/k norm over the projection, load-balancing loss;
    a synthetic byte-level BPE (OLMoE's GPT-NeoX tokenizer is not in ../shared).
  * olmoe_packed: the same family with the experts stored packed 3-D (mlp.experts.gate_up_proj
    [E, 2I, H], mlp.experts.down_proj [E, H, I]), as transformers 5's modules hold them.
  * mixtral: 4 experts top-2 (always renormalised), per-expert w1/w3/w2 under block_sparse_moe,
    a sliding window of 16 on 40-64-token sequences, no load-balancing loss; the mistral tokenizer.

In every variant expert 0 of layer 0 receives no token in any step (moe_testlib.force_dead_expert).
transformers 5 holds the experts of every family packed in one parameter, so that expert's rows
get a zero gradient and torch.optim.AdamW still applies its decoupled weight decay to them (its
moments stay zero). The test shows it on the reference (the AdamW moments of those rows are zero,
the rows moved) and requires offloadd's export to equal w0 * prod_t (1 - lr_t * weight_decay) for
them in both layouts.

offloadd-train runs 8 steps (batch 2, 2 micro-batches) on the CPU; the reference is transformers
in float64 + torch.optim.AdamW + clip_grad_norm_ + the cosine schedule on the batches offloadd-train
dumped, each micro-batch's loss being its token losses over the step's trained tokens plus
router_aux_loss_coef * the load-balancing loss of its router logits (what *ForCausalLM.forward adds
with labels; the HF Trainer adds it per micro-batch). Bounds are test_families.py's: loss 1e-5
relative, weights 1e-3 of each tensor's own update (Frobenius norm, and max norm per element),
embeddings 1e-3 absolute; the export keeps the checkpoint's layout (names, shapes, dtypes), loads
in transformers, and its greedy generation equals the engine's.

One addition, the same for every variant (and gpt-oss): an element's max-norm bound is the larger
of 1e-3 of its tensor's update and what AdamW's arithmetic makes of the gradient's rounding
(moe_testlib.AdamErrorBound, computed along the float64 reference run from its own moments), and
the Frobenius bound applies to what the errors exceed those per-element bounds by. An
element whose gradient sits at the eps scale gets an update m / (sqrt(v) + eps) proportional to
that gradient's rounding. Rarely routed experts hold such elements. Measured on qwen3_moe (the
expected failure this replaces): expert 1 of layer 2 got tokens in steps 4 and 5 only. Its
gate_proj[26, 42] had a step-4 gradient of -6.6e-9 (float64; 1.6e-5 of that expert's largest) and
sqrt(v) = 3.3e-9 < eps, so its update was -0.14 lr in float64 and -0.09 lr in transformers' own
fp32 run (gradient -3.9e-9). Max-norm error / update, offloadd | transformers fp32, each against
float64: that gate_proj 0.016 | 0.030, down_proj 0.0046 | 0.0085 (the 4.6e-3 first reported),
model.norm.weight 0.036 | 0.064. Its element 0 has an exactly zero gradient in steps 1-2: embedding
column 0 is 0.3 for every token (force_dead_expert), and the tied head shifts every logit by the
same amount. AdamW turns the fp32 rounding there (1.9e-8) into an update of 0.65 lr.
Not the cause:
  * routing. The top-2 of every token agree between transformers' fp32 run and float64 through
    step 7 (smallest margin 9.6e-6 in probability). In step 8 one token of layer 2 flips
    ([3, 7] -> [3, 5], margin 3.3e-6) in transformers' fp32 run only; offloadd's errors on those
    experts stay within 1e-3 of their update.
  * the engine. At the same weights (float64's after 3 steps), offloadd's step-4 gradients are
    within 5.5e-6 of each tensor's largest element of float64's (transformers fp32: 2.7e-6).
With the bound (rho = GRAD_RHO), offloadd's worst element is at 0.66 of it. transformers' fp32 run
stays within it everywhere except layer 2's experts 5 and 7, the step-8 flip.
The bound is larger than 1e-3 of the update wherever sqrt(v) is small against the matrix's largest
gradient: rarely routed experts, and the rows of rarely seen tokens in an untied head.
Measured (2026-11-28, the 2-core machine under load; this file and test_gpt_oss.py, 33 passed in
580 s): worst element / its bound, elements whose AdamW bound exceeds 1e-3 of the update:
qwen3_moe 0.66, 61,302; olmoe 0.12, 82,317; olmoe_packed 0.04, 66,726; mixtral 0.11, 2,118,472
(mostly its untied 32,768-row head); gpt-oss 0.064, 12.8M (its 201,088-row head). One-step
gradients against float64: <= 2.7e-6 of the matrix's largest element.
"""

import json
import time

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file

from families_testlib import checkpoint_layout, load_checkpoint, state_as_checkpoint, write_data
from engine_testlib import hf_reference, make_batch, run_check, write_inputs
from moe_testlib import (AUX_LOG, DEAD_EXPERT, MOE_VARIANTS, AdamErrorBound, build_moe, force_dead_expert,
                         grad_scale, moe_config, moe_loss_fn, moe_reference, pack_experts, router_name)
from pipeline_testlib import read_stats, run_train, train_steps
from test_families import ACCUM, BATCH, OPTIM, STEPS, check_generation, compare_weights, train_args
from test_model_configs import describe, refusal, save_config


def lr_schedule() -> list[float]:
    """The learning rate of each step under transformers' scheduler (what both sides use)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=OPTIM["lr"])
    sched = transformers.get_scheduler(OPTIM["scheduler"], opt, num_warmup_steps=OPTIM["warmup_steps"],
                                       num_training_steps=STEPS)
    out = []
    for _ in range(STEPS):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def dead_expert_rows(state: dict, variant: str) -> dict:
    """{name: tensor} of layer 0's DEAD_EXPERT weights in the state's layout."""
    out = {}
    for k, v in state.items():
        if not k.startswith("model.layers.0."):
            continue
        if f".experts.{DEAD_EXPERT}." in k:
            out[k] = v
        elif k.endswith(".experts.gate_up_proj") or k.endswith(".experts.down_proj"):
            out[k] = v[DEAD_EXPERT]
    assert out, f"no expert {DEAD_EXPERT} tensors in layer 0 ({variant})"
    return out


# The gradient resolution of the AdamW bound (moe_testlib.AdamErrorBound): fp32 gradients within
# 1e-5 of their matrix's largest element of float64's, the bound test_hf_crosscheck.py asserts
# for the dense families' first step and test_moe_gradients_match_transformers below for these.
GRAD_RHO = 1e-5


@pytest.mark.parametrize("variant", MOE_VARIANTS)
def test_moe_family_matches_transformers(binary_dir, shared_dir, tmp_path, variant):
    t0 = time.monotonic()
    index = MOE_VARIANTS.index(variant)
    packed = variant.endswith("_packed")
    model, tok = build_moe(variant, shared_dir, tmp_path / "model", seed=index)
    data = write_data(variant, model, shared_dir, tmp_path / "data.jsonl", n=BATCH * ACCUM * STEPS,
                      seed=31 + index)
    out = tmp_path / "out"
    out.mkdir()
    run_train(binary_dir, train_args(model, data, out))
    stats = read_stats(out / "stats.jsonl")
    assert [s["step"] for s in stats] == list(range(1, STEPS + 1))
    batches = json.loads((out / "batches.json").read_text())
    t_off = time.monotonic() - t0

    want_layout, got_layout = checkpoint_layout(model), checkpoint_layout(out)
    assert got_layout == want_layout, "the export changed the checkpoint's layout"

    init = load_checkpoint(model)
    ref = moe_reference(model)
    ref.train()
    opt = torch.optim.AdamW(ref.parameters(), lr=OPTIM["lr"], weight_decay=OPTIM["weight_decay"],
                            foreach=False)
    adam = AdamErrorBound(ref, GRAD_RHO)
    opt.register_step_post_hook(lambda o, args, kwargs: adam.after(o, o.param_groups[0]["lr"]))
    AUX_LOG.clear()
    ref_losses = train_steps(ref, batches, opt, OPTIM["scheduler"], OPTIM["warmup_steps"],
                             OPTIM["max_grad_norm"], moe_loss_fn)
    ours = [s["loss"] for s in stats]
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, ref_losses)]
    for step, (a, b, r) in enumerate(zip(ours, ref_losses, rel), 1):
        assert r <= 1e-5, f"step {step}: offloadd {a} vs transformers {b} (relative {r:.3g})"
    assert any(s["grad_norm"] > OPTIM["max_grad_norm"] for s in stats), "clipping never active"
    # The load-balancing share of each step's loss, reported on its own. It is a part of the loss,
    # so its error is bounded by the loss's absolute budget (1e-5 of the loss): it moves with the
    # router weights, which the two sides carry only within 1e-3 of their own update (measured on
    # qwen3_moe: 1.4e-5 of the aux itself, 6e-7 of the loss, at step 7).
    if ref.config.output_router_logits:
        ref_aux = [sum(AUX_LOG[i * ACCUM:(i + 1) * ACCUM]) for i in range(STEPS)]
        for step, (s, want, loss) in enumerate(zip(stats, ref_aux, ref_losses), 1):
            assert abs(s["aux_loss"] - want) <= 1e-5 * abs(loss), \
                f"step {step}: aux_loss {s['aux_loss']} vs {want}"
            assert want > 0
    else:
        assert all(s["aux_loss"] == 0 for s in stats)

    # The reference's dead expert: zero AdamW moments (a zero gradient every step) in its packed
    # parameters, yet its weights moved (weight decay).
    experts = ref.model.layers[0].mlp.experts
    for p in (experts.gate_up_proj, experts.down_proj):
        assert opt.state[p]["exp_avg"][DEAD_EXPERT].abs().max() == 0, "the forced expert got a token"
        assert (opt.state[p]["exp_avg"].flatten(1).abs().amax(1) > 0).sum() > ref.config.num_experts_per_tok

    want = state_as_checkpoint(ref, tmp_path / "ref")
    bound = adam.as_checkpoint(ref, tmp_path / "bound")  # ref's weights are the bounds from here
    if packed:
        want, bound = pack_experts(want), pack_experts(bound)
    got = load_checkpoint(out)
    worst = compare_weights(got, want, init, bound)

    # Offloadd's export of the dead expert: decayed exactly as AdamW decays a zero-gradient row.
    decay = 1.0
    for lr in lr_schedule():
        decay *= 1 - lr * OPTIM["weight_decay"]
    for name, w0 in dead_expert_rows(init, variant).items():
        g = dead_expert_rows(got, variant)[name]
        expect = w0.double() * decay
        assert not torch.equal(g, w0), f"{name}: AdamW's decay was skipped"
        err = (g.double() - expect).abs().max().item()
        assert err <= 1e-3 * (w0.double() - expect).abs().max().item(), f"{name}: {err:.3g} off the decay"

    # The router of the dead expert was trained like the rest (no special casing).
    assert router_name(variant, 0, packed) in got

    prompt = json.loads(data.read_text().splitlines()[0])["input_ids"][:24]
    new = check_generation(out, prompt, tmp_path)
    print(f"\n{variant} [{tok['name']}]: loss rel max {max(rel):.2g}; weights max diff/update "
          f"{worst['rel']:.2g} ({worst['rel_name']}); worst element at {worst['adam_ratio']:.2g} of "
          f"its bound, {worst['adam']} elements bounded by AdamW's arithmetic; Frobenius "
          f"{worst['fro']:.2g} ({worst['fro_name']}); "
          f"embeddings max abs {worst['embed_abs']:.2g}; greedy ids equal {new}; "
          f"offloadd {t_off:.1f} s, total {time.monotonic() - t0:.1f} s")


QWEN3_MOE = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 64,
             "hidden_size": 16, "intermediate_size": 32, "moe_intermediate_size": 8,
             "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
             "num_experts": 4, "num_experts_per_tok": 2}


@pytest.mark.parametrize("change,fragment", [
    ({"num_experts_per_tok": 5}, "num_experts_per_tok: must be <= 4, got 5"),
    ({"mlp_only_layers": [2]}, "mlp_only_layers: expected layer indices in [0, 2), got 2"),
    ({"use_sliding_window": True, "sliding_window": 8}, "use_sliding_window: true is not supported"),
    ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 4,
      "router_jitter_noise": 0.1}, "router_jitter_noise: 0.1 is not supported"),
    ({"model_type": "olmoe", "architectures": ["OlmoeForCausalLM"], "head_dim": None, "clip_qkv": 8.0},
     "clip_qkv: 8.0 is not supported"),
    ({"router_aux_loss_coef": -1}, "router_aux_loss_coef: must be a finite number >= 0, got -1"),
    ({"num_local_experts": 8}, "num_experts: is 4 but num_local_experts is 8"),
])
def test_moe_config_refusals(tmp_path, change, fragment):
    """What the MoE parts do not implement is refused when config.json is read (the daemon's
    validation reads it the same way), naming the key and value."""
    err = refusal(save_config(tmp_path, dict(QWEN3_MOE, **change)))
    assert fragment in err, err


MOE_CONFIGS = [
    ("qwen3_moe", lambda: transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=16, intermediate_size=40, moe_intermediate_size=8, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=4, num_experts_per_tok=2,
        decoder_sparse_step=2, mlp_only_layers=[3], output_router_logits=True, norm_topk_prob=True)),
    ("olmoe", lambda: transformers.OlmoeConfig(
        vocab_size=64, hidden_size=16, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2,
        num_experts=4, num_experts_per_tok=3)),
    ("mixtral", lambda: transformers.MixtralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2)),
]


@pytest.mark.parametrize("name,make", MOE_CONFIGS, ids=[m[0] for m in MOE_CONFIGS])
def test_moe_parts_and_counts_match_transformers(tmp_path, name, make):
    """The sparse layers (decoder_sparse_step, mlp_only_layers), top-k, renormalisation, aux loss
    and the parameter count as transformers builds the model; the expert tensor names are those
    save_pretrained writes."""
    config = make()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path)
    j = describe(tmp_path)
    assert j["params"]["total"] == model.num_parameters()
    moe = j["moe"]
    sparse = [hasattr(layer.mlp, "experts") for layer in model.model.layers]
    assert moe["sparse"] == sparse
    router = model.model.layers[sparse.index(True)].mlp.gate
    assert moe["num_experts"] == router.num_experts
    assert moe["top_k"] == router.top_k
    assert moe["intermediate_size"] == model.model.layers[sparse.index(True)].mlp.experts.intermediate_dim
    assert moe["norm_topk_prob"] == getattr(router, "norm_topk_prob", True)  # Mixtral: always
    assert moe["output_router_logits"] == config.output_router_logits
    assert moe["router_aux_loss_coef"] == config.router_aux_loss_coef
    n = j["names"]
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    layer = sparse.index(True)
    p = f"model.layers.{layer}."
    assert p + n["router"] + ".weight" in saved
    for e in range(moe["num_experts"]):
        for part in ("expert_gate", "expert_up", "expert_down"):
            assert f"{p}{n['experts']}.{e}.{n[part]}.weight" in saved
    assert "MoE " in j["parts"]


@pytest.mark.parametrize("gemm", ["loop", "grouped"])
@pytest.mark.parametrize("variant", MOE_VARIANTS)
def test_moe_gradients_match_transformers(tmp_path, monkeypatch, variant, gemm):
    """One forward and backward through offloadd-engine-check against transformers (fp32, eval):
    the loss (with the load-balancing loss where the config asks for it) and every parameter's
    gradient within test_engine_parity.py's fp32 bounds (atol 2e-5, rtol 1e-3), in the
    checkpoint's layout (per-expert or packed). The forced expert's gradient is exactly zero on
    both sides, and present: transformers' packed parameter has those zero rows, and the engine
    emits zeros for it (a per-expert tensor included). Both expert GEMM paths: one GEMM per
    non-empty expert, and the grouped GEMMs CUDA runs by default (here ATen's reference
    at::_grouped_mm on the CPU: the same offsets, operand layouts and empty-group handling)."""
    monkeypatch.setenv("OFFLOADD_EXPERT_GEMM", gemm)
    torch.manual_seed(3)
    cfg, cls = moe_config(variant, 96, 1, 2)
    model = cls(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    force_dead_expert(model, variant)
    model.save_pretrained(tmp_path / "m")
    if variant.endswith("_packed"):
        state = pack_experts(load_checkpoint(tmp_path / "m"))
        (tmp_path / "m" / "model.safetensors").unlink()
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "m" / "model.safetensors"),
                  metadata={"format": "pt"})
    ids, labels = make_batch(96, batch=3, seq=24, seed=5)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    proc = run_check(tmp_path / "m", tmp_path / "in.safetensors", tmp_path / "out.safetensors", expect_ok=False)
    assert proc.returncode == 0, proc.stderr
    assert ("grouped expert GEMMs (at::_grouped_mm)" in proc.stderr) == (gemm == "grouped"), proc.stderr
    ours = load_file(str(tmp_path / "out.safetensors"))
    _, loss, grads = hf_reference(model, ids, labels)
    torch.testing.assert_close(ours["loss"].reshape(()), loss, atol=2e-6, rtol=1e-5)
    got = pack_experts(ours, "grad/")
    assert set(got) == set(grads), sorted(set(got) ^ set(grads))[:6]
    for n, g in grads.items():
        torch.testing.assert_close(got[n], g, atol=2e-5, rtol=1e-3, msg=lambda m: f"{n}: {m}")
    # Against float64 (the same weights): GRAD_RHO of each matrix's largest gradient element (per
    # expert), the gradient resolution the 8-step check's AdamW bound assumes.
    _, _, grads64 = hf_reference(moe_reference(tmp_path / "m"), ids, labels)
    worst = 0.0
    for n, g in grads64.items():
        err, scale = (got[n].double() - g).abs(), grad_scale(n, g)
        assert (err <= GRAD_RHO * scale).all(), \
            f"{n}: {err.max():.3g} off float64, > {GRAD_RHO} of the matrix's largest element"
        worst = max(worst, (err / scale.clamp_min(1e-300)).max().item())
    print(f"\n{variant}: gradients within {worst:.2g} of their matrix's largest element of float64's")
    for part in ("gate_up_proj", "down_proj"):
        name = f"model.layers.0.mlp.experts.{part}"
        assert grads[name][DEAD_EXPERT].abs().max() == 0, "the forced expert got a token"
        assert got[name][DEAD_EXPERT].abs().max() == 0
        assert (grads[name].flatten(1).abs().amax(1) > 0).sum() > cfg.num_experts_per_tok


@pytest.mark.parametrize("value,fragment", [
    ("bogus", "OFFLOADD_EXPERT_GEMM must be auto, grouped or loop, got 'bogus'"),
])
def test_expert_gemm_setting_is_checked(tmp_path, monkeypatch, value, fragment):
    """A mistyped OFFLOADD_EXPERT_GEMM fails the run naming the variable and the value (never a
    silent fallback to one path); the grouped GEMM forced on experts whose rows are not a multiple of
    16 bytes (fp32 hidden 64, expert intermediate 6: 24-byte rows) names why it cannot run."""
    cfg, cls = moe_config("olmoe", 96, 1, 2)
    torch.manual_seed(0)
    cls(cfg).save_pretrained(tmp_path / "m")
    cfg.intermediate_size = 6
    cls(cfg).save_pretrained(tmp_path / "odd")
    ids, labels = make_batch(96, batch=2, seq=8, seed=1)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    monkeypatch.setenv("OFFLOADD_EXPERT_GEMM", value)
    proc = run_check(tmp_path / "m", tmp_path / "in.safetensors", tmp_path / "o.safetensors", expect_ok=False)
    assert proc.returncode != 0 and fragment in proc.stderr, proc.stderr
    monkeypatch.setenv("OFFLOADD_EXPERT_GEMM", "grouped")
    proc = run_check(tmp_path / "odd", tmp_path / "in.safetensors", tmp_path / "o.safetensors", expect_ok=False)
    assert proc.returncode != 0, proc.stderr
    assert "OFFLOADD_EXPERT_GEMM=grouped: needs hidden and expert intermediate rows of a multiple of 16 " \
        "bytes" in proc.stderr, proc.stderr
    monkeypatch.setenv("OFFLOADD_EXPERT_GEMM", "auto")  # the CPU's loop runs it
    run_check(tmp_path / "odd", tmp_path / "in.safetensors", tmp_path / "o.safetensors")
