#!/usr/bin/env python3
"""The mixture-of-experts benchmark's summary (bench/moe/run_moe_bench.sh): one table of every run
found in OUT_DIR (offloadd through bench/pipeline/run_bench.py's JSON, PyTorch through
baseline_torch.py's) and the goals' ratios.

    python3 bench/moe/summarize.py /tmp/moe-bench
"""
import json
import pathlib
import sys

RUNS = [("a-offloadd", "OLMoE-1B-7B", 1), ("a-torch", "OLMoE-1B-7B", 1), ("b1-offloadd", "Qwen3-30B-A3B", 1),
        ("b4-offloadd", "Qwen3-30B-A3B", 4), ("t4-torch", "Qwen3-30B-A3B", 4)]


def best(out: pathlib.Path, name: str):
    """The run's fastest successful row, normalised: tok/s, GPU peak, host peak, CPU update."""
    path = out / f"{name}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if name.endswith("torch"):
        rows = [r for r in data["rows"] if r.get("status") == "ok"]
        if not rows:
            return {"error": ", ".join(f"batch {r['batch']}: {r['status']}" for r in data["rows"])}
        r = max(rows, key=lambda r: r["tokens_per_s"])
        return {"batch": f"{r['batch']}/GPU" if "world" in r else r["batch"], "tok_s": r["tokens_per_s"],
                "gpu_gib": r.get("peak_allocated_bytes", 0) / 2**30, "mfu": r.get("mfu")}
    rows = [r for r in data if "error" not in r]
    if not rows:
        return {"error": "; ".join(r["error"] for r in data)}
    r = max(rows, key=lambda r: r["tokens_per_second"])
    return {"batch": r["chosen"] or r["batch"], "tok_s": r["tokens_per_second"], "gpu_gib": r["gpu_peak_gib"],
            "host_gib": r["host_peak_gib"], "cpu_busy_s": r["cpu_update_seconds"],
            "cpu_bound_s": r["cpu_bound_seconds"], "step_s": r["step_seconds"], "bound": r["bound_by"],
            "bound_s": r["bound_seconds"], "step_over_bound": r["step_over_bound"],
            "tflops": r["model_tflops"]}


def main() -> int:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/moe-bench")
    print("\n| run | model | GPUs | batch | tok/s | GPU peak GiB | host RAM peak GiB | step s | CPU update "
          "busy s | CPU update bound s | step bound | step/bound |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|")
    got = {}
    for name, model, gpus in RUNS:
        r = best(out, name)
        if r is None:
            continue
        got[name] = r
        if "error" in r:
            print(f"| {name} | {model} | {gpus} | error: {r['error'][:200]} |")
            continue
        f = lambda k, fmt: format(r[k], fmt) if r.get(k) is not None else "-"  # noqa: E731
        print(f"| {name} | {model} | {gpus} | {r['batch']} | {r['tok_s']:,.0f} | {f('gpu_gib', '.1f')} | "
              f"{f('host_gib', '.1f')} | {f('step_s', '.2f')} | {f('cpu_busy_s', '.2f')} | {f('cpu_bound_s', '.2f')} | "
              f"{r.get('bound', '-')} {f('bound_s', '.2f')} | {f('step_over_bound', '.2f')} |")
    ok = lambda n: n in got and "error" not in got[n]  # noqa: E731
    if ok("a-offloadd") and ok("a-torch"):
        print(f"OLMoE-1B-7B, 1 GPU: offloadd / native PyTorch = "
              f"{got['a-offloadd']['tok_s'] / got['a-torch']['tok_s']:.2f}x in tok/s (goal >= 1.0)")
    if ok("b4-offloadd") and ok("t4-torch"):
        a, t = got["b4-offloadd"], got["t4-torch"]
        print(f"Qwen3-30B-A3B, 4 GPUs: offloadd / FSDP2 = {a['tok_s'] / t['tok_s']:.2f}x in tok/s (goal >= 1.0), "
              f"GPU memory {a['gpu_gib'] / t['gpu_gib']:.2f}x of FSDP2's (goal < 0.33)")
    layer = out / "layer.json"
    if layer.exists():
        rows = json.loads(layer.read_text())
        for shape in sorted({r["shape"] for r in rows}):
            for b in sorted({r["batch"] for r in rows if r["shape"] == shape}):
                by = {r["gemm"]: r for r in rows if r["shape"] == shape and r["batch"] == b}
                if "loop" in by and "grouped" in by:
                    print(f"{shape} layer, {b} rows: grouped expert GEMMs "
                          f"{by['grouped']['total_ms']:.1f} ms vs loop {by['loop']['total_ms']:.1f} ms "
                          f"({by['loop']['total_ms'] / by['grouped']['total_ms']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
