#!/usr/bin/env python3
"""Helper of bench/data_parallel/run_dp_bench.sh: writes the model directory, turns one
run's output (offloadd-train's --stats-jsonl, or baseline_torch.py's --json) into one JSON line of
the results file, and prints the Markdown tables from the results file.

    summarize.py model-dir --shape llama2-7b --out DIR       # config.json of the shape (run_bench.py's)
    summarize.py params --shape llama2-7b                    # parameter count of the shape
    summarize.py record-offloadd --results R.jsonl --name NAME --stats S.jsonl --rc RC --log LOG \\
        --gpus N --batch B [--skip 2] [--part a] [--what TEXT] [--command CMD]
    summarize.py record-torch --results R.jsonl --name NAME --json J.json --rc RC --log LOG [...]
    summarize.py table --results R.jsonl [--goal 1.8] [--markdown OUT.md]

offloadd tokens/s: the mean over the steps after the first --skip (2) of tokens / step_seconds of
each stats record ("tokens" is the global batch's tokens on every rank count: rank 0 writes the
stats of a data-parallel run). The last record of a name in the results file wins.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
PIPELINE = HERE.parent / "pipeline"


def shapes() -> dict:
    sys.path.insert(0, str(PIPELINE))
    from baseline_torch import SHAPES  # noqa: E402 (imports torch and transformers)
    return SHAPES


def shape_params(s: dict) -> int:
    h, heads, kv = s["hidden_size"], s["num_attention_heads"], s["num_key_value_heads"]
    hd = h // heads
    layer = h * heads * hd * 2 + h * kv * hd * 2 + 3 * h * s["intermediate_size"] + 2 * h
    return s["num_hidden_layers"] * layer + 2 * s["vocab_size"] * h + h  # untied embeddings


def cmd_model_dir(a) -> int:
    sys.path.insert(0, str(PIPELINE))
    from run_bench import write_config  # noqa: E402 (the config previous benchmarks used)
    print(write_config(a.shape, pathlib.Path(a.out)))
    return 0


def cmd_params(a) -> int:
    print(shape_params(shapes()[a.shape]))
    return 0


def tail(path: str) -> str:
    """The log's last error line (else its last line), shortened."""
    try:
        lines = [l.strip() for l in pathlib.Path(path).read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    lines = [l for l in lines if "Warning" not in l and not l.startswith("warnings.warn")]
    errors = [l for l in lines if any(k in l for k in ("rror", "ERROR", "INVALID", "FAILED", "what()", "abort",
                                                        "Killed", "out of memory", "UNIMPLEMENTED"))]
    line = (errors or lines or [""])[-1]
    return line if len(line) <= 300 else line[:297] + "..."


def status_of_rc(rc: int) -> str:
    return "ok" if rc == 0 else ("timeout" if rc in (124, 137) else f"error (rc {rc})")


def append(results: str, rec: dict):
    with open(results, "a") as f:
        f.write(json.dumps(rec) + "\n")


def brief(rec: dict) -> str:
    if rec["status"] != "ok":
        return f"{rec['name']}: {rec['status']}{': ' + rec['error'] if rec.get('error') else ''}"
    t = rec.get("tokens_per_s")
    return (f"{rec['name']}: {t:,.0f} tokens/s" if t else f"{rec['name']}: no timed step") + \
        (f", {rec['step_s']:.3f} s/step" if rec.get("step_s") else "") + \
        (f", GPU peak {rec['gpu_peak_gib']:.1f} GiB" if rec.get("gpu_peak_gib") else "")


def cmd_record_offloadd(a) -> int:
    rec = {"name": a.name, "part": a.part, "what": a.what, "impl": "offloadd", "gpus": a.gpus,
           "batch": a.batch, "global_batch": a.batch * a.gpus, "rc": a.rc, "log": a.log, "cmd": a.command,
           "status": status_of_rc(a.rc)}
    steps = []
    try:
        for line in pathlib.Path(a.stats).read_text().splitlines():
            if line.strip():
                x = json.loads(line)
                if "loss" in x and "step_seconds" in x:  # step records (not eval / LSP records)
                    steps.append(x)
    except (OSError, json.JSONDecodeError):
        pass
    rec["steps"] = [{k: x.get(k) for k in ("step", "loss", "grad_norm", "tokens", "step_seconds",
                                            "gpu_peak_bytes", "clipped")} for x in steps]
    timed = [x for x in steps if x["step"] > a.skip and x["step_seconds"] > 0]
    if timed:
        rec["timed_steps"] = len(timed)
        rec["tokens_per_s"] = sum(x["tokens"] / x["step_seconds"] for x in timed) / len(timed)
        rec["tokens_per_s_per_gpu"] = rec["tokens_per_s"] / a.gpus
        rec["step_s"] = sum(x["step_seconds"] for x in timed) / len(timed)
        rec["tokens_per_step"] = timed[-1]["tokens"]
    peaks = [x.get("gpu_peak_bytes") or 0 for x in steps]
    if any(peaks):
        rec["gpu_peak_gib"] = max(peaks) / 2**30  # rank 0's
    if rec["status"] == "ok" and not steps:
        rec["status"] = "error (no step records)"
    if rec["status"] == "timeout":
        rec["error"] = f"killed at the time limit after {len(steps)} step records"
    elif rec["status"] != "ok":
        rec["error"] = tail(a.log)
    append(a.results, rec)
    print(brief(rec), flush=True)
    return 0


def cmd_record_torch(a) -> int:
    rec = {"name": a.name, "part": a.part, "what": a.what, "impl": "pytorch", "gpus": a.gpus,
           "batch": a.batch, "global_batch": a.batch * a.gpus, "rc": a.rc, "log": a.log, "cmd": a.command,
           "status": status_of_rc(a.rc)}
    try:
        data = json.loads(pathlib.Path(a.json).read_text())
        row = data["rows"][0]
        rec["env"] = data.get("env")
    except (OSError, json.JSONDecodeError, KeyError, IndexError):
        row = None
    if row is not None:
        if row["status"] != "ok":
            rec["status"] = row["status"]  # "oom"
        else:
            rec.update(status="ok", tokens_per_s=row["tokens_per_s"], step_s=row["step_s"],
                       tokens_per_step=row["tokens_per_step"], loss=row["loss"], grad_norm=row["grad_norm"],
                       tokens_per_s_per_gpu=row.get("tokens_per_s_per_gpu", row["tokens_per_s"]))
            peak = row.get("peak_allocated_bytes")
            if peak:
                rec["gpu_peak_gib"] = peak / 2**30
            if row.get("peak_allocated_bytes_per_rank"):
                rec["gpu_peak_gib_per_rank"] = [p / 2**30 for p in row["peak_allocated_bytes_per_rank"]]
    elif rec["status"] == "ok":
        rec["status"] = "error (no JSON rows)"
    if rec["status"] == "timeout":
        rec["error"] = "killed at the time limit"
    elif rec["status"] not in ("ok", "oom"):
        rec["error"] = tail(a.log)
    append(a.results, rec)
    print(brief(rec), flush=True)
    return 0


def load(results: str) -> dict:
    recs = {}
    try:
        for line in pathlib.Path(results).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                recs[r["name"]] = r  # the last record of a name wins
    except OSError:
        pass
    return recs


def fmt(x, spec=",.0f", none="-"):
    return none if x is None else format(x, spec)


def ratio(a: dict | None, b: dict | None):
    if not a or not b or not a.get("tokens_per_s") or not b.get("tokens_per_s"):
        return None
    return a["tokens_per_s"] / b["tokens_per_s"]


def rel(a, b):
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


# Which run each row is compared with ("vs" column), by name.
REFERENCE = {"dp2": "solo", "conc-gpu0": "conc-solo", "conc-gpu1": "conc-solo",
             "torch-fsdp2": "torch-1gpu", "torch-ddp": "torch-1gpu", "exact-2gpu": "exact-1gpu"}
ORDER = ["solo", "dp2", "exact-1gpu", "exact-2gpu", "conc-solo", "conc-gpu0", "conc-gpu1",
         "torch-1gpu", "torch-fsdp2", "torch-ddp"]


def cmd_table(a) -> int:
    recs = load(a.results)
    out = []
    p = out.append
    if not recs:
        p("(no results yet in " + a.results + ")")
    names = [n for n in ORDER if n in recs] + sorted(n for n in recs if n not in ORDER)
    p("| part | run | implementation | GPUs | batch/GPU | global batch | tokens/s | tokens/s/GPU | step s | "
      "GPU peak GiB | vs | status |")
    p("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for n in names:
        r = recs[n]
        ref = REFERENCE.get(n)
        if n == "conc-gpu0" or n == "conc-gpu1":
            ref = ref if ref in recs else "solo"
        x = ratio(r, recs.get(ref)) if ref else None
        vs = f"{x:.2f}x {ref}" if x is not None else "-"
        peak = r.get("gpu_peak_gib_per_rank")
        peak = "/".join(f"{v:.1f}" for v in peak) if peak else fmt(r.get("gpu_peak_gib"), ".1f")
        status = r["status"] + (f": {r['error']}" if r.get("error") else "")
        p(f"| {r.get('part') or '-'} | {n}{' (' + r['what'] + ')' if r.get('what') else ''} | {r['impl']} | "
          f"{r['gpus']} | {r['batch']} | {r['global_batch']} | {fmt(r.get('tokens_per_s'))} | "
          f"{fmt(r.get('tokens_per_s_per_gpu'))} | {fmt(r.get('step_s'), '.3f')} | {peak} | {vs} | "
          f"{status.replace('|', '/')} |")
    p("")
    # The goal: 2 GPUs >= goal x 1 GPU at the same per-GPU batch.
    x = ratio(recs.get("dp2"), recs.get("solo"))
    if x is not None:
        verdict = "met" if x >= a.goal else "NOT met"
        p(f"- offloadd 2 GPUs / 1 GPU at batch {recs['dp2']['batch']} per GPU: **{x:.2f}x** "
          f"(goal >= {a.goal}x: {verdict})")
    y = ratio(recs.get("dp2"), recs.get("torch-fsdp2"))
    if y is not None:
        p(f"- offloadd 2 GPUs / PyTorch FSDP2 2 GPUs, same per-GPU batch: {y:.2f}x")
    y = ratio(recs.get("solo"), recs.get("torch-1gpu"))
    if y is not None:
        p(f"- offloadd 1 GPU / PyTorch 1 GPU (all on the GPU), same batch: {y:.2f}x")
    y = ratio(recs.get("dp2"), recs.get("exact-1gpu"))
    if y is not None:
        p(f"- offloadd 2 GPUs at batch {recs['dp2']['batch']} / 1 GPU at the same global batch "
          f"{recs['exact-1gpu']['global_batch']} (run c, {recs['exact-1gpu'].get('timed_steps', 0)} timed "
          f"steps): {y:.2f}x")
    for n in ("conc-gpu0", "conc-gpu1"):
        ref = "conc-solo" if "conc-solo" in recs else "solo"
        y = ratio(recs.get(n), recs.get(ref))
        if y is not None:
            p(f"- {n}: two independent 1-GPU runs at once, this one at {y:.2f}x of its solo run ({ref})")
    # Exactness: per-step loss and grad_norm of 1 GPU at 2B against 2 GPUs at B.
    e1, e2 = recs.get("exact-1gpu"), recs.get("exact-2gpu")
    if e1 and e2 and e1.get("steps") and e2.get("steps"):
        p("")
        p(f"Exactness: 1 GPU at batch {e1['batch']} vs 2 GPUs at batch {e2['batch']} per GPU (same seed, "
          f"same synthetic batches; bf16 compute, so only the summation order differs)")
        p("")
        p("| step | tokens 1/2 | loss 1 GPU | loss 2 GPUs | rel diff | grad_norm 1 GPU | grad_norm 2 GPUs | rel diff |")
        p("|---:|---|---:|---:|---:|---:|---:|---:|")
        by2 = {s["step"]: s for s in e2["steps"]}
        dl, dg, same_tokens = [], [], True
        for s1 in e1["steps"]:
            s2 = by2.get(s1["step"])
            if s2 is None:
                continue
            rl, rg = rel(s1["loss"], s2["loss"]), rel(s1["grad_norm"], s2["grad_norm"])
            dl.append(rl)
            dg.append(rg)
            same_tokens &= s1["tokens"] == s2["tokens"]
            p(f"| {s1['step']} | {s1['tokens']}/{s2['tokens']} | {s1['loss']:.6f} | {s2['loss']:.6f} | "
              f"{rl:.2e} | {s1['grad_norm']:.6f} | {s2['grad_norm']:.6f} | {rg:.2e} |")
        if dl:
            ok = max(dl) <= a.rtol and max(dg) <= a.rtol and same_tokens
            p("")
            p(f"- max relative difference over {len(dl)} steps: loss {max(dl):.2e}, grad_norm {max(dg):.2e} "
              f"(within {a.rtol:g}: {'yes' if ok else 'NO'}; same tokens per step: "
              f"{'yes' if same_tokens else 'NO'})")
            finite = all(math.isfinite(s["loss"]) for s in e1["steps"] + e2["steps"])
            if not finite:
                p("- a loss was not finite")
        else:
            p("- no common steps to compare")
    text = "\n".join(out)
    print(text)
    if a.markdown:
        pathlib.Path(a.markdown).write_text(text + "\n")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="sub", required=True)
    s = sub.add_parser("model-dir")
    s.add_argument("--shape", required=True)
    s.add_argument("--out", required=True)
    s = sub.add_parser("params")
    s.add_argument("--shape", required=True)
    for name in ("record-offloadd", "record-torch"):
        s = sub.add_parser(name)
        s.add_argument("--results", required=True)
        s.add_argument("--name", required=True)
        s.add_argument("--rc", type=int, required=True)
        s.add_argument("--log", default="")
        s.add_argument("--gpus", type=int, required=True)
        s.add_argument("--batch", type=int, required=True)
        s.add_argument("--part", default="")
        s.add_argument("--what", default="")
        s.add_argument("--command", default="", help="the run's command line, kept in the record")
        if name == "record-offloadd":
            s.add_argument("--stats", required=True)
            s.add_argument("--skip", type=int, default=2, help="untimed first steps (default 2)")
        else:
            s.add_argument("--json", required=True)
    s = sub.add_parser("table")
    s.add_argument("--results", required=True)
    s.add_argument("--goal", type=float, default=1.8)
    s.add_argument("--rtol", type=float, default=1e-2,
                   help="relative difference still called exact in bf16 (default 1e-2)")
    s.add_argument("--markdown", help="also write the tables to this file")
    a = p.parse_args(argv)
    return {"model-dir": cmd_model_dir, "params": cmd_params, "record-offloadd": cmd_record_offloadd,
            "record-torch": cmd_record_torch, "table": cmd_table}[a.sub](a)


if __name__ == "__main__":
    sys.exit(main())
