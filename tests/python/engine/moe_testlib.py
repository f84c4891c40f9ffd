"""Tiny random-init mixture-of-experts models (Qwen3-MoE, OLMoE, Mixtral) from transformers' own
config classes, for test_moe.py: per-expert checkpoints as transformers 5's save_pretrained writes
them (and the hub's files), or the experts packed 3-D as transformers 5's modules hold them; a
router row forced so that one expert of the first layer never receives a token; the reference loss
with transformers' load-balancing loss."""

from __future__ import annotations

import pathlib
import re

import torch
import transformers
from safetensors.torch import save_file

import families_testlib
from families_testlib import install_tokenizer, load_checkpoint

# The families' real tokenizers where ../shared has them; OLMoE's (GPT-NeoX) is not there.
families_testlib.TOKENIZERS.update({"qwen3_moe": "qwen3", "olmoe": None, "olmoe_packed": None,
                                    "mixtral": "mistral-7b-v0.3"})
MOE_VARIANTS = ["qwen3_moe", "olmoe", "olmoe_packed", "mixtral"]
DEAD_EXPERT = 0  # of layer 0: its router row is pushed far below the others (force_dead_expert)

BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def moe_config(variant: str, vocab: int, bos: int, eos: int):
    """variant -> (config, model class). Each turns on what its family has: Qwen3-MoE a dense
    layer between sparse ones (mlp_only_layers), renormalised top-k and a tied head (its 151,936-row
    vocabulary once); OLMoE top-3 of 8 without
    renormalisation; Mixtral (always renormalised) a sliding window and no load-balancing loss."""
    ids = dict(vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, pad_token_id=vocab - 1)
    c = transformers
    if variant == "qwen3_moe":
        return c.Qwen3MoeConfig(**BASE, **ids, num_hidden_layers=3, head_dim=16, intermediate_size=96,
                                moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                                norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1,
                                output_router_logits=True, router_aux_loss_coef=0.05,
                                tie_word_embeddings=True, attention_dropout=0.0), c.Qwen3MoeForCausalLM
    if variant in ("olmoe", "olmoe_packed"):
        return c.OlmoeConfig(**BASE, **ids, num_hidden_layers=2, intermediate_size=32, num_experts=8,
                             num_experts_per_tok=3, norm_topk_prob=False, output_router_logits=True,
                             router_aux_loss_coef=0.05, attention_dropout=0.0), c.OlmoeForCausalLM
    if variant == "mixtral":
        return c.MixtralConfig(**BASE, **ids, num_hidden_layers=2, intermediate_size=32, num_local_experts=4,
                               num_experts_per_tok=2, sliding_window=16, output_router_logits=False,
                               attention_dropout=0.0), c.MixtralForCausalLM
    raise KeyError(variant)


def router_name(variant: str, layer: int, packed: bool) -> str:
    part = "block_sparse_moe" if variant == "mixtral" and not packed else "mlp"
    return f"model.layers.{layer}.{part}.gate.weight"


def force_dead_expert(model, variant: str) -> None:
    """Also scales the routers up (below). Layer 0's MoE input is RMSNorm(embedding + attention); embedding column 0 is set to 0.3 for
    every token and o_proj's row 0 to zero, so that column stays positive and dominant, and the
    router row of DEAD_EXPERT gets -2 there (the other rows 0): its logit sits ~14 below the others for every token,
    so it is never among the top-k in any step (8 steps at lr 3e-3 move each weight <= 0.024)."""
    with torch.no_grad():
        # Routers 5x their init (std 0.1): top-k margins far above the two sides' rounding, so
        # no token's choice of experts can differ between them.
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.mul_(5)
        model.model.embed_tokens.weight[:, 0] = 0.3
        model.model.layers[0].self_attn.o_proj.weight[0, :] = 0
        model.model.layers[0].mlp.gate.weight[:, 0] = 0  # the others route on the token's features
        model.model.layers[0].mlp.gate.weight[DEAD_EXPERT, 0] = -2.0


def pack_experts(state: dict, prefix: str = "") -> dict:
    """Per-expert tensors -> transformers 5's packed module layout: mlp.experts.<e>.{gate,up,down}_proj
    (Mixtral: block_sparse_moe.experts.<e>.{w1,w3,w2}, router block_sparse_moe.gate) become
    mlp.experts.gate_up_proj [E, 2I, H] (gate rows first), mlp.experts.down_proj [E, H, I] and
    mlp.gate. `prefix` is stripped from the keys first (e.g. "grad/")."""
    out, experts = {}, {}
    pat = re.compile(r"(.*)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)"
                     r"\.weight$")
    part = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    for k, v in state.items():
        if not k.startswith(prefix):
            continue
        k = k[len(prefix):]
        m = pat.match(k)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[part.get(m.group(3), m.group(3))] = v
        else:
            out[k.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = v
    for layer, by_e in experts.items():
        es = [by_e[e] for e in sorted(by_e)]
        out[layer + ".mlp.experts.gate_up_proj"] = torch.stack([torch.cat([e["gate_proj"], e["up_proj"]])
                                                               for e in es])
        out[layer + ".mlp.experts.down_proj"] = torch.stack([e["down_proj"] for e in es])
    return out


def build_moe(variant: str, shared: pathlib.Path, out: pathlib.Path, seed: int = 0) -> tuple[pathlib.Path, dict]:
    """Saves the tiny model (fp32) with its tokenizer into `out`: per-expert as save_pretrained
    writes it, or packed for *_packed. Norm weights are perturbed off their init of 1."""
    out.mkdir(parents=True, exist_ok=True)
    tok = install_tokenizer(variant, shared, out)
    cfg, cls = moe_config(variant, tok["vocab"], tok["bos"], tok["eos"])
    torch.manual_seed(seed)
    model = cls(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1 or n.endswith("_norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    force_dead_expert(model, variant)
    model.save_pretrained(out, safe_serialization=True)
    if variant.endswith("_packed"):
        state = pack_experts(load_checkpoint(out))
        for f in out.glob("*.safetensors"):
            f.unlink()
        save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
                  metadata={"format": "pt"})
    return out, tok


AUX_LOG: list[float] = []  # moe_loss_fn appends each micro-batch's coef * aux_loss


def moe_reference(model_dir: pathlib.Path):
    """transformers in float64 (as families_testlib.reference_model) with the eager experts loop:
    transformers 5's default experts implementation (grouped_mm) refuses float64."""
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64,
                                                             attn_implementation="eager",
                                                             experts_implementation="eager")


def moe_loss_fn(model, m: dict, trained: int):
    """pipeline_testlib.micro_batch_loss plus what transformers' *ForCausalLM.forward adds with
    labels when config.output_router_logits: router_aux_loss_coef * load_balancing_loss_func over
    the micro-batch's router logits (no attention mask: every row)."""
    b, t = m["batch"], m["seq"]
    dev = next(model.parameters()).device
    ids = torch.tensor(m["input_ids"], device=dev).view(b, t)
    pos = torch.tensor(m["position_ids"], device=dev).view(b, t)
    targets = torch.tensor(m["targets"], device=dev).view(b, t)
    out = model(input_ids=ids, position_ids=pos)
    logits = out.logits.to(torch.promote_types(out.logits.dtype, torch.float32))
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                             ignore_index=-100, reduction="sum") / max(1, trained)
    if model.config.output_router_logits:
        aux = model.config.router_aux_loss_coef * out.aux_loss.to(loss.dtype)
        AUX_LOG.append(aux.item())
        loss = loss + aux
    return loss


def grad_scale(name: str, g: torch.Tensor) -> torch.Tensor:
    """The largest |element| of a gradient's matrix: per expert for packed experts ([E, ...]),
    so that an expert without a token has scale 0; else the whole tensor's."""
    g = g.abs()
    if ".experts." in name and g.dim() == 3:
        return g.flatten(1).amax(1).view(-1, 1, 1)
    return g.max()


class AdamErrorBound:
    """Each element's bound on |w_off - w_ref| after AdamW, from AdamW's own arithmetic.

    Both sides' gradients of a step differ by at most `rho` times the largest gradient element of
    the same matrix (for packed experts: of the same expert, so an expert without a token has an
    exact zero gradient on both sides). That error enters m and v through AdamW's recursions, so
    after step t its size is Dm = m-hat of rho*G and Dv = sqrt(v-hat of (rho*G)^2) (Minkowski: the
    bias-corrected v is a weighted mean of squares). The update u = m / (sqrt(v) + eps) is
    monotone in m, and in sqrt(v) for either sign of m, so over |dm| <= Dm, |ds| <= Dv (s kept
    >= 0) its largest change is at a corner of that box; lr_t times that change summed over the
    steps bounds the weight (the decoupled decay only shrinks an earlier error). Where
    sqrt(v) >> rho*G the change is ~ rho*G/sqrt(v) of the update; where sqrt(v) is at the gradient's
    resolution (a gradient at the eps scale, or one that cancels to zero) the update is the
    rounding, and the bound says so. Call after(opt, grads) once per step, after clipping and
    optimizer.step(), with the learning rate the step used."""

    def __init__(self, model, rho: float):
        self.rho = rho
        self.names = {p: n for n, p in model.named_parameters()}
        self.dm, self.dv, self.bound = {}, {}, {}

    def after(self, opt, lr: float) -> None:
        group = opt.param_groups[0]
        b1, b2 = group["betas"]
        eps = group["eps"]
        for p, name in self.names.items():
            if p.grad is None:
                continue
            d = self.rho * grad_scale(name, p.grad.detach())
            self.dm[p] = b1 * self.dm.get(p, 0.0) + (1 - b1) * d
            self.dv[p] = b2 * self.dv.get(p, 0.0) + (1 - b2) * d * d
            st = opt.state[p]
            t = float(st["step"])
            c1, c2 = 1 - b1 ** t, 1 - b2 ** t
            m = st["exp_avg"] / c1
            s = (st["exp_avg_sq"] / c2).sqrt()
            dm, ds = self.dm[p] / c1, (self.dv[p] / c2) ** 0.5
            u = m / (s + eps)
            s_lo, s_hi = (s - ds).clamp_min(0) + eps, s + ds + eps
            hi, lo = m + dm, m - dm
            u_hi = torch.where(hi >= 0, hi / s_lo, hi / s_hi)
            u_lo = torch.where(lo <= 0, lo / s_lo, lo / s_hi)
            step = lr * torch.maximum(u_hi - u, u - u_lo)
            self.bound[p] = self.bound.get(p, 0.0) + step

    def as_checkpoint(self, model, tmp: pathlib.Path) -> dict:
        """The bounds under the checkpoint's names and layout (save_pretrained's mapping); the
        model's parameters are overwritten."""
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(self.bound.get(p, torch.zeros_like(p)))
        return families_testlib.state_as_checkpoint(model, tmp)
