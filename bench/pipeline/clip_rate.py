#!/usr/bin/env python3
"""How often real fine-tuning clips at max_grad_norm 1.0, and what the speculation default buys.
Trains the same run twice, with the trainer's default speculation policy
(auto on a GPU, never on the CPU) and with --speculate=never (every update held to the end of
backward), and reports the clip rate (overall and past the first steps), the speculated and
corrected layers, s/step past the warm-up, and how far the two runs' losses drift apart.

    python3 bench/pipeline/clip_rate.py --device cpu --build build     # pretrained stories260K
    python3 bench/pipeline/clip_rate.py --device cuda --build build-gpu --data-dir DIR  # 1.1B

cpu: the pretrained stories260K fine-tuned on Alpaca and LIMA (bench/lsp/convergence.py's data,
fp32, cosine schedule with 5% warm-up). cuda: a 1.1B Llama shape (TinyLlama's) from random
initialisation on 4,500 Alpaca records (bench/lsp/convergence_gpu.py's data; DIR holds
alpaca_5000.json and Llama-2's tokenizer.json), bf16, lr 3e-4 constant, 6 GiB: no pretrained 1.1B
model reaches these machines, so "real" there means real records past the first steps.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench/lsp"))
sys.path.insert(0, str(ROOT / "bench/pipeline"))


def train(args, model: pathlib.Path, work: pathlib.Path, name: str, extra: list[str]) -> list[dict]:
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    stats = out / "stats.jsonl"
    cmd = [str(pathlib.Path(args.build) / "trainer/offloadd-train"), f"--model={model}",
           f"--data={work / 'train.jsonl'}", "--format=pretokenized", f"--device={args.device}",
           f"--batch-size={args.batch}", f"--max-steps={args.steps}", "--max-grad-norm=1.0", "--seed=7",
           f"--stats-jsonl={stats}", "--no-export", *extra]
    if args.device == "cpu":
        cmd += ["--dtype=fp32", f"--lr={args.lr or 1e-3}", "--scheduler=cosine",
                f"--warmup-steps={args.steps // 20}", "--workers=1x2"]
    else:
        cmd += ["--random-init", "--dtype=bf16", f"--lr={args.lr or 3e-4}", "--scheduler=constant",
                f"--gpu-memory-limit={args.budget}", "--workers=1x15"]
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{name} failed:\n{r.stderr[-3000:]}")
    plan = next((l.split("] ", 1)[-1] for l in r.stderr.splitlines() if "plan:" in l), "")
    print(f"{name}: {plan}", flush=True)
    return [json.loads(x) for x in stats.read_text().splitlines() if x.strip() and "loss" in json.loads(x)]


def summary(rows: list[dict], skip: int) -> dict:
    late = rows[skip:]
    mean = lambda xs: sum(xs) / max(1, len(xs))
    norms = sorted(r["grad_norm"] for r in late)
    return {"steps": len(rows), "clip_rate": mean([r["clipped"] for r in rows]),
            "clip_rate_after": mean([r["clipped"] for r in late]),
            "windows": [round(mean([r["clipped"] for r in rows[i:i + 25]]), 2) for i in range(0, len(rows), 25)],
            "grad_norm_median_after": norms[len(norms) // 2] if norms else None,
            "speculated_per_step": mean([r.get("speculated_layers", 0) for r in late]),
            "corrected_per_step": mean([r.get("corrected_layers", 0) for r in late]),
            "step_seconds_after": mean([r["step_seconds"] for r in late]),
            "tokens_per_second_after": sum(r["tokens"] for r in late) / max(1e-9, sum(r["step_seconds"] for r in late))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--build", default="build")
    p.add_argument("--data-dir", type=pathlib.Path, help="cuda: alpaca_5000.json and tokenizer.json")
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/offloadd-clip-rate"))
    p.add_argument("--steps", type=int, default=0, help="default 300 (cpu) / 150 (cuda)")
    p.add_argument("--skip", type=int, default=20, help="first steps left out of the 'after' figures")
    p.add_argument("--batch", type=int, default=0, help="default 16 (cpu) / 8 (cuda)")
    p.add_argument("--lr", type=float, default=0)
    p.add_argument("--budget", default="6GiB")
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args()
    args.steps = args.steps or (300 if args.device == "cpu" else 150)
    args.batch = args.batch or (16 if args.device == "cpu" else 8)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.device == "cpu":
        from convergence import prepare
        model = prepare(args.work, 256)
    else:
        from convergence_gpu import prepare
        model = prepare(args.data_dir, args.work, 512)
    runs = {"default": train(args, model, args.work, "default", []),
            "never": train(args, model, args.work, "never", ["--speculate=never"])}
    res = {name: summary(rows, args.skip) for name, rows in runs.items()}
    res["max_loss_diff"] = max(abs(a["loss"] - b["loss"]) for a, b in zip(runs["default"], runs["never"]))
    res["bitwise_equal_losses"] = all(a["loss"] == b["loss"] for a, b in zip(runs["default"], runs["never"]))
    print(json.dumps(res, indent=1))
    d, n = res["default"], res["never"]
    print(f"\n| device | speculation | clip rate (all / after step {args.skip}) | clipped per 25 steps | "
          f"speculated / corrected layers per step | s/step | tok/s |")
    print("|---|---|---|---|---|---|---|")
    for name, x in (("default", d), ("never", n)):
        print(f"| {args.device} | {name} | {x['clip_rate']:.0%} / {x['clip_rate_after']:.0%} | {x['windows']} | "
              f"{x['speculated_per_step']:.1f} / {x['corrected_per_step']:.1f} | {x['step_seconds_after']:.4f} | "
              f"{x['tokens_per_second_after']:.0f} |")
    print(f"largest |loss difference| default vs never: {res['max_loss_diff']:.3g} "
          f"(bitwise equal: {res['bitwise_equal_losses']})")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
