#!/usr/bin/env python3
"""The largest Llama-shaped model each optimizer mode trains on a host of a given RAM (default 125
GiB, the H200 host's), as offloadd-train --validate-only's host-memory check says (the arena sized
by the mode, the workers, the loaded model's buffers: trainer/plan/trainer_plan.cc CheckHostMemory),
on the CPU: nothing is allocated, no GPU is needed. The optimizer states stay in RAM, or, with
--nvme-dir, go to the NVMe tier (--tier=nvme): the host limit then keeps as many blocks' states in
RAM as it holds and the store directory's free disk takes the rest, in each mode's own bytes (12 B
per parameter exact, 6.03 with int8 states), so the figure is RAM + disk.

    bench/optimizer_modes/capacity.py --build build [--host-memory 125GiB] [--nvme-dir DIR]
        [--json out.json]

For each mode and each Llama width (Llama-2-13B's 5120 and LLaMA-30B's 6656, with their FFN,
heads and vocabulary of 32,000), the most decoder layers that validate at micro-batch 1 of 1024
tokens (binary search up to 128), and the parameter count of that shape; the named shapes (13B,
30B) are marked as fitting or not. The CPU device's estimate: its activations count as host RAM
(on a GPU host they are on the GPU, and pinned staging buffers take their place). Prints a Markdown table (docs/optimizer-modes.md has it).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

MODES = ["fp32/fp32", "bf16/fp32", "int8/fp32", "int8/bf16"]
WIDTHS = {  # name: (hidden, ffn, heads, the named model's layers)
    "Llama-2-13B": (5120, 13824, 40, 40),
    "LLaMA-30B": (6656, 17920, 52, 60),
}
VOCAB = 32000


def params(hidden: int, ffn: int, layers: int) -> int:
    """Untied Llama: embedding and head, per layer q/k/v/o, gate/up/down and two norms, a final
    norm."""
    return 2 * VOCAB * hidden + layers * (4 * hidden * hidden + 3 * hidden * ffn + 2 * hidden) + hidden


def label(mode: str) -> str:
    state, master = mode.split("/")
    return "exact" if mode == "fp32/fp32" else f"{master} master, {state} states"


def validates(args, work: pathlib.Path, mode: str, hidden: int, ffn: int, heads: int,
              layers: int) -> tuple[bool, str]:
    model = work / f"m{hidden}x{layers}"
    model.mkdir(exist_ok=True)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=heads, vocab_size=VOCAB,
               max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
               tie_word_embeddings=False, torch_dtype="bfloat16")
    (model / "config.json").write_text(json.dumps(cfg))
    state, master = mode.split("/")
    cmd = [str(pathlib.Path(args.build) / "trainer" / "offloadd-train"), f"--model={model}",
           "--random-init", "--synthetic-seq=1024", "--batch-size=1", "--max-steps=1",
           "--device=cpu", "--dtype=bf16", f"--host-memory-limit={args.host_memory}",
           f"--state-dtype={state}", f"--master-dtype={master}", "--workers=1x2",
           f"--profile-dir={work / 'profile'}", "--validate-only"]
    if args.nvme_dir:
        cmd += ["--tier=nvme", f"--nvme-dir={pathlib.Path(args.nvme_dir) / 'capacity-store'}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return False, (r.stderr.strip().splitlines() or ["?"])[-1]
    host = re.search(r"host memory: (.*)", r.stderr)
    return True, host.group(1) if host else ""


def largest(args, work, mode, hidden, ffn, heads) -> tuple[int, str]:
    lo, hi = 0, args.max_layers + 1  # lo validates (0: none), hi does not
    ok, why = validates(args, work, mode, hidden, ffn, heads, 1)
    if not ok:
        return 0, why
    lo, note = 1, why
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, why = validates(args, work, mode, hidden, ffn, heads, mid)
        if ok:
            lo, note = mid, why
        else:
            hi = mid
    return lo, note


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--host-memory", default="125GiB")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--nvme-dir", default="",
                    help="the optimizer states on the NVMe tier, in a store under this directory "
                         "(its file system's free space is the disk)")
    ap.add_argument("--max-layers", type=int, default=128)
    ap.add_argument("--widths", default=",".join(WIDTHS), help="of " + ", ".join(WIDTHS))
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    disk = ""
    if args.nvme_dir:
        free = shutil.disk_usage(args.nvme_dir).free
        disk = f" + {free / 2**30:.0f} GiB free disk in {args.nvme_dir}"
    print(f"host memory {args.host_memory}{disk}", file=sys.stderr, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        work = pathlib.Path(d)
        for mode in args.modes.split(","):
            for name in args.widths.split(","):
                hidden, ffn, heads, named_layers = WIDTHS[name]
                layers, note = largest(args, work, mode, hidden, ffn, heads)
                rows.append({"mode": label(mode), "width": name, "max_layers": layers,
                             "params": params(hidden, ffn, layers),
                             "named_fits": layers >= named_layers, "named_layers": named_layers,
                             "host_memory": note})
                print(f"{label(mode)}: {name} width, {layers} layers ({rows[-1]['params'] / 1e9:.1f}B)",
                      file=sys.stderr, flush=True)
    widths = args.widths.split(",")
    print(f"| mode | {' | '.join(f'{w} width: most layers (parameters)' for w in widths)} |")
    print("|---|" + "---|" * len(widths))
    for mode in args.modes.split(","):
        cells = []
        for r in (x for x in rows if x["mode"] == label(mode)):
            fit = "fits" if r["named_fits"] else "does not fit"
            cells.append(f"{r['max_layers']} ({r['params'] / 1e9:.1f}B; {r['width']} {fit})")
        print(f"| {label(mode)} | {' | '.join(cells)} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"host_memory": args.host_memory, "disk": disk.lstrip(" +"), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
