#!/usr/bin/env python3
"""Convergence of the compact optimizer modes (docs/optimizer-modes.md) on the CPU: the pretrained
stories260K (../shared/data) fine-tuned on Alpaca records, every mode from the same start on the
same batches, its held-out loss against exact AdamW's.

    convergence.py --build build [--steps 300] [--out bench/optimizer_modes]
    # or split over processes, then merge:
    convergence.py --modes int8/fp32,bf16/fp32 --part a; ...; convergence.py --merge a,b,c

PyTorch (transformers' LlamaForCausalLM, fp32) computes the loss and the gradients; each step's
update is offloadd's kernel (offloadd-optim-tool compact, workers/adamw_compact.h) on the flat
parameter vector (each tensor padded to whole int8 blocks of 256), with global-norm clipping at
1.0 as the trainer clips. The model's weights are the updated masters (fp32 compute on the CPU
reads them: with a bf16 master, master + compensation). Writes convergence.json and
convergence.png (held-out loss per mode against step, and its gap to exact).
"""
import argparse
import json
import math
import pathlib
import random
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

MODES = [("fp32", "fp32"), ("bf16", "fp32"), ("int8", "fp32"), ("fp32", "bf16"), ("bf16", "bf16"),
         ("int8", "bf16")]
BLOCK = 256


def name(mode):
    state, master = mode
    return "exact" if mode == ("fp32", "fp32") else f"{master} master, {state} states"


def encode(tok, records, seq):
    out = []
    for r in records:
        text = r["instruction"] + ("\n" + r["input"] if r["input"] else "") + "\n" + r["output"]
        ids = tok(text, add_special_tokens=True)["input_ids"][:seq]
        if len(ids) > 8:
            out.append(ids)
    return out


def batch_tensors(seqs):
    n = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    labels = torch.full((len(seqs), n), -100, dtype=torch.long)
    mask = torch.zeros(len(seqs), n, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        labels[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    return ids, mask, labels


@torch.no_grad()
def held_out_loss(model, held, batch):
    total, tokens = 0.0, 0
    for i in range(0, len(held), batch):
        ids, mask, labels = batch_tensors(held[i:i + batch])
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                 ignore_index=-100, reduction="sum")
        total += loss.item()
        tokens += int((target != -100).sum())
    return total / tokens


def bf16_bits(x):  # round to nearest even, as the kernel's FloatToBf16
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


class FlatState:
    """One mode's optimizer state as the kernel's files."""

    def __init__(self, params, mode, tool, workdir):
        self.params, self.mode, self.tool, self.dir = params, mode, tool, workdir
        self.offsets, n = [], 0
        for p in params:
            self.offsets.append(n)
            n += (p.numel() + BLOCK - 1) // BLOCK * BLOCK
        self.n = n
        flat = np.zeros(n, np.float32)
        for p, o in zip(params, self.offsets):
            flat[o:o + p.numel()] = p.detach().reshape(-1).numpy()
        state, master = mode
        if master == "fp32":
            flat.tofile(self.file("master"))
        else:
            hi = bf16_bits(flat)
            hi.tofile(self.file("master"))
            bf16_bits(flat - bf16_value(hi)).tofile(self.file("master-comp"))
        width = {"fp32": 4, "bf16": 2, "int8": 1}[state]
        for key in ("exp-avg", "exp-avg-sq"):
            np.zeros(n * width, np.uint8).tofile(self.file(key))
        if state == "int8":
            for key in ("exp-avg-scale", "exp-avg-sq-scale"):
                np.zeros(n // BLOCK, np.float32).tofile(self.file(key))

    def file(self, key):
        return str(self.dir / f"{key}.bin")

    def step(self, grads, hyper):
        flat = np.zeros(self.n, np.float32)
        for g, o in zip(grads, self.offsets):
            flat[o:o + g.numel()] = g.reshape(-1).numpy()
        flat.tofile(self.file("grad"))
        state, master = self.mode
        cmd = [self.tool, "compact", f"--n={self.n}", "--grad-dtype=fp32", f"--grad={self.file('grad')}",
               f"--state-dtype={state}", f"--master-dtype={master}", "--seed=42"]
        cmd += [f"--{k}={v}" for k, v in hyper.items()]
        keys = ["master", "exp-avg", "exp-avg-sq"] + (["master-comp"] if master == "bf16" else []) + (
            ["exp-avg-scale", "exp-avg-sq-scale"] if state == "int8" else [])
        cmd += [f"--{k}={self.file(k)}" for k in keys]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        if master == "fp32":
            values = np.fromfile(self.file("master"), np.float32)
        else:
            values = bf16_value(np.fromfile(self.file("master"), np.uint16)) + bf16_value(
                np.fromfile(self.file("master-comp"), np.uint16))
        with torch.no_grad():
            for p, o in zip(self.params, self.offsets):
                p.copy_(torch.from_numpy(values[o:o + p.numel()].copy()).view_as(p))


def run_mode(mode, model_dir, train, held, args, tool):
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    order = list(range(len(train)))
    random.Random(7).shuffle(order)
    curve = [(0, held_out_loss(model, held, args.batch))]
    train_loss = []
    with tempfile.TemporaryDirectory() as d:
        state = FlatState(params, mode, tool, pathlib.Path(d))
        for step in range(1, args.steps + 1):
            idx = [order[(step - 1) * args.batch + i] % len(train) for i in range(args.batch)]
            ids, mask, labels = batch_tensors([train[i] for i in idx])
            model.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            grads = [p.grad.detach() for p in params]
            norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
            lr = args.lr * min(1.0, step / args.warmup)
            state.step(grads, {"lr": lr, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight-decay": 0.0,
                               "step": step, "grad-scale": min(1.0, 1.0 / (norm + 1e-6))})
            train_loss.append(loss.item())
            if step % args.eval_every == 0 or step == args.steps:
                curve.append((step, held_out_loss(model, held, args.batch)))
                print(f"{name(mode)}: step {step} held-out {curve[-1][1]:.4f}", file=sys.stderr, flush=True)
    return {"mode": name(mode), "state_dtype": mode[0], "master_dtype": mode[1], "held_out": curve,
            "train_loss": train_loss}


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    exact = dict(results[0]["held_out"])
    for r in results:
        steps = [s for s, _ in r["held_out"]]
        a.plot(steps, [l for _, l in r["held_out"]], label=r["mode"])
        b.plot(steps, [100 * (l / exact[s] - 1) for s, l in r["held_out"]], label=r["mode"])
    a.set_xlabel("step")
    a.set_ylabel("held-out loss (nats/token)")
    a.set_title("stories260K on Alpaca, CPU")
    b.set_xlabel("step")
    b.set_ylabel("held-out loss vs exact (%)")
    b.axhline(1, color="grey", ls=":")
    b.axhline(-1, color="grey", ls=":")
    for ax in (a, b):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = pathlib.Path(__file__).resolve().parents[2]
    ap.add_argument("--build", default=str(root / "build"))
    ap.add_argument("--shared", default=str(root.parent / "shared"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--held-out", type=int, default=128)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent))
    ap.add_argument("--modes", default="", help="state/master,... (default: all, exact first)")
    ap.add_argument("--part", default="", help="write convergence_<part>.json only (see --merge)")
    ap.add_argument("--merge", default="", help="parts to merge into convergence.json/.png")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        parts = [json.loads((out / f"convergence_{p}.json").read_text()) for p in args.merge.split(",")]
        runs = sorted((r for p in parts for r in p["runs"]), key=lambda r: MODES.index((r["state_dtype"], r["master_dtype"])))
        return finish(runs, parts[0]["config"] | {"modes": "", "part": "", "merge": args.merge}, out)
    torch.set_num_threads(1)
    tool = str(pathlib.Path(args.build) / "workers/offloadd-optim-tool")
    src = pathlib.Path(args.shared) / "data/models/stories260K"
    with tempfile.TemporaryDirectory() as d:
        model_dir = pathlib.Path(d) / "stories260K"
        subprocess.run([sys.executable, str(root / "scripts/convert_llama2c.py"), "--model", str(src / "stories260K.bin"),
                        "--tokenizer", str(src / "tok512.bin"), "--out", str(model_dir)], check=True)
        tok = AutoTokenizer.from_pretrained(model_dir)
        records = json.loads((pathlib.Path(args.shared) / "data/alpaca/alpaca_5000.json").read_text())
        train = encode(tok, records[:-args.held_out], args.seq)
        held = encode(tok, records[-args.held_out:], args.seq)
        modes = [tuple(m.split("/")) for m in args.modes.split(",")] if args.modes else MODES
        results = [run_mode(m, model_dir, train, held, args, tool) for m in modes]
    config = vars(args) | {"train_records": len(train), "held_out_records": len(held)}
    if args.part:
        (out / f"convergence_{args.part}.json").write_text(json.dumps({"config": config, "runs": results}, indent=1))
        return None
    return finish(results, config, out)


def finish(results, config, out):
    exact = results[0]["held_out"][-1][1]
    summary = {r["mode"]: {"final_held_out": r["held_out"][-1][1],
                           "vs_exact_percent": 100 * (r["held_out"][-1][1] / exact - 1)} for r in results}
    (out / "convergence.json").write_text(
        json.dumps({"config": config, "summary": summary, "runs": results}, indent=1))
    plot(results, out / "convergence.png")
    for k, v in summary.items():
        print(f"{k:28s} held-out {v['final_held_out']:.4f}  vs exact {v['vs_exact_percent']:+.2f}%")


if __name__ == "__main__":
    main()
