#!/usr/bin/env python3
"""The compact optimizer modes against the exact kernel, measured in one run of
offloadd-workers-bench --compact (builds nothing; no torch): per mode, flavour and thread count,
G params/s, bytes per parameter per step, GB/s and its share of the calibrated triad, the rate
against the exact FusedAdamW kernel at the same thread count, and the CPU-alone update time of a
model of --model-params parameters (params / rate: the step's CPU time when nothing else bounds it).

    bench/workers/compact_bench.py --build /tmp/gpu-build --threads 1,15 --params 67108864

--paths defaults to "auto,avx2" (the fastest flavour this CPU has, and AVX2); the portable flavour
is left out unless named (it is 10x slower and would dominate the run time).
"""
import argparse
import json
import pathlib
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--params", type=int, default=64 << 20)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paths", default="auto,avx2")
    ap.add_argument("--model-params", type=float, default=6.738e9, help="Llama-2-7B by default")
    args = ap.parse_args()
    exe = pathlib.Path(args.build) / "bench/workers/offloadd-workers-bench"
    cmd = [str(exe), "--compact", f"--params={args.params}", f"--threads={args.threads}",
           f"--repeats={args.repeats}", f"--paths={args.paths}"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({run.returncode}): {run.stderr.strip()}")
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    triad = {r["threads"]: r["gbps"] for r in rows if r["bench"] == "stream_triad"}
    exact = {(r["path"], r["threads"]): r["params_per_s"] / 1e9
             for r in rows if r["bench"] == "adamw_kernel"}
    print(f"# {' '.join(cmd)}")
    print(f"# triad GB/s by threads: {triad}")
    print("| mode (master, states) | B/param/step | flavour | threads | G params/s | GB/s "
          "| % of triad | x exact | CPU-alone s/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["bench"] == "adamw_kernel":
            mode, rate, nbytes = "exact FusedAdamW", r["params_per_s"] / 1e9, 28.0
        elif r["bench"] == "adamw_compact":
            mode = f"{r['master_dtype']}, {r['state_dtype']}"
            rate, nbytes = r["gparams_per_s"], r["bytes_per_param"]
        else:
            continue
        base = exact.get((r["path"], r["threads"]))
        gbps = rate * nbytes
        print(f"| {mode} | {nbytes:.2f} | {r['path']} | {r['threads']} | {rate:.3f} | {gbps:.1f} "
              f"| {100 * gbps / triad.get(r['threads'], float('nan')):.0f}% "
              f"| {rate / base if base else float('nan'):.2f} "
              f"| {args.model_params / (rate * 1e9):.3f} |")


if __name__ == "__main__":
    main()
