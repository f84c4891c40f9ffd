#!/usr/bin/env python3
"""The README's sizing table, from the job validator's own estimate (offloadd-sizing, which calls
job/memory_estimate.cc) on the config.json of four public model shapes, so that the table
says what validation will ask.

    scripts/sizing_table.py [--build build]            print the table (Markdown)
    scripts/sizing_table.py --update README.md         rewrite it between the README's markers
    scripts/sizing_table.py --check README.md          exit 1 when the README's table differs

The shapes are those of the models' config.json (dimensions only: no weights are needed).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile

SOURCE = pathlib.Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- sizing-table: scripts/sizing_table.py -->", "<!-- /sizing-table -->"
BATCH, SEQ = 8, 2048

# name -> config.json fields (Hugging Face's, as published with each model)
SHAPES = {
    "Llama-3.2-1B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True,
                         max_position_embeddings=131072, rope_theta=500000.0),
    "Llama-2-7B": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False,
                       max_position_embeddings=4096, rope_theta=10000.0),
    "Llama-3.1-8B": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
                         max_position_embeddings=131072, rope_theta=500000.0),
    "Llama-2-13B": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                        num_key_value_heads=40, vocab_size=32000, tie_word_embeddings=False,
                        max_position_embeddings=4096, rope_theta=10000.0),
}


def gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def estimate(build: pathlib.Path, batch: int) -> list[dict]:
    tool = build / "daemon/offloadd-sizing"
    if not tool.exists():
        sys.exit(f"{tool} not found: cmake --build {build} --target offloadd-sizing")
    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for name, shape in SHAPES.items():
            d = pathlib.Path(tmp) / name
            d.mkdir()
            cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                       rms_norm_eps=1e-5, torch_dtype="bfloat16", **shape)
            (d / "config.json").write_text(json.dumps(cfg))
            dirs.append(str(d))
        r = subprocess.run([str(tool), f"--batch={batch}", f"--seq={SEQ}", *dirs], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(r.stderr)
        return [json.loads(line) for line in r.stdout.splitlines()]


def table(build: pathlib.Path) -> str:
    one, many = estimate(build, 1), estimate(build, BATCH)
    rows = ["| model | parameters | host RAM, states in RAM | host RAM, states on NVMe | NVMe | "
            f"GPU, batch 1 x {SEQ} | GPU, batch {BATCH} x {SEQ} | output_dir |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, a, b in zip(SHAPES, one, many):
        params = a["total_params"]
        # What validation checks against the host budget (the available RAM less a reserve by
        # default), the NVMe
        # store's two versions of the states, and a checkpoint plus the bf16 export.
        rows.append(f"| {name} | {params / 1e9:.2f} B | {gib(a['host_bytes_cpu'])} | {gib(a['host_bytes_nvme'])} | "
                    f"{gib(a['nvme_bytes'])} | {gib(a['gpu_floor_bytes'])} | {gib(b['gpu_floor_bytes'])} | "
                    f"{gib(a['checkpoint_bytes'] + 2 * params)} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=pathlib.Path, default=SOURCE / "build")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--update", type=pathlib.Path, metavar="README")
    group.add_argument("--check", type=pathlib.Path, metavar="README")
    args = ap.parse_args()
    text = table(args.build)
    target = args.update or args.check
    if not target:
        sys.stdout.write(text)
        return 0
    readme = target.read_text()
    m = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), readme, re.S)
    if not m:
        sys.exit(f"{target}: no {BEGIN} ... {END} block")
    if args.check:
        if m.group(1) != text:
            sys.stderr.write(f"{target}'s sizing table is not what the validator's estimate gives now; "
                             f"run scripts/sizing_table.py --update {target}\nexpected:\n{text}")
            return 1
        return 0
    target.write_text(readme[:m.start(1)] + text + readme[m.end(1):])
    return 0


if __name__ == "__main__":
    sys.exit(main())
