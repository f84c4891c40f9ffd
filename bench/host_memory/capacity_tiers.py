#!/usr/bin/env python3
"""The largest Llama-shaped model `offloadd-train --validate-only` accepts per tier mix of the
optimizer states, under a host memory limit and a store directory of a given free space, as a
fraction of the physical limit (limit + free disk) / 12 B (exact AdamW's fp32 master and two
moments). On the CPU: nothing is allocated and no GPU is needed.

    mount -t tmpfs -o size=50G tmpfs /tmp/store50   # a store directory with 50 GiB free
    bench/host_memory/capacity_tiers.py --build build --nvme-dir /tmp/store50 [--json out.json]

The host limit defaults to the idle H200 host's default (125.9 GiB of RAM, 2 GiB in use, less the
reserve max(4 GiB, 6%): 116.3 GiB). For each mix, the most decoder layers of Llama-3-8B's width
(4096, FFN 14336, 32 heads, 8 KV heads, vocabulary 128,256, untied head) that validate at
micro-batch 1 of --seq tokens (binary search), the shape's parameters, the validator's capacity
line (job/capacity.h: the bytes per parameter the plan holds, part by part) and the fraction.
The CPU device differs from a GPU host in two ways, both small here: its activations count as
host RAM, and no CUDA context (1.5 GiB) is counted. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

HIDDEN, FFN, HEADS, KV, VOCAB = 4096, 14336, 32, 8, 128256
MIXES = {  # name: offloadd-train flags (the store directory is added to the NVMe ones)
    "states in RAM": ["--tier=cpu"],
    "states per block in RAM or on NVMe": ["--tier=nvme"],
    "and 16-bit weights on NVMe where RAM needs it": ["--tier=nvme", "--param-tier=auto"],
    "int8 states in RAM (not exact)": ["--tier=cpu", "--state-dtype=int8"],
}


def h200_default_limit() -> int:
    total = 132017844 * 1024  # MemTotal 125.9 GiB
    return total - 2 * 2**30 - max(4 * 2**30, total // 100 * 6)


def params(layers: int) -> int:
    kv = HIDDEN // HEADS * KV
    layer = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * kv + 3 * HIDDEN * FFN + 2 * HIDDEN
    return 2 * VOCAB * HIDDEN + layers * layer + HIDDEN


def validates(args, work: pathlib.Path, flags: list[str], layers: int) -> tuple[bool, str]:
    model = work / f"m{layers}"
    model.mkdir(exist_ok=True)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=layers,
               num_attention_heads=HEADS, num_key_value_heads=KV, vocab_size=VOCAB,
               max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
               tie_word_embeddings=False, torch_dtype="bfloat16")
    (model / "config.json").write_text(json.dumps(cfg))
    cmd = [str(pathlib.Path(args.build) / "trainer" / "offloadd-train"), f"--model={model}",
           "--random-init", f"--synthetic-seq={args.seq}", "--batch-size=1", "--max-steps=1",
           "--device=cpu", "--dtype=bf16", f"--host-memory-limit={args.host_memory_limit}",
           "--workers=1x1", f"--profile-dir={work / 'profile'}", "--validate-only", *flags]
    cmd.append(f"--nvme-dir={args.nvme_dir}")  # the node's disk, for every mix
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        return False, (r.stderr.strip().splitlines() or ["?"])[-1]
    host = re.search(r"host memory: (.*)", out)
    return True, host.group(1) if host else ""


def largest(args, work, flags) -> tuple[int, str, str]:
    ok, note = validates(args, work, flags, 1)
    if not ok:
        return 0, note, note
    lo, hi = 1, 129  # lo validates, hi does not
    refusal = ""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, why = validates(args, work, flags, mid)
        if ok:
            lo, note = mid, why
        else:
            hi, refusal = mid, why
    return lo, note, refusal


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--nvme-dir", required=True, help="a store directory (its free space counts)")
    ap.add_argument("--host-memory-limit", type=int, default=h200_default_limit())
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    fs = os.statvfs(args.nvme_dir)
    free = fs.f_bavail * fs.f_frsize
    limit_params = (args.host_memory_limit + free) / 12  # exact AdamW's physical limit
    print(f"host memory limit {args.host_memory_limit / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free "
          f"in {args.nvme_dir}: (limit + free) / 12 B = {limit_params / 1e9:.2f} B parameters",
          file=sys.stderr, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        work = pathlib.Path(d)
        for name in args.mixes.split(","):
            layers, host, refusal = largest(args, work, MIXES[name])
            cap = re.search(r"capacity: ([\d.]+) B parameters, ([\d.]+)% of the ([\d.]+) B .*?"
                            r"the plan holds ([\d.]+) B per parameter", host)
            rows.append({"mix": name, "layers": layers, "params": params(layers),
                         "percent_of_exact_limit": 100 * params(layers) / limit_params,
                         "capacity_percent": float(cap.group(2)) if cap else None,
                         "limit_params_b": float(cap.group(3)) if cap else None,
                         "held_bytes_per_param": float(cap.group(4)) if cap else None,
                         "host_memory": host, "next_layer_refused": refusal})
            print(f"{name}: {layers} layers, {params(layers) / 1e9:.2f} B; {host}\n"
                  f"  {layers + 1} layers: {refusal}", file=sys.stderr, flush=True)
    print(f"| tier mix | most layers (parameters) | % of (limit + free disk) / 12 B = "
          f"{limit_params / 1e9:.2f} B | B per parameter held (RAM + disk) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['mix']} | {r['layers']} ({r['params'] / 1e9:.2f} B) | "
              f"{r['percent_of_exact_limit']:.1f}% | {r['held_bytes_per_param']} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"host_memory_limit": args.host_memory_limit, "nvme_dir": args.nvme_dir,
             "free_bytes": free, "seq": args.seq, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
