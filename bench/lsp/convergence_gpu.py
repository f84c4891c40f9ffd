"""LSP-Offload convergence on the GPU (second model): a 1.1B Llama-shaped model
(TinyLlama's shape, transformers-style random initialisation, the Llama-2 tokenizer) trained on the
Alpaca records of ../shared/data, exact offloaded training against LSP mode (s = 512, d = 16), both
on the same seeded initialisation, batches and held-out records; held-out loss against step and
against wall time (sum of step_seconds, projector checks included).

    python3 bench/lsp/convergence_gpu.py --build build-gpu --data-dir DIR --json out.json
    python3 bench/lsp/convergence_gpu.py --plot out.json --png bench/lsp/convergence_gpu.png

DIR holds alpaca_5000.json and tokenizer.json (Llama-2's); the device machine gets them carried.
"""
import argparse
import json
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench/lsp"))
sys.path.insert(0, str(ROOT / "bench/pipeline"))
from convergence import encode, plot, write_jsonl  # noqa: E402
from run_bench import write_config  # noqa: E402


def prepare(data_dir: pathlib.Path, work: pathlib.Path, max_len: int) -> pathlib.Path:
    from tokenizers import Tokenizer
    model = write_config("tinyllama-1.1b", work / "model")
    shutil.copy(data_dir / "tokenizer.json", model / "tokenizer.json")
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    alpaca = json.loads((data_dir / "alpaca_5000.json").read_text())
    write_jsonl(work / "train.jsonl", [encode(tok, r, max_len) for r in alpaca[:4500]])
    write_jsonl(work / "eval.jsonl", [encode(tok, r, max_len) for r in alpaca[4800:]])
    return model


def run(args, model, work, name, extra):
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(pathlib.Path(args.build) / "trainer/offloadd-train"), f"--model={model}", "--random-init",
           f"--data={work / 'train.jsonl'}", f"--eval-data={work / 'eval.jsonl'}", f"--eval-steps={args.eval_every}",
           "--format=pretokenized", "--device=cuda", "--dtype=bf16", f"--gpu-memory-limit={args.budget}",
           f"--batch-size={args.batch}", f"--max-steps={args.steps}", f"--lr={args.lr}", "--scheduler=constant",
           "--max-grad-norm=1.0", "--seed=11", "--workers=1x15", f"--stats-jsonl={out / 'stats.jsonl'}",
           "--no-export", *extra]
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{name} failed:\n{r.stderr[-3000:]}")
    records = [json.loads(x) for x in (out / "stats.jsonl").read_text().splitlines() if x.strip()]
    steps = [x for x in records if "loss" in x]
    evals = [x for x in records if "eval_loss" in x]
    checks = [x for x in records if "lsp_checked" in x]
    elapsed = {0: 0.0}
    for s in steps:
        elapsed[s["step"]] = elapsed[s["step"] - 1] + s["step_seconds"]
    return {"name": name, "steps": [e["step"] for e in evals], "eval_loss": [e["eval_loss"] for e in evals],
            "seconds": [elapsed[e["step"]] for e in evals], "train_loss": [s["loss"] for s in steps],
            "step_seconds_mean": sum(s["step_seconds"] for s in steps[2:]) / max(1, len(steps) - 2),
            "checks": checks}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build-gpu")
    p.add_argument("--data-dir", type=pathlib.Path)
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/offloadd-lsp-gpu"))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--budget", default="6GiB")
    p.add_argument("--json", type=pathlib.Path)
    p.add_argument("--plot", type=pathlib.Path)
    p.add_argument("--png", type=pathlib.Path, default=ROOT / "bench/lsp/convergence_gpu.png")
    args = p.parse_args()
    if args.plot:
        plot(json.loads(args.plot.read_text())["runs"], args.png,
             title="1.1B Llama shape (random init) on Alpaca, H200: exact offloaded vs LSP s=512",
             time_label="training wall time, s (checks included)")
        return
    args.work.mkdir(parents=True, exist_ok=True)
    model = prepare(args.data_dir, args.work, args.max_len)
    runs = [run(args, model, args.work, "exact", []), run(args, model, args.work, "lsp s=512", ["--compression=lsp"])]
    for r in runs:
        print(f"{r['name']}: eval {['%.3f' % x for x in r['eval_loss']]} at {r['steps']}; "
              f"{r['step_seconds_mean']:.3f} s/step; checks {r['checks']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "args": {k: str(v) for k, v in vars(args).items()}}, indent=1))


if __name__ == "__main__":
    main()
