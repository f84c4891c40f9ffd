#!/usr/bin/env python3
"""Convergence of the compact optimizer modes on a GPU (docs/optimizer-modes.md): TinyLlama-1.1B's
shape (bench/pipeline/baseline_torch.py SHAPES["tinyllama-1.1b"]) from random initialisation,
trained by offloadd-train on real Alpaca records (../shared/data/alpaca, Llama 2 tokenizer), 300
steps, the held-out loss on 128 records every 50 steps; one mode per process, so that four modes
run at once on four GPUs of one host. Every block's AdamW states on the GPU
(--device-optimizer-blocks=all): the compact modes step there with the CUDA kernel
(trainer/pipeline/cuda/compact_adamw.cu), exact with ATen's fused AdamW. Builds nothing.

    # all four modes at once on GPUs 0-3, then the summary (JSON + PNG):
    bench/optimizer_modes/convergence_gpu.py all --build /tmp/gpu-build --out /tmp/conv
    # or by hand: prepare once, one run per GPU, then summarize
    bench/optimizer_modes/convergence_gpu.py prepare --out /tmp/conv
    CUDA_VISIBLE_DEVICES=1 bench/optimizer_modes/convergence_gpu.py run --mode int8/fp32 \
        --build /tmp/gpu-build --out /tmp/conv
    bench/optimizer_modes/convergence_gpu.py summarize --out /tmp/conv
    # the PNG where matplotlib is, from the JSON alone
    bench/optimizer_modes/convergence_gpu.py plot --out DIR_WITH_convergence_gpu.json

A step is micro-batch 16 of records cut at 512 tokens (Alpaca's records average about 180
Llama 2 tokens, so a padded batch is about 4-8k tokens): about 0.2-0.35 s on an H200 with every
state on the GPU, so 300 steps plus startup and the evaluations take about 2-3 minutes per mode.
bf16 compute, AdamW lr 3e-4 (cosine, 30 warmup steps), weight decay 0.1, clipping at 1.0, seed 7;
every mode starts from the same weights (the seed) and sees the same batches.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "bench" / "pipeline"))
from baseline_torch import SHAPES, hf_config_dict  # noqa: E402

# state/master: exact, the two state formats with an fp32 master, and the smallest mode.
DEFAULT_MODES = ["fp32/fp32", "bf16/fp32", "int8/fp32", "int8/bf16"]
HELD_OUT = 128


def label(mode: str) -> str:
    state, master = mode.split("/")
    return "exact" if mode == "fp32/fp32" else f"{master} master, {state} states"


def tag(mode: str) -> str:
    return mode.replace("/", "-")


def shared_data(arg: str) -> pathlib.Path:
    """../shared/data beside the checkout, or shared/data inside it (the GPU machine's copy)."""
    if arg:
        return pathlib.Path(arg)
    for p in (ROOT / "shared" / "data", ROOT.parent / "shared" / "data"):
        if (p / "alpaca").is_dir():
            return p
    sys.exit("no shared/data with alpaca/ found: pass --shared-data")


def prepare(args) -> pathlib.Path:
    """The model directory (config.json and the Llama 2 tokenizer) and the train / held-out
    splits as JSONL, under --out."""
    out = pathlib.Path(args.out)
    data = shared_data(args.shared_data)
    model = out / "model"
    model.mkdir(parents=True, exist_ok=True)
    # The Llama 2 tokenizer's 32,000 ids (the default shape's vocabulary; --shape tiny, for a CPU
    # smoke run, is widened to it).
    cfg = dict(hf_config_dict(args.shape, args.seq), initializer_range=0.02,
               torch_dtype="bfloat16", vocab_size=32000)
    (model / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
        (model / f).unlink(missing_ok=True)  # a copy from an earlier call may be read-only
        shutil.copyfile(data / "tokenizers" / "llama2" / f, model / f)
    records = json.loads((data / "alpaca" / "alpaca_5000.json").read_text())
    for name, part in (("train", records[:-HELD_OUT]), ("held_out", records[-HELD_OUT:])):
        with open(out / f"{name}.jsonl", "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")
    return out


def train_command(args, mode: str, out: pathlib.Path) -> list[str]:
    state, master = mode.split("/")
    run = out / tag(mode)
    run.mkdir(parents=True, exist_ok=True)
    return [str(pathlib.Path(args.build) / "trainer" / "offloadd-train"), f"--model={out / 'model'}",
            "--random-init", f"--data={out / 'train.jsonl'}", "--format=alpaca",
            f"--eval-data={out / 'held_out.jsonl'}", f"--eval-steps={args.eval_every}",
            f"--max-seq-length={args.seq}", f"--batch-size={args.batch}",
            f"--max-steps={args.steps}", f"--device={args.device}", "--dtype=bf16", "--lr=3e-4",
            "--scheduler=cosine", "--warmup-steps=30", "--weight-decay=0.1", "--max-grad-norm=1.0",
            "--seed=7", f"--state-dtype={state}", f"--master-dtype={master}",
            # every block: the embedding, the decoder layers and the head
            f"--device-optimizer-blocks={SHAPES[args.shape]['num_hidden_layers'] + 2}",
            f"--stats-jsonl={run / 'stats.jsonl'}"]


def run_mode(args) -> int:
    out = pathlib.Path(args.out)
    if not (out / "model" / "config.json").exists():
        prepare(args)
    cmd = train_command(args, args.mode, out)
    print("$", " ".join(cmd), flush=True)
    log = out / tag(args.mode) / "train.log"
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    tail = log.read_text().splitlines()[-5:]
    print("\n".join(tail))
    return r.returncode


def run_all(args) -> int:
    """Every mode at once, one GPU each (CUDA_VISIBLE_DEVICES), then the summary."""
    out = prepare(args)
    modes = args.modes.split(",")
    procs = []
    for gpu, mode in enumerate(modes):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu % max(1, args.gpus)))
        cmd = [sys.executable, __file__, "run", f"--mode={mode}", f"--build={args.build}",
               f"--shape={args.shape}", f"--device={args.device}",
               f"--out={out}", f"--steps={args.steps}", f"--batch={args.batch}", f"--seq={args.seq}",
               f"--eval-every={args.eval_every}"]
        procs.append((mode, subprocess.Popen(cmd, env=env)))
    failed = [m for m, p in procs if p.wait() != 0]
    summarize(args)
    if failed:
        print("failed:", ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


def read_run(out: pathlib.Path, mode: str) -> dict | None:
    path = out / tag(mode) / "stats.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "loss" in r]
    evals = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
    timed = steps[5:] or steps  # past the kernels' warm-up
    return {"mode": label(mode), "state_dtype": mode.split("/")[0],
            "master_dtype": mode.split("/")[1], "held_out": evals,
            "train_loss": [r["loss"] for r in steps],
            "step_seconds": sum(r["step_seconds"] for r in timed) / max(1, len(timed)),
            "gpu_peak_gib": max((r.get("gpu_peak_bytes", 0) for r in steps), default=0) / 2**30}


def summarize(args) -> int:
    out = pathlib.Path(args.out)
    runs = [r for r in (read_run(out, m) for m in args.modes.split(",")) if r and r["held_out"]]
    if not runs:
        print("no runs with held-out losses under", out, file=sys.stderr)
        return 1
    exact = next((dict(r["held_out"]) for r in runs if r["mode"] == "exact"), None)
    summary = {}
    for r in runs:
        step, loss = r["held_out"][-1]
        s = {"final_step": step, "final_held_out": loss, "step_seconds": r["step_seconds"],
             "gpu_peak_gib": r["gpu_peak_gib"]}
        if exact and step in exact:
            s["vs_exact_percent"] = 100 * (loss / exact[step] - 1)
        summary[r["mode"]] = s
    config = {"shape": args.shape, "steps": args.steps, "batch": args.batch, "seq": args.seq,
              "eval_every": args.eval_every, "held_out_records": HELD_OUT}
    (out / "convergence_gpu.json").write_text(
        json.dumps({"config": config, "summary": summary, "runs": runs}, indent=1))
    try:
        plot(runs, exact, args.shape, out / "convergence_gpu.png")
    except ImportError as e:  # no matplotlib on the machine: the JSON has every number
        print(f"no plot ({e}): render it where matplotlib is with `{pathlib.Path(__file__).name} "
              f"plot --out DIR` beside convergence_gpu.json", file=sys.stderr)
    for k, v in summary.items():
        vs = f"{v['vs_exact_percent']:+.2f}%" if "vs_exact_percent" in v else "n/a"
        print(f"{k:28s} held-out {v['final_held_out']:.4f} at step {v['final_step']}  vs exact {vs}"
              f"  {v['step_seconds']:.3f} s/step  GPU peak {v['gpu_peak_gib']:.1f} GiB")
    return 0


def plot(runs, exact, shape, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in runs:
        steps = [s for s, _ in r["held_out"]]
        a.plot(steps, [l for _, l in r["held_out"]], marker="o", label=r["mode"])
        if exact:
            pts = [(s, 100 * (l / exact[s] - 1)) for s, l in r["held_out"] if s in exact]
            b.plot([s for s, _ in pts], [d for _, d in pts], marker="o", label=r["mode"])
    a.set_xlabel("step")
    a.set_ylabel("held-out loss (nats/token)")
    a.set_title(f"{shape} from random init on Alpaca")
    b.set_xlabel("step")
    b.set_ylabel("held-out loss vs exact (%)")
    b.axhline(1, color="grey", ls=":")
    b.axhline(-1, color="grey", ls=":")
    for ax in (a, b):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["prepare", "run", "summarize", "all", "plot"])
    ap.add_argument("--build", default=os.environ.get("OFFLOADD_BUILD_DIR", "/tmp/gpu-build"))
    ap.add_argument("--out", default="/tmp/offloadd-convergence-gpu")
    ap.add_argument("--shared-data", default="", help="shared/data (default: found beside the checkout)")
    ap.add_argument("--shape", default="tinyllama-1.1b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda", help="cuda (one GPU per process) or cpu (smoke runs)")
    ap.add_argument("--mode", default="int8/fp32", help="run: state/master")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help="all / summarize: state/master,...")
    ap.add_argument("--gpus", type=int, default=4, help="all: GPUs to spread the modes over")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--eval-every", type=int, default=50)
    args = ap.parse_args()
    if args.what == "prepare":
        print(prepare(args))
        return 0
    if args.what == "run":
        return run_mode(args)
    if args.what == "summarize":
        return summarize(args)
    if args.what == "plot":  # convergence_gpu.png from convergence_gpu.json (copied back)
        got = json.loads((pathlib.Path(args.out) / "convergence_gpu.json").read_text())
        runs = got["runs"]
        exact = next((dict(r["held_out"]) for r in runs if r["mode"] == "exact"), None)
        plot(runs, exact, got["config"]["shape"], pathlib.Path(args.out) / "convergence_gpu.png")
        return 0
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
