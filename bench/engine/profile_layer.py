#!/usr/bin/env python3
"""Kernel breakdown of one Llama decoder layer's backward: transformers'
LlamaDecoderLayer (sdpa, built as bench_layer.py builds it) under torch.profiler, per CUDA kernel, summed over --iters backward
passes. The engine's block is profiled the same way by running offloadd-engine-layer-bench under
Nsight Systems (`nsys profile --stats=true`); this prints the reference side of that comparison.

    python3 bench/engine/profile_layer.py --batch 8 [--top 30]
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=11008)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    import transformers
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    dev, dtype = torch.device("cuda"), torch.bfloat16
    cfg = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                                   num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                                   num_hidden_layers=1, max_position_embeddings=4096, rms_norm_eps=1e-5,
                                   vocab_size=32000)
    cfg._attn_implementation = "sdpa"
    with torch.device(dev):
        layer = LlamaDecoderLayer(cfg, layer_idx=0).to(dtype)
        rope = LlamaRotaryEmbedding(cfg)
    layer.train()
    x = torch.randn(args.batch, args.seq, args.hidden, device=dev, dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x) * 1e-3
    pos = torch.arange(args.seq, device=dev).unsqueeze(0).expand(args.batch, -1)
    cos, sin = rope(x, pos)

    def fwd():
        y = layer(x, position_ids=pos, position_embeddings=(cos, sin))
        return y[0] if isinstance(y, tuple) else y

    for _ in range(args.warmup):
        fwd().backward(dy)
    torch.cuda.synchronize()
    ys = []
    for _ in range(args.iters):
        ys.append(fwd())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for y in ys:
            y.backward(dy)
        torch.cuda.synchronize()
    print(f"transformers-sdpa backward, batch {args.batch}, {args.iters} iters, per-kernel CUDA time:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.top, max_name_column_width=90))


if __name__ == "__main__":
    main()
