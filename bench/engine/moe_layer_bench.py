#!/usr/bin/env python3
"""Forward + backward time of one mixture-of-experts decoder layer through the engine's block API,
with the expert GEMMs one per non-empty expert (OFFLOADD_EXPERT_GEMM=loop) and grouped
(at::_grouped_mm, =grouped), on the OLMoE-1B-7B and Qwen3-30B-A3B layer shapes; bf16, random
weights (router std 0.02: near-uniform routing), 1024-token rows. Prints a table: per shape and
tokens, each path's forward and backward ms, tokens/s, and grouped's speed-up over the loop.

    python3 bench/engine/moe_layer_bench.py --build-dir /tmp/gpu-build          # ~40 s on an H200
    python3 bench/engine/moe_layer_bench.py --build-dir build --device cpu --tiny  # CPU smoke run

The layer is offloadd-engine-layer-bench --experts E (bench/engine/layer_bench.cc): attention
(GQA as the shape) and the MoE feed-forward, experts packed [E, 2I, H] as the trainer's flat
buffers hold them; SaveMode keep; times are means over --iters after --warmup steps with device
syncs around each phase. --json writes all rows.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

SHAPES = {  # hidden, heads, kv heads, head_dim, experts, top-k, expert ffn, norm_topk_prob
    "olmoe-1b-7b": dict(hidden=2048, heads=16, kv_heads=16, head_dim=128, experts=64, top_k=8,
                        expert_ff=1024, norm_topk=0),
    "qwen3-30b-a3b": dict(hidden=2048, heads=32, kv_heads=4, head_dim=128, experts=128, top_k=8,
                          expert_ff=768, norm_topk=1),
    "tiny": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, expert_ff=32,
                 norm_topk=1),
}


def run(binary, shape, gemm, args):
    s = SHAPES[shape]
    cmd = [str(binary), "--device", args.device, "--dtype", args.dtype, "--seq", str(args.seq),
           "--batches", args.batches, "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--modes", "keep", "--hidden", str(s["hidden"]), "--heads", str(s["heads"]),
           "--kv-heads", str(s["kv_heads"]), "--head-dim", str(s["head_dim"]),
           "--experts", str(s["experts"]), "--top-k", str(s["top_k"]),
           "--expert-ff", str(s["expert_ff"]), "--norm-topk", str(s["norm_topk"])]
    env = dict(os.environ, OFFLOADD_EXPERT_GEMM=gemm)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if r.returncode != 0:
        print(f"error: {shape} {gemm}: {' '.join(cmd)}\n{r.stderr.strip()[-1500:]}", file=sys.stderr)
        return []
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    for x in rows:
        x.update(shape=shape, gemm=gemm)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default="build")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    p.add_argument("--shapes", default="olmoe-1b-7b,qwen3-30b-a3b")
    p.add_argument("--tiny", action="store_true", help="the tiny shape only (CPU smoke run)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batches", default="4,16", help="rows of --seq tokens, comma-separated")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=int, default=120, help="seconds per shape and path")
    p.add_argument("--json")
    args = p.parse_args()
    binary = pathlib.Path(args.build_dir) / "bench" / "engine" / "offloadd-engine-layer-bench"
    if not binary.exists():
        print(f"error: {binary} is not built (target offloadd-engine-layer-bench)", file=sys.stderr)
        return 2
    shapes = ["tiny"] if args.tiny else args.shapes.split(",")
    rows = []
    print(f"# one MoE decoder layer, fwd + bwd, {args.device} {args.dtype}, seq {args.seq}, "
          f"{args.iters} iterations after {args.warmup} warmup")
    print("| shape | tokens | loop fwd ms | loop bwd ms | grouped fwd ms | grouped bwd ms | "
          "loop tok/s | grouped tok/s | grouped / loop |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for shape in shapes:
        got = {g: {x["batch"]: x for x in run(binary, shape, g, args) if "error" not in x}
               for g in ("loop", "grouped")}
        rows += [x for g in got.values() for x in g.values()]
        for b in sorted(set(got["loop"]) | set(got["grouped"])):
            lo, gr = got["loop"].get(b), got["grouped"].get(b)
            f = lambda x, k: f"{x[k]:.2f}" if x else "-"  # noqa: E731
            t = lambda x: f"{x['tokens_per_s']:,.0f}" if x else "-"  # noqa: E731
            ratio = f"{gr['tokens_per_s'] / lo['tokens_per_s']:.2f}x" if lo and gr else "-"
            print(f"| {shape} | {b * args.seq} | {f(lo, 'fwd_ms')} | {f(lo, 'bwd_ms')} | {f(gr, 'fwd_ms')} | "
                  f"{f(gr, 'bwd_ms')} | {t(lo)} | {t(gr)} | {ratio} |", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
