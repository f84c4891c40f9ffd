#!/usr/bin/env python3
"""The step planner's predictions against measured steps, on the GPU
machine: each case runs offloadd-train on a random-initialised model of a benchmark shape and
prints what the planner predicted before the job (the automatic batch size's price, when asked)
and after its second step (the step plan), against the steps measured, plus any refusal up front.

    python3 bench/pipeline/plan_accuracy.py --build build-gpu --data-dir DIR [--json out.json] CASE...

CASE is NAME:SHAPE:BATCH:LIMIT:DATA[:EXTRA...], DATA one of synthetic (1024-token random rows),
alpaca (Alpaca records, one per row, padded per batch) or packed (Alpaca records packed into
1024-token rows); EXTRA are further offloadd-train flags separated by ':' (e.g. --compression=lsp).
DIR holds alpaca_5000.json and the Llama-2 tokenizer (tokenizer.json).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from run_bench import write_config  # noqa: E402

NOTES = ("batch size (auto", "step plan", "records vary in length", "largest micro-batch", "LSP projector check",
         "validate-only")


def run_case(args, spec: str, work: pathlib.Path) -> dict:
    name, shape, batch, limit, data, *extra = spec.split(":")
    model = write_config(shape, work / shape)
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(pathlib.Path(args.build) / "trainer/offloadd-train"), f"--model={model}", "--random-init",
           "--device=cuda", "--dtype=bf16", f"--gpu-memory-limit={limit}", f"--batch-size={batch}",
           f"--max-steps={args.steps}", "--lr=1e-5", "--scheduler=constant", "--max-grad-norm=1.0",
           "--workers=1x15", f"--stats-jsonl={out / 'stats.jsonl'}", "--no-export", f"--output-dir={out / 'run'}"]
    if data == "synthetic":
        cmd += ["--synthetic-seq=1024"]
    else:
        cmd += [f"--data={args.data_dir / 'alpaca_5000.json'}", f"--tokenizer={args.data_dir}",
                "--max-seq-length=1024"]
        if data == "packed":
            cmd += ["--packing"]
    cmd += extra
    if args.profile_dir:  # one node profile for the validation and the run (measured by the first)
        cmd += [f"--profile-dir={args.profile_dir}"]
    res_validate = None
    if args.validate:  # what --validate-only prices before the job
        print("$", " ".join(cmd + ["--validate-only"]), flush=True)
        v = subprocess.run(cmd + ["--validate-only"], capture_output=True, text=True, timeout=args.case_timeout)
        lines = v.stdout.strip().splitlines()
        res_validate = json.loads(lines[-1]) if v.returncode == 0 and lines else {"error": v.stderr[-600:]}
        if len(lines) > 1:
            res_validate["line"] = lines[0]
        print(f"  validate-only: {res_validate.get('line', res_validate)}", flush=True)
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.case_timeout)
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout", (e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or "")
    res = {"case": name, "shape": shape, "batch": batch, "limit": limit, "data": data, "extra": extra,
           "rc": rc, "wall_s": time.time() - t0, "command": " ".join(cmd), "validate": res_validate}
    (out / "stderr.log").write_text(err)
    res["notes"] = [l.split("] ", 1)[-1] for l in err.splitlines() if any(k in l for k in NOTES)]
    if rc != 0:
        res["error"] = (err.strip().splitlines() or ["?"])[-1][-600:]
    stats = out / "stats.jsonl"
    rows = [json.loads(l) for l in stats.read_text().splitlines() if l.strip()] if stats.exists() else []
    res["steps"] = [{"step": x["step"], "step_seconds": x["step_seconds"], "tokens": x["tokens"],
                     "gpu_compute_seconds": x["gpu_compute_seconds"], "gpu_peak_gib": x["gpu_peak_bytes"] / 2**30}
                    for x in rows if "loss" in x]
    for note in res["notes"]:
        m = re.search(r"step plan check: step (\d+).*? took ([\d.e+-]+) s against ([\d.e+-]+) s predicted.*?\(([+-][\d.e+-]+)%\)",
                      note)
        if m:
            res["check"] = {"step": int(m[1]), "measured_s": float(m[2]), "predicted_s": float(m[3]),
                            "off_percent": float(m[4])}
        m = re.search(r"predicted ([\d.]+)(k?) tokens/s, ([\d.]+) s/step", note)
        if m and "batch size (auto" in note:
            res["auto_predicted_s"] = float(m[3])
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build-gpu")
    p.add_argument("--data-dir", type=pathlib.Path, required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--case-timeout", type=int, default=240)
    p.add_argument("--follow-refusals", action="store_true",
                   help="after a refusal up front that names the largest micro-batch that fits, run that batch")
    p.add_argument("--validate", action="store_true", help="run each case with --validate-only first")
    p.add_argument("--profile-dir", help="cache the node profile here (shared by the cases)")
    p.add_argument("--json")
    p.add_argument("cases", nargs="+")
    args = p.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="offloadd-plan-"))
    results = []
    queue = list(args.cases)
    while queue:
        spec = queue.pop(0)
        r = run_case(args, spec, work)
        results.append(r)
        m = re.search(r"the largest micro-batch that fits is (\d+)", r.get("error", ""))
        if m and args.follow_refusals:  # run what the refusal suggests
            name, shape, _, *rest = spec.split(":")
            queue.insert(0, ":".join([name + "-suggested", shape, m[1], *rest]))
        for note in r["notes"]:
            print(f"  {r['case']}: {note}", flush=True)
        if "error" in r:
            print(f"  {r['case']}: exit {r['rc']}: {r['error']}", flush=True)
        for s in r["steps"]:
            print(f"  {r['case']}: step {s['step']}: {s['step_seconds']:.3f} s, {s['tokens']} tokens, GPU "
                  f"{s['gpu_compute_seconds']:.3f} s, peak {s['gpu_peak_gib']:.1f} GiB", flush=True)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    print("\n| case | shape | batch | budget | data | outcome | validate-only s/step | auto price s/step | "
          "step-4 check predicted / measured s | off |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        c = r.get("check", {})
        outcome = "ran" if r["rc"] == 0 else f"exit {r['rc']}"
        print(f"| {r['case']} | {r['shape']} | {r['batch']} | {r['limit']} | {r['data']} | {outcome} | "
              f"{(r.get('validate') or {}).get('predicted_step_seconds', '')} | {r.get('auto_predicted_s', '')} | "
              f"{'%.3f / %.3f' % (c['predicted_s'], c['measured_s']) if c else ''} | "
              f"{'%+.1f%%' % c['off_percent'] if c else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
