#!/usr/bin/env python3
"""Runs offloadd-workers-bench and torch.optim.AdamW on the same parameter count and prints one
table: STREAM copy/triad, an "AdamW-shaped copy" (the same five streams and 28 B/param as the
update, with trivial arithmetic: the bandwidth roof for this access pattern), the fused kernel per
code path and thread count, the worker's ShardExecutor in process (chunks, step counters, with
and without redo slots, alternating run by run), the WorkerPool across processes, and
PyTorch's CPU AdamW (fused=True, foreach=True, default) at the same thread counts, and the compact
optimizer modes (docs/optimizer-modes.md) at their own bytes per parameter.

    run_bench.py --build build-workers --params 67108864 --repeats 5 [--threads 1,2] [--pool 1x2,2x1]

PyTorch updates fp32 params with fp32 grads in place (4 + 12 + 12 = 28 B/param, the same count as
our bf16-grad kernel that also writes a bf16 weight copy); "torch fused + bf16 copy" adds the
param.to(bfloat16) copy the GPU would need (+6 B/param counted, but reported per 28 B like the
rest so the GB/s columns compare the same work).
"""
import argparse
import json
import os
import pathlib
import platform
import subprocess
import time

import torch

BYTES_PER_PARAM = 28


def torch_adamw(n, threads, repeats, mode):
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n) * 1e-3
    kwargs = {"fused": True} if mode.startswith("fused") else {"foreach": mode == "foreach"}
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, **kwargs)
    copy = torch.empty(n, dtype=torch.bfloat16) if mode == "fused+bf16" else None
    times = []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        opt.step()
        if copy is not None:
            copy.copy_(p.detach())
        if r:
            times.append(time.perf_counter() - t0)
    return min(times), sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-workers")
    ap.add_argument("--params", type=int, default=64 << 20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", default=None, help="e.g. 1,2,4 (default: powers of two up to nproc)")
    ap.add_argument("--pool", default=None, help="e.g. 1x16,2x8 (default: 1xN, 2xN/2)")
    args = ap.parse_args()
    ncpu = len(os.sched_getaffinity(0))
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted(
        {1 << i for i in range(ncpu.bit_length()) if (1 << i) <= ncpu} | {ncpu})
    cmd = [str(pathlib.Path(args.build) / "bench/workers/offloadd-workers-bench"),
           f"--params={args.params}", f"--repeats={args.repeats}",
           "--threads=" + ",".join(map(str, threads))]
    if args.pool:
        cmd.append(f"--pool={args.pool}")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    triad = {r["threads"]: r["gbps"] for r in rows if r["bench"] == "stream_triad"}
    best_triad = max(triad.values())
    shape = max(r["gbps"] for r in rows if r["bench"] == "stream_adamw_shape")
    table = []
    for r in rows:
        if r["bench"].startswith("stream"):
            table.append((r["bench"], f"{r['threads']} thr", "", f"{r['gbps']:.1f}",
                          f"{r['gbps_median']:.1f}", ""))
        elif r["bench"] == "adamw_kernel":
            table.append((f"kernel {r['path']}", f"{r['threads']} thr",
                          f"{r['params_per_s'] / 1e9:.3f}", f"{r['gbps']:.1f}",
                          f"{r['gbps_median']:.1f}", f"{100 * r['gbps'] / best_triad:.0f}%"))
        elif r["bench"] == "adamw_compact":  # GB/s at the mode's own bytes per parameter
            table.append((f"compact {r['master_dtype']} master, {r['state_dtype']} states "
                          f"{r['path']} ({r['bytes_per_param']:.2f} B/param)", f"{r['threads']} thr",
                          f"{r['gparams_per_s']:.3f}", f"{r['gbps']:.1f}",
                          f"{r['gbps_median']:.1f}", f"{100 * r['gbps'] / best_triad:.0f}%"))
        elif r["bench"] == "adamw_executor":
            cc = "redo" if r["crash_consistent"] else "no-redo"
            table.append((f"executor {r['path']} {cc}", f"{r['threads']} thr",
                          f"{r['params_per_s'] / 1e9:.3f}", f"{r['gbps']:.1f}",
                          f"{r['gbps_median']:.1f}", f"{100 * r['gbps'] / best_triad:.0f}%"))
        elif r["bench"] == "adamw_pool":
            cc = "redo" if r["crash_consistent"] else "no-redo"
            table.append((f"pool {r['path']} {cc}", f"{r['processes']}x{r['threads']}",
                          f"{r['params_per_s'] / 1e9:.3f}", f"{r['gbps']:.1f}",
                          f"{r['gbps_median']:.1f}", f"{100 * r['gbps'] / best_triad:.0f}%"))
    for t in threads:
        for mode in ("fused", "foreach", "default", "fused+bf16"):
            best, median = torch_adamw(args.params, t, args.repeats, mode)
            table.append((f"torch AdamW {mode}", f"{t} thr", f"{args.params / best / 1e9:.3f}",
                          f"{BYTES_PER_PARAM * args.params / best / 1e9:.1f}",
                          f"{BYTES_PER_PARAM * args.params / median / 1e9:.1f}",
                          f"{100 * BYTES_PER_PARAM * args.params / best / 1e9 / best_triad:.0f}%"))
    table = [row + ((f"{100 * float(row[3]) / shape:.0f}%" if row[2] else ""),) for row in table]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    print(f"# {cpu}, {ncpu} cpus, {args.params} params, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.1f}")
    header = ("what", "config", "Gparam/s", "GB/s best", "GB/s median", "% of triad",
              "% of AdamW-shaped copy")
    widths = [max(len(str(x[i])) for x in table + [header]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths)] + table:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |")


if __name__ == "__main__":
    main()
