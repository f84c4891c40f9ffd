#!/usr/bin/env python3
"""Forward + backward time of one Llama-2-7B-shaped decoder layer: offloadd's engine block vs
transformers' LlamaDecoderLayer in PyTorch eager mode, same GPU, same run.

    ~/.cache/offloadd/venv/bin/python bench/engine/bench_layer.py --build-dir build
    # quick CPU smoke run with tiny shapes:
    bench_layer.py --build-dir build-engine --device cpu --dtype f32 --tiny

Both sides: bf16 parameters and activations, causal attention, input x [B, T, 4096] and random
upstream gradient; a step is layer forward then backward to the input and all 9 weights (what a
training step does per layer). transformers runs with attn_implementation "sdpa" (its default,
fused attention) and "eager" (explicit softmax), no torch.compile. offloadd runs its block API
with SaveMode keep (everything saved) and recompute (only the input saved; forward re-run
before backward). Times are means over --iters after --warmup steps, with device syncs around
each phase. Prints a table; --json also writes all rows.

Long sequences: --docs N packs each row as N equal documents (positions restart per document).
offloadd attends within documents (no [T, T] mask); transformers gets the block-diagonal causal
mask [B, 1, T, T] it needs for that. --impls picks the transformers attention implementations
(eager materialises [B, heads, T, T] scores: leave it out at long T). On CUDA every row reports
the allocator's peak over the timed steps (GiB, the layer's weights and inputs included).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_hf(args, attn_impl, batch, device, dtype):
    cfg = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                                   num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                                   num_hidden_layers=1,
                                   max_position_embeddings=max(4096, args.seq),
                                   rms_norm_eps=1e-5, vocab_size=32000)
    cfg._attn_implementation = attn_impl
    with torch.device(device):
        layer = LlamaDecoderLayer(cfg, layer_idx=0).to(dtype)
        rope = LlamaRotaryEmbedding(cfg)
    layer.train()
    x = torch.randn(batch, args.seq, args.hidden, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x) * 1e-3
    pos = torch.arange(args.seq, device=device).unsqueeze(0).expand(batch, -1)
    mask = None
    if args.docs > 1:  # block-diagonal causal mask, positions restarting per document
        length = -(-args.seq // args.docs)
        seg = torch.arange(args.seq, device=device) // length
        pos = (torch.arange(args.seq, device=device) % length).unsqueeze(0).expand(batch, -1)
        allowed = (seg[:, None] == seg[None, :]) & torch.ones(args.seq, args.seq, device=device,
                                                              dtype=torch.bool).tril()
        mask = torch.zeros(args.seq, args.seq, device=device, dtype=dtype)
        mask = mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None].expand(batch, 1, -1, -1)
        del allowed
    elif attn_impl == "eager":  # eager attention needs an explicit causal mask
        mask = torch.full((args.seq, args.seq), torch.finfo(dtype).min, device=device, dtype=dtype)
        mask = torch.triu(mask, 1)[None, None].expand(batch, 1, -1, -1)
    cos, sin = rope(x, pos)

    def step():
        t0 = time.perf_counter()
        y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
        y = y[0] if isinstance(y, tuple) else y
        sync(device)
        t1 = time.perf_counter()
        y.backward(dy)
        sync(device)
        t2 = time.perf_counter()
        x.grad = None
        for p in layer.parameters():
            p.grad = None
        return t1 - t0, t2 - t1

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    f = b = 0.0
    for _ in range(args.iters):
        df, db = step()
        f += df
        b += db
    f, b = 1e3 * f / args.iters, 1e3 * b / args.iters
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return {"impl": f"transformers-{attn_impl}", "mode": "autograd", "batch": batch, "seq": args.seq,
            "docs": args.docs, "fwd_ms": f, "bwd_ms": b, "total_ms": f + b,
            "tokens_per_s": batch * args.seq / ((f + b) / 1e3), "peak_gib": peak}


def bench_ours(args, build_dir):
    exe = pathlib.Path(build_dir) / "bench" / "engine" / "offloadd-engine-layer-bench"
    if not exe.exists():
        sys.exit(f"{exe} not built: ninja -C {build_dir} offloadd-engine-layer-bench")
    cmd = [str(exe), "--device", args.device, "--dtype", args.dtype, "--hidden", args.hidden,
           "--heads", args.heads, "--kv-heads", args.kv_heads, "--intermediate", args.intermediate,
           "--seq", args.seq, "--batches", ",".join(map(str, args.batches)), "--iters", args.iters,
           "--warmup", args.warmup, "--modes", "keep,recompute", "--docs", args.docs]
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{proc.stderr}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=os.environ.get("OFFLOADD_BINARY_DIR", "build"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=11008)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--docs", type=int, default=1, help="documents packed per row (default 1)")
    ap.add_argument("--impls", default="sdpa,eager", help="transformers attention implementations")
    ap.add_argument("--tiny", action="store_true", help="hidden 64, 4 heads, ff 172, seq 32, batches 1,2")
    ap.add_argument("--json", help="also write all rows to this file")
    args = ap.parse_args()
    if args.tiny:
        args.hidden, args.heads, args.kv_heads, args.intermediate, args.seq = 64, 4, 4, 172, 32
        args.batches = "1,2"
    args.batches = [int(b) for b in args.batches.split(",")]
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA not available (use --device cpu --dtype f32 --tiny for a smoke run)")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    rows = bench_ours(args, args.build_dir)
    for b in args.batches:
        for impl in args.impls.split(","):
            try:
                rows.append(bench_hf(args, impl, b, device, dtype))
            except torch.OutOfMemoryError:
                rows.append({"impl": f"transformers-{impl}", "mode": "autograd", "batch": b, "error": "OOM"})
            if device.type == "cuda":
                torch.cuda.empty_cache()

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# Llama decoder layer fwd+bwd: hidden {args.hidden}, heads {args.heads}/{args.kv_heads}, "
          f"ffn {args.intermediate}, seq {args.seq}, {args.docs} document(s) per row, {args.dtype}, "
          f"{name}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {args.iters} iters after {args.warmup} warmup")
    print(f"| batch | implementation | fwd ms | bwd ms | total ms | tokens/s | peak GiB | vs transformers-sdpa |")
    print(f"|---:|---|---:|---:|---:|---:|---:|---:|")
    for b in args.batches:
        ref = next((r for r in rows if r["batch"] == b and r["impl"] == "transformers-sdpa" and "error" not in r), None)
        for r in [r for r in rows if r["batch"] == b]:
            label = r["impl"] + ("" if r["impl"].startswith("transformers") else f" ({r['mode']})")
            if "error" in r:
                print(f"| {b} | {label} | {r['error']} | | | | | |")
                continue
            speed = f"{ref['total_ms'] / r['total_ms']:.2f}x" if ref else "-"
            print(f"| {b} | {label} | {r['fwd_ms']:.2f} | {r['bwd_ms']:.2f} | {r['total_ms']:.2f} | "
                  f"{r['tokens_per_s']:,.0f} | {r.get('peak_gib', 0):.2f} | {speed} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"device": name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
