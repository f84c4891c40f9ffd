#!/usr/bin/env python3
"""Where a 16-bit attention backward's error comes from, with a RoPE-rotated k bias (qwen2's q/k
biases): the fused kernels form dS = P (dP - D) with D = rowsum(dO * out) from the 16-bit output.
This measures, against float64 on the same bf16-rounded inputs, the relative error of dq, dk, dv of

  centred      the engine's path: k and v less their per-sequence means (engine/ops.cc), the
               kernel's backward as is (D from the bf16 output)
  D fp32       the same, with D taken from an fp32 forward's output: the kernel's dS corrected by
               P * (D_kernel - D_fp32), i.e. dq -= scale * delta * attention(q, k, k) and
               dk -= scale * P^T (delta * q), delta = rowsum(dO * (out_fp32 - out_bf16))
  fp32 bwd     the whole backward in fp32 on the centred bf16 inputs (what D fp32 can reach at best)
  eager bf16   transformers' eager attention in bf16 (the parity tests' yardstick)

on the CPU (ATen's flash kernel for CPU: its backward takes D from `out` as CUDA's do) or on
CUDA (--device cuda: the flash / efficient kernels through SDPA's ops).

    python3 bench/engine/attention_d_rounding.py [--k-bias 20 --v-bias 12 --seq 256 --device cpu]
"""
import argparse
import math

import torch


def rope(x, theta=10000.0):
    d = x.shape[-1]
    half = d // 2
    inv = 1.0 / (theta ** (torch.arange(half, dtype=torch.float64) / half))
    ang = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.device), torch.cat([ang.sin()] * 2, -1).to(x.device)
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--q-bias", type=float, default=3.0)
    ap.add_argument("--k-bias", type=float, default=20.0)
    ap.add_argument("--v-bias", type=float, default=12.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    dev, f64, bf = a.device, torch.float64, torch.bfloat16
    shape = (1, a.heads, a.seq, a.head_dim)
    rnd = lambda s: torch.randn(shape, dtype=f64, device=dev) + s * torch.randn(a.head_dim, dtype=f64, device=dev)
    q, k, v = rope(rnd(a.q_bias)), rope(rnd(a.k_bias)), rnd(a.v_bias)
    q, k, v, do = (t.to(bf) for t in (q, k, v, torch.randn(shape, dtype=f64, device=dev)))
    scale = 1 / math.sqrt(a.head_dim)
    causal = torch.ones(a.seq, a.seq, dtype=torch.bool, device=dev).triu(1)

    def autograd(q, k, v, do, eager):
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        s = (q @ k.transpose(-1, -2) * scale).masked_fill(causal, float("-inf"))
        p = s.softmax(-1, dtype=torch.float32).to(q.dtype) if eager else s.softmax(-1)
        (p @ v).backward(do)
        return q.grad, k.grad, v.grad

    exact = autograd(q.double(), k.double(), v.double(), do.double(), eager=False)

    def err(g):
        return " ".join(f"{n} {((x.double() - e).norm() / e.norm()).item():.3e}" for n, x, e in zip("qkv", g, exact))

    if dev == "cpu":
        fwd = lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, True, attn_mask=None, scale=scale)
        bwd = lambda do, q, k, v, o, lse: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do, q, k, v, o, lse, 0.0, True, attn_mask=None, scale=scale)
    else:
        def fwd(q, k, v):
            r = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, is_causal=True, scale=scale)
            return r[0], (r[1], r[2], r[3])
        def bwd(do, q, k, v, o, aux):
            r = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
                do, q, k, v, None, o, aux[0], aux[1], aux[2], 0.0, [True, True, True, False],
                is_causal=True, scale=scale)
            return r[0], r[1], r[2]
    km, vm = k.float().mean(2, keepdim=True), v.float().mean(2, keepdim=True)
    kc, vc = (k.float() - km).to(bf), (v.float() - vm).to(bf)
    out, aux = fwd(q, kc, vc)
    g = bwd(do, q, kc, vc, out, aux)
    print(f"centred      {err(g)}")
    q32, kc32, vc32, do32 = q.float(), kc.float(), vc.float(), do.float()
    out32, aux32 = fwd(q32, kc32, vc32)
    delta = (do32 * (out32 - out.float())).sum(-1, keepdim=True)
    mean_key, _ = fwd(q32, kc32, kc32)
    pt = bwd((delta * q32).contiguous(), q32, kc32, vc32, out32, aux32)[2]
    print(f"D fp32       {err((g[0].float() - scale * delta * mean_key, g[1].float() - scale * pt, g[2]))}")
    print(f"fp32 bwd     {err(bwd(do32, q32, kc32, vc32, out32, aux32))}")
    print(f"eager bf16   {err(autograd(q, k, v, do, eager=True))}")


if __name__ == "__main__":
    main()
