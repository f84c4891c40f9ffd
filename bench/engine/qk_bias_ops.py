#!/usr/bin/env python3
"""qwen2's q/k bias gradients per op, on the CPU in bf16 (bench/engine/RESULTS.md, "qwen2's q/k
biases"). A tiny Qwen2 (test_families_gpu.py's dims, 1-D parameters perturbed as families_testlib
does) runs one bf16 forward/backward in transformers; the last layer's attention input and the
gradient at its output are captured, and from those same bf16 tensors the q/k bias (and q weight)
gradients are computed by
  eager       transformers' Qwen2Attention in bf16 (autograd; the parity tests' yardstick)
  engine      the engine's ops (engine/parts/attention.cc, ops.cc): at::linear, RoPE with bf16
              tables, k and v centred, ATen's CPU flash kernel, ApplyRopeBackward, dy.sum(0)
  rope+bias fp32   the same with the RoPE backward and the bias sums in fp32
  D fp32      and with D = rowsum(dO * out) from an fp32 forward's output (dq and dk corrected)
  fp32 bwd    the whole attention backward in fp32 (on the bf16 forward's q, k, v)
each as its relative error against float64 on the same inputs. First it checks that the engine's
RoPE backward and bias/weight reductions are bit for bit transformers' (nn.Linear's and
apply_rotary_pos_emb's autograd) on the same bf16 gradients.

    python3 bench/engine/qk_bias_ops.py [SEED ...]
"""
import math
import sys

import torch
import transformers
from transformers.models.qwen2 import modeling_qwen2 as mq
torch.set_grad_enabled(True)


def bitwise_checks():
    """The engine's RoPE backward (ApplyRopeBackward: dy * cos + RotateHalfT(dy * sin)) and its
    Linear reductions (LinearBackward: dy.sum(0), dy^T x) against transformers' autograd of
    apply_rotary_pos_emb and nn.Linear on the same bf16 gradients."""
    torch.manual_seed(0)
    B, H, T, D, hid = 4, 4, 64, 32, 128
    cfg = transformers.Qwen2Config(hidden_size=hid, num_attention_heads=H, num_key_value_heads=2,
                                   max_position_embeddings=128)
    x = torch.randn(B, T, hid).to(bf)
    cos, sin = mq.Qwen2RotaryEmbedding(cfg)(x, torch.arange(T)[None].expand(B, T))
    q = torch.randn(B, H, T, D).to(bf).requires_grad_()
    k = torch.randn(B, 2, T, D).to(bf).requires_grad_()
    dy = torch.randn(B, H, T, D).to(bf) * 1e-3
    mq.apply_rotary_pos_emb(q, k, cos, sin)[0].backward(dy)
    ours = dy * cos[:, None] + rot_half_t(dy * sin[:, None])
    print("RoPE backward bit for bit transformers' autograd:", torch.equal(ours, q.grad))
    lin = torch.nn.Linear(hid, H * D).to(bf)
    out = lin(x)
    g = torch.randn_like(out) * 1e-3
    out.backward(g)
    g2 = g.reshape(-1, H * D)
    print("bias gradient bit for bit nn.Linear's:", torch.equal(g2.sum(0), lin.bias.grad))
    print("weight gradient bit for bit nn.Linear's:",
          torch.equal(g2.t().mm(x.reshape(-1, hid)), lin.weight.grad))


bf, f64 = torch.bfloat16, torch.float64

def setup(seed, B=4, T=64, vocab=512, layer=3, layers=4):
    cfg = transformers.Qwen2Config(vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=vocab-1,
        hidden_size=128, intermediate_size=256, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True, use_sliding_window=False,
        attention_dropout=0.0, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1 or n.endswith("_norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    g = torch.Generator().manual_seed(100 + seed)
    ids = torch.randint(2, vocab - 1, (B, T), generator=g)
    labels = ids.clone(); labels[:, :20] = -100
    m = model.to(bf)
    cap = {}
    attn = m.model.layers[layer].self_attn
    def fh(mod, args, kwargs, out):
        cap["x"] = kwargs["hidden_states"].detach().clone()
        cap["pe"] = tuple(t.detach().clone() for t in kwargs["position_embeddings"])
        out[0].register_hook(lambda gr: cap.__setitem__("do", gr.detach().clone()))
    attn.register_forward_hook(fh, with_kwargs=True)
    m(input_ids=ids, labels=labels).loss.float().backward()
    return cfg, attn, cap

def module_grads(cfg, attn, cap, dtype):
    a = mq.Qwen2Attention(cfg, 0).to(dtype)
    a.load_state_dict({k: v.to(dtype) for k, v in attn.state_dict().items()})
    x = cap["x"].to(dtype).requires_grad_()
    pe = tuple(t.to(dtype) for t in cap["pe"])
    T = x.shape[1]
    mask = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)[None, None]
    out, _ = a(x, pe, mask)
    out.backward(cap["do"].to(dtype))
    return {n: p.grad.double() for n, p in a.named_parameters()}, x.grad.double()

def rot_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)
def rot_half_t(x):
    h = x.shape[-1] // 2
    return torch.cat([x[..., h:], -x[..., :h]], -1)

def engine(cfg, attn, cap, rope_bias_fp32=False, fp32_bwd=False, d_fp32=False):
    """The engine's ops (engine/parts/attention.cc, ops.cc) in bf16 on the CPU."""
    W = {k: v.to(bf) for k, v in attn.state_dict().items()}
    x, do = cap["x"].to(bf), cap["do"].to(bf)
    cos, sin = (t.to(bf)[:, None] for t in cap["pe"])
    B, T, _ = x.shape
    H, KV, D = 4, 2, 32
    rep = H // KV
    split = lambda t, h: t.view(B, T, h, D).transpose(1, 2)
    ql = torch.nn.functional.linear(x, W["q_proj.weight"], W["q_proj.bias"])
    kl = torch.nn.functional.linear(x, W["k_proj.weight"], W["k_proj.bias"])
    vl = torch.nn.functional.linear(x, W["v_proj.weight"], W["v_proj.bias"])
    q = split(ql, H) * cos + rot_half(split(ql, H)) * sin
    k = split(kl, KV) * cos + rot_half(split(kl, KV)) * sin
    v = split(vl, KV)
    km, vm = k.float().mean(2, keepdim=True), v.float().mean(2, keepdim=True)
    kc, vc = (k.float() - km).to(bf), (v.float() - vm).to(bf)
    ke = kc.repeat_interleave(rep, 1); ve = vc.repeat_interleave(rep, 1)
    scale = 1 / math.sqrt(D)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, ke, ve, 0.0, True, attn_mask=None, scale=scale)
    value = (out.float() + vm.repeat_interleave(rep, 1)).to(bf)
    merged = value.transpose(1, 2).reshape(B, T, H * D)
    d2 = do.reshape(-1, do.shape[-1])
    dattn = do @ W["o_proj.weight"]
    dheads = dattn.view(B, T, H, D).transpose(1, 2)
    if fp32_bwd:
        q32, ke32, ve32 = q.float(), ke.float(), ve.float()
        o32, l32 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q32, ke32, ve32, 0.0, True, attn_mask=None, scale=scale)
        dq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dheads.float().contiguous(), q32, ke32, ve32, o32, l32, 0.0, True, attn_mask=None, scale=scale)
    else:
        dq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dheads.contiguous(), q, ke, ve, out, lse, 0.0, True, attn_mask=None, scale=scale)
    if d_fp32:
        q32, ke32, ve32, do32 = q.float(), ke.float(), ve.float(), dheads.float()
        o32, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q32, ke32, ve32, 0.0, True, attn_mask=None, scale=scale)
        delta = (do32 * (o32 - out.float())).sum(-1, keepdim=True)
        mk, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q32, ke32, ke32, 0.0, True, attn_mask=None, scale=scale)
        o32, l32 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q32, ke32, ve32, 0.0, True, attn_mask=None, scale=scale)
        pt = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            (delta * q32).contiguous(), q32, ke32, ve32, o32, l32, 0.0, True, attn_mask=None, scale=scale)[2]
        dq = dq.float() - scale * delta * mk
        gk = gk.float() - scale * pt  # P^T (delta q): the same correction of dk
    dk = gk.view(B, KV, rep, T, D).sum(2)
    if not rope_bias_fp32:
        dq, dk = dq.to(bf), dk.to(bf)
    cs, ss = (cos.float(), sin.float()) if rope_bias_fp32 else (cos, sin)
    dql = (dq * cs + rot_half_t(dq * ss)).transpose(1, 2).reshape(B * T, H * D)
    dkl = (dk * cs + rot_half_t(dk * ss)).transpose(1, 2).reshape(B * T, KV * D)
    return {"q_proj.bias": dql.sum(0).to(bf).double(), "k_proj.bias": dkl.sum(0).to(bf).double(),
            "q_proj.weight": (dql.to(bf).t() @ x.reshape(B*T, -1)).double()}

def rel(a, t): return ((a - t).norm() / t.norm()).item()

if __name__ == "__main__":
    bitwise_checks()
    if len(sys.argv) == 1:
        sys.argv += ["0", "1", "2"]
    for seed in map(int, sys.argv[1:]):
        cfg, attn, cap = setup(seed)
        truth, _ = module_grads(cfg, attn, cap, f64)
        eager, _ = module_grads(cfg, attn, cap, bf)
        vs = {"eager": eager, "engine": engine(cfg, attn, cap),
              "eng rope+bias fp32": engine(cfg, attn, cap, rope_bias_fp32=True),
              "eng D fp32 +rope fp32": engine(cfg, attn, cap, rope_bias_fp32=True, d_fp32=True),
              "eng fp32 bwd +rope fp32": engine(cfg, attn, cap, rope_bias_fp32=True, fp32_bwd=True)}
        for n in ("q_proj.bias", "k_proj.bias", "q_proj.weight"):
            print(f"seed {seed} {n:14s} |g| {truth[n].norm().item():.2e} " + " ".join(f"{k} {rel(g[n], truth[n]):.2e}" for k, g in vs.items()))
