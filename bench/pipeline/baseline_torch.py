#!/usr/bin/env python3
"""PyTorch eager baseline for full fine-tuning on one GPU (issue #6): a transformers Llama with fp32
master weights, fused AdamW, gradient and optimizer states all in GPU memory, gradient
checkpointing and bf16 autocast. The offloaded pipeline is compared against these figures.

    # GPU machine (llama2-7b needs ~16 bytes/parameter = ~108 GB: an H200, not an H100):
    ~/.cache/offloadd/venv/bin/python bench/pipeline/baseline_torch.py --shape tinyllama-1.1b --batch 1,2,4,8
    # CPU smoke run:
    ~/.cache/offloadd/venv/bin/python bench/pipeline/baseline_torch.py --shape tiny --device cpu --steps 2

One step = --grad-accum micro-batches of [batch, seq] random tokens (seeded), forward under
torch.autocast(bf16) with labels = inputs, backward, clip_grad_norm_(1.0), AdamW step. Model
random-initialised from the shape's config (weights do not change the speed). Times are means over
--steps after --warmup steps, with device syncs around each step. Each batch size runs in turn in
one process; a batch that runs out of memory is reported as "oom" and the next one still runs.
Prints a Markdown table; --json also writes all rows.

Model FLOPs follow offloadd's engine (Block::EstimateCost): per token and layer
2*h*(2*q_dim + 2*kv_dim + 3*ffn) plus causal attention 2*heads*seq*head_dim, plus the LM head
2*h*vocab; times 3 for forward + backward; recomputation is not counted (model FLOPs, as in MFU).
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time

import torch
import transformers

SHAPES = {
    "llama2-7b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, intermediate_size=11008, vocab_size=32000),
    "tinyllama-1.1b": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, intermediate_size=5632, vocab_size=32000),
    # About 1M parameters (4 MB in fp32): for CPU smoke runs only.
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=344, vocab_size=2048),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama2-7b")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence (default 1024)")
    p.add_argument("--batch", default="1", help="micro-batch sizes, comma-separated (default 1)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps first (default 2)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attn", default="sdpa", help="transformers attn_implementation (default sdpa)")
    p.add_argument("--no-checkpointing", action="store_true", help="keep all activations")
    p.add_argument("--no-autocast", action="store_true", help="run in fp32")
    p.add_argument("--peak-tflops", type=float, default=0,
                   help="peak dense bf16 TFLOP/s of the device, for MFU (H100/H200 SXM: 989)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    args = p.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batch.split(",")]
    except ValueError:
        p.error(f"--batch: expected comma-separated integers, got {args.batch!r}")
    for name in ("seq", "grad_accum", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or any(b < 1 for b in args.batches):
        p.error("--warmup must be >= 0 and every --batch >= 1")
    return args


def model_config(args) -> transformers.LlamaConfig:
    cfg = transformers.LlamaConfig(**SHAPES[args.shape], max_position_embeddings=max(args.seq, 4096),
                                   rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                                   use_cache=False)
    cfg._attn_implementation = args.attn
    return cfg


def model_flops_per_step(cfg, batch: int, seq: int) -> float:
    h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = h // heads
    q_dim, kv_dim = heads * head_dim, kv * head_dim
    tokens = batch * seq
    layer = 2 * tokens * h * (2 * q_dim + 2 * kv_dim + 3 * cfg.intermediate_size) \
        + 2 * batch * heads * seq * seq * head_dim  # causal attention: half of QK^T and PV
    head = 2 * tokens * h * cfg.vocab_size
    return 3.0 * (cfg.num_hidden_layers * layer + head)


def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_batch(args, cfg, device: torch.device, batch: int) -> dict:
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg)  # fp32 parameters: the master weights
    model.train()
    if not args.no_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        assert model.is_gradient_checkpointing, "transformers did not enable gradient checkpointing"
    if device.type == "cuda":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=True)
    gen = torch.Generator().manual_seed(args.seed)

    def step():
        loss_sum = 0.0
        for _ in range(args.grad_accum):
            ids = torch.randint(0, cfg.vocab_size, (batch, args.seq), generator=gen).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not args.no_autocast):
                loss = model(input_ids=ids, labels=ids).loss / args.grad_accum
            loss.backward()
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss_sum, grad_norm

    for _ in range(args.warmup):
        step()
    sync(device)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss, grad_norm = step()
        sync(device)
        times.append(time.perf_counter() - t0)

    step_s = sum(times) / len(times)
    tokens = batch * args.seq * args.grad_accum
    flops = model_flops_per_step(cfg, batch, args.seq) * args.grad_accum
    row = {"status": "ok", "batch": batch, "grad_accum": args.grad_accum, "seq": args.seq,
           "tokens_per_step": tokens, "step_s": step_s, "step_s_min": min(times),
           "step_s_max": max(times), "tokens_per_s": tokens / step_s,
           "model_tflops_per_s": flops / step_s / 1e12, "loss": float(loss),
           "grad_norm": float(grad_norm)}
    if args.peak_tflops > 0:
        row["mfu"] = row["model_tflops_per_s"] / args.peak_tflops
    if device.type == "cuda":
        row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return row


def release(device: torch.device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def gib(n) -> str:
    return f"{n / 2**30:.1f}" if n is not None else "-"


def print_row(r: dict):
    if r["status"] != "ok":
        print(f"| {r['batch']} | {r['grad_accum']} | {r['status']} | - | - | - | - | - |", flush=True)
        return
    mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
    print(f"| {r['batch']} | {r['grad_accum']} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | "
          f"{r['model_tflops_per_s']:.3g} | {mfu} | {gib(r.get('peak_allocated_bytes'))} | "
          f"{r['loss']:.3f} |", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device (use --device cpu for a smoke run)",
              file=sys.stderr)
        return 2
    cfg = model_config(args)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in transformers.LlamaForCausalLM(cfg).parameters())
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    env = {"shape": args.shape, "params": n_params, "device": device_name, "torch": torch.__version__,
           "transformers": transformers.__version__, "attn": args.attn,
           "checkpointing": not args.no_checkpointing, "autocast_bf16": not args.no_autocast,
           "steps": args.steps, "warmup": args.warmup, "seed": args.seed}
    print(f"# PyTorch eager baseline: {args.shape} ({n_params / 1e6:,.1f}M parameters, fp32 weights + "
          f"grads + AdamW states = {16 * n_params / 2**30:.1f} GiB), seq {args.seq}, {device_name}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, attn {args.attn}, "
          f"checkpointing {'on' if env['checkpointing'] else 'off'}, "
          f"autocast {'bf16' if env['autocast_bf16'] else 'off'}, {args.steps} steps after "
          f"{args.warmup} warmup")
    print("| batch | grad accum | step s | tokens/s | model TFLOP/s | MFU | peak GiB | loss |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)

    rows = []
    for batch in args.batches:
        release(device)
        try:
            row = run_batch(args, cfg, device, batch)
        except torch.OutOfMemoryError:
            row = {"status": "oom", "batch": batch, "grad_accum": args.grad_accum, "seq": args.seq}
        rows.append(row)
        print_row(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)
    return 0 if any(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
