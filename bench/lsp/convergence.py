"""LSP-Offload convergence on the CPU (first model): the pretrained stories260K
Llama (../shared/data/models/stories260K) fine-tuned on Alpaca and LIMA records from ../shared/data,
evaluated on held-out records of both, with

  - offloadd exact offloaded training (CPU workers' AdamW on every parameter),
  - offloadd LSP mode at two subspace sizes,
  - transformers + torch.optim.AdamW on the very batches offloadd's exact run consumed
    (--dump-batches), evaluated on the same held-out tokens,

and plots held-out loss against step and against wall time (bench/lsp/convergence.png).

    python3 bench/lsp/convergence.py --build build [--steps 400] [--out bench/lsp]

Everything is tokenized here once (the model's tokenizer.json, Alpaca's prompt template, prompt
tokens masked) and given to every run as pretokenized JSON Lines, so all runs see the same
tokens. Wall time: offloadd's sum of step_seconds up to each evaluation (its step includes the LSP
projector checks); transformers' measured training time, evaluations excluded for both.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

import torch
import transformers
from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
TEMPLATE = ("Below is an instruction that describes a task{extra}. Write a response that appropriately "
            "completes the request.\n\n### Instruction:\n{instruction}\n\n{input}### Response:\n")


def encode(tok, rec, max_len):
    extra = ", paired with an input that provides further context" if rec.get("input") else ""
    inp = f"### Input:\n{rec['input']}\n\n" if rec.get("input") else ""
    prompt = [1] + tok.encode(TEMPLATE.format(extra=extra, instruction=rec["instruction"], input=inp),
                              add_special_tokens=False).ids
    answer = tok.encode(rec["output"], add_special_tokens=False).ids + [2]
    ids = (prompt + answer)[:max_len]
    labels = ([-100] * len(prompt) + answer)[:max_len]
    return {"input_ids": ids, "labels": labels}


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            if any(t != -100 for t in r["labels"][1:]):  # something to predict after truncation
                f.write(json.dumps(r) + "\n")


def prepare(work, max_len):
    model = work / "stories260K"
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "scripts/convert_llama2c.py"), "--model",
                        str(SHARED / "models/stories260K/stories260K.bin"), "--tokenizer",
                        str(SHARED / "models/stories260K/tok512.bin"), "--out", str(model)],
                       check=True, capture_output=True)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    alpaca = json.loads((SHARED / "alpaca/alpaca_5000.json").read_text())
    lima = json.loads((SHARED / "lima/lima.json").read_text())
    train = [encode(tok, r, max_len) for r in alpaca[:4500] + lima[:900]]
    held = [encode(tok, r, max_len) for r in alpaca[4800:] + lima[929:]]
    write_jsonl(work / "train.jsonl", train)
    write_jsonl(work / "eval.jsonl", held)
    return model


def run_offloadd(build, model, work, name, steps, args, extra):
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(build / "trainer/offloadd-train"), f"--model={model}", f"--data={work / 'train.jsonl'}",
           f"--eval-data={work / 'eval.jsonl'}", f"--eval-steps={args.eval_every}", "--format=pretokenized",
           "--dtype=fp32", f"--batch-size={args.batch}", f"--max-steps={steps}", f"--lr={args.lr}",
           "--scheduler=cosine", f"--warmup-steps={steps // 20}", f"--weight-decay={args.wd}",
           "--max-grad-norm=1.0", "--seed=7", "--workers=1x2", f"--output-dir={out}",
           f"--stats-jsonl={out / 'stats.jsonl'}", "--no-export", *extra]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{name} failed:\n{r.stderr[-3000:]}")
    records = [json.loads(x) for x in (out / "stats.jsonl").read_text().splitlines()]
    steps_rec = [x for x in records if "loss" in x]
    evals = [x for x in records if "eval_loss" in x]
    elapsed = {0: 0.0}
    for s in steps_rec:
        elapsed[s["step"]] = elapsed[s["step"] - 1] + s["step_seconds"]
    checks = [line for line in r.stderr.splitlines() if "projector check" in line]
    return {"name": name, "steps": [e["step"] for e in evals], "eval_loss": [e["eval_loss"] for e in evals],
            "seconds": [elapsed[e["step"]] for e in evals], "train_loss": [s["loss"] for s in steps_rec],
            "process_seconds": time.time() - t0, "plan": next((x for x in r.stderr.splitlines() if "plan:" in x), ""),
            "projector_checks": checks}


def hf_eval(model, held):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for r in held:
            logits = model(input_ids=torch.tensor([r["input_ids"]])).logits[0, :-1]
            labels = torch.tensor(r["labels"][1:])
            total += torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum").item()
            count += int((labels != -100).sum())
    model.train()
    return total / count


def run_transformers(model_dir, work, batches, args, steps):
    held = [json.loads(x) for x in (work / "eval.jsonl").read_text().splitlines()]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.wd)
    sched = transformers.get_scheduler("cosine", opt, num_warmup_steps=steps // 20, num_training_steps=steps)
    res = {"name": "transformers + AdamW", "steps": [0], "eval_loss": [hf_eval(model, held)], "seconds": [0.0]}
    train_s = 0.0
    for k, step in enumerate(batches, 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        trained = sum(sum(1 for t in m["targets"] if t != -100) for m in step)
        for m in step:
            b, t = m["batch"], m["seq"]
            logits = model(input_ids=torch.tensor(m["input_ids"]).view(b, t),
                           position_ids=torch.tensor(m["position_ids"]).view(b, t)).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)),
                                                     torch.tensor(m["targets"]), ignore_index=-100,
                                                     reduction="sum") / max(1, trained)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        train_s += time.perf_counter() - t0
        if k % args.eval_every == 0 or k == steps:
            res["steps"].append(k)
            res["eval_loss"].append(hf_eval(model, held))
            res["seconds"].append(train_s)
    return res


def plot(results, path, title="stories260K fine-tuned on Alpaca + LIMA records: held-out loss",
         time_label="training wall time (s, CPU)"):
    """Held-out loss against step and against wall time, one line per run (also convergence_gpu.py)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        axes[0].plot(r["steps"], r["eval_loss"], marker=".", label=r["name"])
        axes[1].plot(r["seconds"], r["eval_loss"], marker=".", label=r["name"])
    axes[0].set_xlabel("optimizer step")
    axes[1].set_xlabel(time_label)
    for ax in axes:
        ax.set_ylabel("held-out loss (nats/token)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--out", default=str(ROOT / "bench/lsp"))
    p.add_argument("--work", default="/tmp/offloadd-lsp-convergence")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--max-len", type=int, default=256)
    args = p.parse_args()
    work, out, build = pathlib.Path(args.work), pathlib.Path(args.out), pathlib.Path(args.build)
    work.mkdir(parents=True, exist_ok=True)
    model = prepare(work, args.max_len)
    runs = [("offloadd exact", []),
            ("offloadd LSP s=8 d=2", ["--compression=lsp:rank=8,nonzeros=2,check_every=50"]),
            ("offloadd LSP s=32 d=4", ["--compression=lsp:rank=32,nonzeros=4,check_every=50"])]
    results = []
    for name, extra in runs:
        dump = [f"--dump-batches={work / 'batches.json'}"] if not extra else []
        results.append(run_offloadd(build, model, work, name.replace(" ", "_").replace("=", ""), args.steps,
                                    args, extra + dump))
        results[-1]["name"] = name
        print(f"{name}: held-out loss {results[-1]['eval_loss'][0]:.4f} -> {results[-1]['eval_loss'][-1]:.4f} "
              f"in {results[-1]['seconds'][-1]:.1f} s of steps", flush=True)
    batches = json.loads((work / "batches.json").read_text())
    results.append(run_transformers(model, work, batches, args, args.steps))
    r = results[-1]
    print(f"{r['name']}: held-out loss {r['eval_loss'][0]:.4f} -> {r['eval_loss'][-1]:.4f} in "
          f"{r['seconds'][-1]:.1f} s", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "convergence.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    plot(results, out / "convergence.png")
    print(f"wrote {out / 'convergence.png'} and {out / 'convergence.json'}")


if __name__ == "__main__":
    main()
