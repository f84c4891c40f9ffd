#!/usr/bin/env python3
"""offloadd side of the pipeline benchmark: runs offloadd-train on a random-initialised
model of a given shape with synthetic token batches, under a GPU memory limit, and reports
tokens/s, the step time split per resource and how close each step comes to its slowest resource.

    python3 bench/pipeline/run_bench.py --build build-gpu --shape llama2-7b --batch 4,8,16 \
        --gpu-memory-limit 24GiB [--steps 6 --warmup 2 --workers 1x15 --json out.json]

For every step the trainer reports (StepStats): wall time, GPU compute busy time (CUDA events
around each block's forward/backward), host-to-device and device-to-host copy busy time (CUDA
events around each copy), CPU optimizer busy time (worker busy seconds / workers), NVMe busy time,
the parameters the CPU updated (AdamW plus corrections) and the bytes per link.

The step-time bound is the largest of
  * GPU compute (busy time in the step);
  * each PCIe direction (busy time);
  * the CPU update: the parameters updated in the step over the rate of the same worker pool
    (processes x threads, same kernel) measured *alone on idle cores* before the run
    (offloadd-workers-bench), not the workers' busy time in the step, which contention inflates;
  * NVMe busy time;
  * host memory traffic: AdamW's 28 B per updated parameter plus the bytes of both DMA directions,
    over the host memory bandwidth measured by the same calibration (the best of STREAM copy,
    triad and the AdamW-shaped copy at the pool's thread count).
"step/bound" = wall time over that bound, per step, then averaged (goal <= 1.10). "CPU busy" is
the workers' busy time in the step, shown for comparison only. Figures are means over the timed
steps.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from baseline_torch import SHAPES, hf_config_dict  # noqa: E402


def write_config(shape: str, out: pathlib.Path, seq: int = 1024) -> pathlib.Path:
    """config.json of the shape's family (baseline_torch.hf_config_dict: Llama, Qwen3, Gemma 3)."""
    cfg = dict(hf_config_dict(shape, seq), initializer_range=0.02, torch_dtype="bfloat16")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


ADAMW_BYTES_PER_PARAM = 28  # bf16 grad in, fp32 master/m/v read and written, bf16 weight out


def calibrate(args) -> dict:
    """Host memory bandwidth and the worker pool's AdamW rate, alone on idle cores."""
    procs, threads = (int(x) for x in args.workers.split("x"))
    cmd = [str(pathlib.Path(args.build) / "bench" / "workers" / "offloadd-workers-bench"),
           f"--params={args.calibration_params}", f"--threads={procs * threads}",
           f"--pool={procs}x{threads}", "--repeats=3"]
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"calibration failed: {r.stderr.strip()[-2000:]}")
    rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    bw = max(x["gbps"] for x in rows if x["bench"] in ("stream_copy", "stream_triad", "stream_adamw_shape"))
    pool = [x for x in rows if x["bench"] == "adamw_pool" and x["crash_consistent"]]
    if not pool:
        raise SystemExit("calibration printed no adamw_pool row")
    cal = {"host_gbps": bw, "cpu_params_per_s": pool[0]["params_per_s"], "kernel": pool[0]["path"],
           "pool": f"{procs}x{threads}"}
    print(f"calibration: host memory {bw:.1f} GB/s; AdamW pool {cal['pool']} ({cal['kernel']}) alone "
          f"{cal['cpu_params_per_s'] / 1e9:.2f} G params/s", flush=True)
    return cal


def step_bound(x: dict, cal: dict, held: bool = False) -> dict:
    """The step-time bound of one step (see the module doc) and its parts. held: the step's
    updates waited for its global norm (clipping without speculation, fp16), so none overlapped
    its backward: "held_bound" adds that dependency, GPU backward + the longer of the next
    forward and the CPU update (at the larger of its pool-rate and host-memory times)."""
    params = x.get("cpu_update_params", 0)
    # LSP's materialisations run on the compute stream beside the compute spans: GPU work too.
    parts = {"gpu": x["gpu_compute_seconds"] + x.get("lsp_decompress_seconds", 0.0), "h2d": x["h2d_seconds"], "d2h": x["d2h_seconds"],
             "cpu": params / cal["cpu_params_per_s"] if cal else x["cpu_update_seconds"],
             # The disk at its measured rates (--nvme-gbps): every byte read and written, states
             # and activations, on drives reads and writes share; else the store's busy time.
             "nvme": (x.get("nvme_read_bytes", 0) / (cal["nvme_read_gbps"] * 1e9) +
                      x.get("nvme_write_bytes", 0) / (cal["nvme_write_gbps"] * 1e9))
             if cal.get("nvme_read_gbps") else x["nvme_seconds"],
             "host_mem": (ADAMW_BYTES_PER_PARAM * params + x["h2d_bytes"] + x["d2h_bytes"]) / (cal["host_gbps"] * 1e9)
             if cal else 0.0}
    limit = max(parts, key=parts.get)
    out = {"bound_seconds": parts[limit], "bound_by": limit, "parts": parts,
           "step_over_bound": x["step_seconds"] / max(parts[limit], 1e-9)}
    fwd = x.get("gpu_forward_seconds", 0.0)
    update = max(parts["cpu"], ADAMW_BYTES_PER_PARAM * params / (cal["host_gbps"] * 1e9) if cal else 0.0)
    dep = (x["gpu_compute_seconds"] - fwd) + max(fwd, update) if held else 0.0
    out["held_bound_seconds"] = max(dep, parts[limit])
    out["step_over_held_bound"] = x["step_seconds"] / max(out["held_bound_seconds"], 1e-9)
    return out


def host_used_bytes() -> int:
    """MemTotal - MemAvailable: what the machine's processes hold, the shared arena (shmem)
    included; the page cache is not counted."""
    info = {}
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        k, v = line.split(":", 1)
        info[k] = int(v.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


class HostMemoryPeak:
    """Samples host_used_bytes every 0.2 s while a run lasts; peak is over the level before it."""

    def __init__(self):
        self.base = host_used_bytes()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, host_used_bytes())

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return {"host_peak_gib": (self.peak - self.base) / 2**30, "host_base_gib": self.base / 2**30}


def run(args, batch: str, model_dir: pathlib.Path, work: pathlib.Path, cal: dict) -> dict:
    # batch: N, or auto / auto:N (per_device_train_batch_size auto).
    tag = batch.replace(":", "")
    stats_path = work / f"stats-b{tag}.jsonl"
    trace = work / f"trace-{args.shape}-b{tag}.json"
    cmd = [str(pathlib.Path(args.build) / "trainer" / "offloadd-train"), f"--model={model_dir}",
           "--random-init", f"--synthetic-seq={args.seq}", f"--batch-size={batch}",
           f"--grad-accum={args.grad_accum}", f"--max-steps={args.steps + args.warmup}",
           f"--device={args.device}", f"--dtype={args.dtype}", f"--gpu-memory-limit={args.gpu_memory_limit}",
           f"--workers={args.workers}", f"--max-grad-norm={args.max_grad_norm}", "--lr=1e-5",
           "--scheduler=constant", *([f"--speculate={args.speculate}"] if args.speculate != "default" else []),
           f"--stats-jsonl={stats_path}", f"--trace={trace}", f"--trace-steps={args.warmup + 2}",
           f"--activations={args.activations}", f"--weights={args.weights}",
           f"--update-depth={args.update_depth}", f"--device-optimizer-blocks={args.device_optimizer_blocks}"]
    if args.train_args:  # further offloadd-train flags, e.g. --host-weight-copy
        cmd += args.train_args.split()
    if args.compression:  # LSP-Offload
        cmd += [f"--compression={args.compression}"]
    if args.profile_dir:  # node and shape profiles cached across runs
        cmd += [f"--profile-dir={args.profile_dir}"]
    if args.tier == "nvme":
        cmd += ["--tier=nvme"]
    if args.nvme_dir:  # the optimizer tier and/or activations offloaded to NVMe
        cmd += [f"--nvme-dir={args.nvme_dir}"]
    print("$", " ".join(cmd), flush=True)
    mem = HostMemoryPeak()
    r = subprocess.run(cmd, capture_output=True, text=True)
    host = mem.stop()
    sys.stdout.write(r.stdout[-4000:])
    sys.stderr.write(r.stderr[-4000:])
    if r.returncode != 0:
        return {"batch": batch, "error": (r.stderr.strip().splitlines() or ["?"])[-1], **host}
    plan = next((l for l in r.stderr.splitlines() if "plan:" in l), "")
    # The planner's prediction beside the measured step, and what it profiled.
    notes = [l.split("] ", 1)[-1] for l in r.stderr.splitlines()
             if any(k in l for k in ("batch size (auto", "step plan check", "shape profile", "GPU working set from",
                                     "wait for the backward in pinned host", "device optimizer (auto)"))]
    rows = [json.loads(l) for l in stats_path.read_text().splitlines() if l.strip()]
    checks = [x for x in rows if "lsp_checked" in x]  # LSP projector checks
    rows = [x for x in rows if "loss" in x]
    timed = rows[args.warmup:] or rows
    mean = lambda k: sum(x[k] for x in timed) / len(timed)
    res = {k: mean(k) for k in ("step_seconds", "gpu_compute_seconds", "h2d_seconds", "d2h_seconds",
                                "cpu_update_seconds", "nvme_seconds", "stall_weights_seconds",
                                "stall_grads_seconds", "stall_optimizer_seconds", "h2d_bytes",
                                "d2h_bytes", "model_flops", "tokens")}
    for k in ("nvme_read_bytes", "nvme_write_bytes"):  # per step: the states' and activations'
        res[k] = sum(x.get(k, 0) for x in timed) / len(timed)
    res["batch"] = batch
    res.update(host)
    res["arena_gib"] = max(x.get("arena_bytes", 0) for x in rows) / 2**30
    res["pinned_host_gib"] = max(x.get("pinned_host_bytes", 0) for x in rows) / 2**30
    auto = [n for n in notes if "batch size (auto" in n]
    res["chosen"] = auto[0] if auto else ""
    res["clip_rate"] = sum(1 for x in timed if x.get("clipped")) / len(timed)
    res["speculated_layers"] = sum(x.get("speculated_layers", 0) for x in timed) / len(timed)
    res["corrected_layers"] = sum(x.get("corrected_layers", 0) for x in timed) / len(timed)
    res["nvme_activation_bytes"] = sum(x.get("nvme_activation_bytes", 0) for x in timed) / len(timed)
    res["stall_activations_seconds"] = sum(x.get("stall_activations_seconds", 0) for x in timed) / len(timed)
    for k in ("lsp_compress_seconds", "lsp_decompress_seconds"):  # LSP: GPU time (job/step_stats.h)
        res[k] = sum(x.get(k, 0) for x in timed) / len(timed)
    res["tokens_per_second"] = res["tokens"] / res["step_seconds"]
    res["model_tflops"] = res["model_flops"] / res["step_seconds"] / 1e12
    held = lambda x: (args.max_grad_norm > 0 or args.dtype == "fp16") and x.get("speculated_layers", 0) == 0
    bounds = [step_bound(x, cal, held(x)) for x in timed]
    res["per_step"] = [{"step": x["step"], "step_seconds": x["step_seconds"], **b} for x, b in zip(timed, bounds)]
    res["bound_seconds"] = sum(b["bound_seconds"] for b in bounds) / len(bounds)
    res["step_over_bound"] = sum(b["step_over_bound"] for b in bounds) / len(bounds)
    res["held_bound_seconds"] = sum(b["held_bound_seconds"] for b in bounds) / len(bounds)
    res["step_over_held_bound"] = sum(b["step_over_held_bound"] for b in bounds) / len(bounds)
    res["bound_by"] = max(set(b["bound_by"] for b in bounds), key=[b["bound_by"] for b in bounds].count)
    for k in ("cpu", "host_mem", "nvme"):
        res[f"{k}_bound_seconds"] = sum(b["parts"][k] for b in bounds) / len(bounds)
    res["calibration"] = cal
    res["gpu_peak_gib"] = max(x["gpu_peak_bytes"] for x in rows) / 2**30
    res["time_to_first_step_seconds"] = rows[0].get("time_to_first_step_seconds", 0)
    res["plan"] = plan
    res["planner_notes"] = notes
    res["lsp_checks"] = checks
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build-gpu")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama2-7b")
    p.add_argument("--batch", default="4", help="micro-batches, comma-separated: N, auto or auto:N")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda")
    p.add_argument("--gpu-memory-limit", default="24GiB")
    p.add_argument("--workers", default="1x15")
    p.add_argument("--activations", default="auto")
    p.add_argument("--weights", default="auto")
    p.add_argument("--tier", default="cpu")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--nvme-dir", default="")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--speculate", default="never", choices=["never", "always", "auto", "default"],
                   help="default: the trainer's own (auto on a GPU, never on the CPU)")
    p.add_argument("--update-depth", type=int, default=1, help="updates queued per worker process")
    p.add_argument("--device-optimizer-blocks", default="auto",
                   help="the lowest N blocks' AdamW states on the GPU (N or auto)")
    p.add_argument("--calibration-params", type=int, default=1 << 27,
                   help="parameters for the idle-core calibration (default 2^27: 3.8 GB of AdamW traffic)")
    p.add_argument("--no-calibrate", action="store_true",
                   help="bound the CPU by its busy time and leave host memory out (not the honest bound)")
    p.add_argument("--profile-dir", default="",
                   help="--profile-dir for offloadd-train: node and shape profiles cached across runs")
    p.add_argument("--compression", default="", help="offloadd-train --compression, e.g. lsp or lsp:rank=256")
    p.add_argument("--train-args", default="", help="more offloadd-train flags, space-separated")
    p.add_argument("--nvme-gbps", default="",
                   help="READ,WRITE: the store directories' measured GB/s (bench/storage); the NVMe "
                        "term of the bound is then the step's disk bytes at these rates")
    p.add_argument("--json")
    args = p.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="offloadd-bench-"))
    model_dir = write_config(args.shape, work / "model", args.seq)
    cal = {} if args.no_calibrate else calibrate(args)
    if args.nvme_gbps:
        cal["nvme_read_gbps"], cal["nvme_write_gbps"] = (float(v) for v in args.nvme_gbps.split(","))
    results = [run(args, b, model_dir, work, cal) for b in args.batch.split(",")]
    print(f"\n| shape | batch | tok/s | step s | GPU s | H2D s | D2H s | CPU alone s | host mem s | NVMe s | "
          f"bound | step/bound | CPU busy s | stalls w/g/o s | TFLOP/s | GPU peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {args.shape} | {r['batch']} | error: {r['error']} |")
            continue
        print(f"| {args.shape} | {r['batch']} | {r['tokens_per_second']:.0f} | {r['step_seconds']:.3f} | "
              f"{r['gpu_compute_seconds']:.3f} | {r['h2d_seconds']:.3f} | {r['d2h_seconds']:.3f} | "
              f"{r['cpu_bound_seconds']:.3f} | {r['host_mem_bound_seconds']:.3f} | {r['nvme_seconds']:.3f} | "
              f"{r['bound_by']} {r['bound_seconds']:.3f} | {r['step_over_bound']:.2f} | {r['cpu_update_seconds']:.3f} | "
              f"{r['stall_weights_seconds']:.2f}/{r['stall_grads_seconds']:.2f}/{r['stall_optimizer_seconds']:.2f} | "
              f"{r['model_tflops']:.0f} | {r['gpu_peak_gib']:.1f} |")
    print("\n| shape | batch | tok/s | host RAM peak GiB (over the level before the run) | arena GiB | pinned GiB |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {args.shape} | {r['batch']} | {r.get('tokens_per_second', 0):.0f} | "
              f"{r.get('host_peak_gib', 0):.1f} | {r.get('arena_gib', 0):.1f} | {r.get('pinned_host_gib', 0):.1f} |")
    for r in results:
        if "clip_rate" in r:
            print(f"batch {r['batch']}: max_grad_norm {args.max_grad_norm}, speculate {args.speculate}: clip rate "
                  f"{r['clip_rate']:.0%}, speculated layers/step {r['speculated_layers']:.1f}, corrected "
                  f"{r['corrected_layers']:.1f}")
        if "per_step" in r:
            print(f"batch {r['batch']}: step/bound per step " +
                  ", ".join(f"{x['step']}: {x['step_over_bound']:.2f} ({x['bound_by']})" for x in r["per_step"]))
            print(f"batch {r['batch']}: with the held updates' dependency: bound {r['held_bound_seconds']:.3f} s, "
                  f"step/bound {r['step_over_held_bound']:.2f}")
        if "plan" in r:
            print(f"batch {r['batch']}: {r['plan']}")
        for note in r.get("planner_notes", []):
            print(f"batch {r['batch']}: {note}")
        if r.get("lsp_checks"):
            print(f"batch {r['batch']}: LSP GPU time per step: compression {r['lsp_compress_seconds']:.4f} s, "
                  f"decompression (materialisation) {r['lsp_decompress_seconds']:.4f} s; GPU compute "
                  f"{r['gpu_compute_seconds']:.3f} s (compression inside it, materialisation beside it)")
        for c in r.get("lsp_checks", []):
            print(f"batch {r['batch']}: LSP check before step {c['step']}: {c['lsp_checked']} matrices, "
                  f"{c['lsp_switched']} switched, bias {c['lsp_mean_bias']:.3f} -> {c['lsp_mean_bias_after']:.3f}, "
                  f"{c['lsp_check_seconds']:.1f} s")
        if r.get("nvme_activation_bytes"):
            print(f"batch {r['batch']}: activations to/from NVMe {r['nvme_activation_bytes'] / 2**30:.2f} GiB "
                  f"per step, step loop waited {r['stall_activations_seconds']:.3f} s for them")
    print(f"traces and stats: {work}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
