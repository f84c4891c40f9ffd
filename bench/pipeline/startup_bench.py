#!/usr/bin/env python3
"""Time to first step: where the seconds before a job's first step go, for a
model read from a checkpoint on local disk, and the physical rates that bound them.

    python3 bench/pipeline/startup_bench.py --build build-gpu --shape llama2-7b --dir /root/ckpt \
        --runs "serial:--setup-threads=1,parallel:--no-setup-overlap,overlap:" [--cold] [--json out.json]

1. Writes a checkpoint of the shape (random bf16 weights from transformers' LlamaConfig /
   LlamaForCausalLM parameter names and shapes, in 5 GB safetensors shards with an index, as
   save_pretrained lays them out) into --dir, unless one is there. Not timed.
2. Measures the rates that bound the set-up: the disk's sequential read (O_DIRECT, one reader and
   four at once), page-locking (cudaHostRegister of already-touched memory, one thread), and
   fault-in plus first write of fresh memory (one thread and all cores).
3. Runs offloadd-train on the checkpoint per --runs entry (name:extra flags), each after dropping
   the page cache with --cold (else the checkpoint is in the page cache), with the trainer's
   per-phase set-up (StepStats::setup_phase_seconds) and the process's wall time from its start
   to its first step's report, and its second step's time for scale.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from run_bench import write_config  # noqa: E402

PHASES = ["cuda", "model", "data", "plan", "arena", "workers", "weights", "device"]
# Phases that may run beside each other (the arena is populated in the background): the table gives
# their start (@ seconds from the trainer's creation) with their duration.
OVERLAPPING = ("arena", "workers", "weights", "device")


def write_checkpoint(shape: str, out: pathlib.Path) -> float:
    """Random bf16 weights named and shaped as LlamaForCausalLM's, in <= 5 GB shards."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    write_config(shape, out)
    if (out / "model.safetensors.index.json").exists():
        return 0.0
    t0 = time.time()
    cfg = LlamaConfig.from_pretrained(out)
    with torch.device("meta"):
        shapes = {n: tuple(p.shape) for n, p in LlamaForCausalLM(cfg).named_parameters()}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    shard, shard_bytes, index, k = {}, 0, {}, 0
    total = sum(torch.Size(s).numel() * 2 for s in shapes.values())
    n_shards = (total + 5 * 10**9 - 1) // (5 * 10**9)

    def flush():
        nonlocal shard, shard_bytes, k
        if not shard:
            return
        k += 1
        name = f"model-{k:05d}-of-{n_shards:05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        for t in shard:
            index[t] = name
        shard, shard_bytes = {}, 0

    for name, shape in shapes.items():
        t = torch.empty(shape, dtype=torch.bfloat16, device=dev)
        if len(shape) == 1:
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=gen)
        nbytes = t.numel() * 2
        if shard_bytes + nbytes > 5 * 10**9:
            flush()
        shard[name] = t.cpu()
        shard_bytes += nbytes
    flush()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=1))
    os.sync()
    return time.time() - t0


def drop_caches() -> bool:
    os.sync()
    try:
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def disk_rates(ckpt: pathlib.Path) -> dict:
    """O_DIRECT sequential reads of the shards: one reader over all, then every shard at once."""
    files = sorted(ckpt.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files)
    out = {"checkpoint_bytes": size}
    drop_caches()
    t0 = time.time()
    for f in files:
        subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=16M", "iflag=direct"], check=True,
                       capture_output=True)
    out["disk_read_gbps_1"] = size / (time.time() - t0) / 1e9
    drop_caches()
    t0 = time.time()
    procs = [subprocess.Popen(["dd", f"if={f}", "of=/dev/null", "bs=16M", "iflag=direct"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for f in files]
    for p in procs:
        p.wait()
    out["disk_read_gbps_parallel"] = size / (time.time() - t0) / 1e9
    return out


def memory_rates() -> dict:
    """Fault-in + first write of fresh memory, one thread and all threads; pinning one thread."""
    import torch
    out = {}
    n = 8 << 30
    for threads in (1, os.cpu_count() or 1):
        torch.set_num_threads(threads)
        t0 = time.time()
        x = torch.empty(n, dtype=torch.uint8)
        x.fill_(1)
        out[f"fault_write_gbps_{threads}"] = n / (time.time() - t0) / 1e9
        t0 = time.time()
        x.fill_(2)
        out[f"write_gbps_{threads}"] = n / (time.time() - t0) / 1e9
        del x
    if torch.cuda.is_available():
        x = torch.ones(n, dtype=torch.uint8)
        cudart = torch.cuda.cudart()
        t0 = time.time()
        rc = cudart.cudaHostRegister(x.data_ptr(), n, 0)
        dt = time.time() - t0
        out["pin_gbps_1"] = n / dt / 1e9 if int(rc) == 0 else None
        if int(rc) == 0:
            cudart.cudaHostUnregister(x.data_ptr())
    return out


def run_train(args, name: str, extra: list[str], work: pathlib.Path, cold: bool) -> dict:
    stats = work / f"stats-{name}.jsonl"
    stats.unlink(missing_ok=True)
    cmd = [str(pathlib.Path(args.build) / "trainer" / "offloadd-train"), f"--model={args.dir}",
           f"--synthetic-seq={args.seq}", f"--batch-size={args.batch}", "--max-steps=2",
           "--device=cuda", "--dtype=bf16", f"--gpu-memory-limit={args.gpu_memory_limit}",
           f"--workers={args.workers}", "--lr=1e-5", "--scheduler=constant", "--no-export",
           f"--stats-jsonl={stats}", *extra]
    dropped = drop_caches() if cold else False
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = setup_logged = None
    lines = []
    for line in p.stdout:
        lines.append(line)
        if first is None and line.startswith("step 1/"):
            first = time.time() - t0
        if setup_logged is None and "set-up " in line:
            setup_logged = time.time() - t0
    err = "".join(lines)
    rc = p.wait()
    wall = time.time() - t0
    if rc != 0:
        return {"name": name, "error": err.strip().splitlines()[-1:] or ["?"]}
    rows = [json.loads(l) for l in stats.read_text().splitlines() if l.strip()]
    steps = [r for r in rows if "loss" in r]
    s1 = steps[0]
    res = {"name": name, "cold": cold and dropped, "extra": extra,
           "time_to_first_step": s1.get("time_to_first_step_seconds"),
           "phases": {ph: s1.get(f"setup_{ph}_seconds") for ph in PHASES},
           "starts": {ph: s1.get(f"setup_{ph}_start_seconds") for ph in PHASES},
           "first_step_seconds": s1["step_seconds"],
           "second_step_seconds": steps[1]["step_seconds"] if len(steps) > 1 else None,
           "process_to_first_step_report": first, "process_wall": wall,
           "log": [l.split("] ", 1)[-1] for l in err.splitlines() if "set-up" in l or "plan:" in l]}
    # Process start to the trainer's creation (loading LibTorch and CUDA's libraries): the set-up
    # line is logged at its end; the trainer's own figure runs from its creation to the step. The
    # phases overlap (the arena is populated beside the weights): the set-up ends at the last one's end.
    ends = [res["starts"][p] + res["phases"][p] for p in PHASES
            if res["starts"].get(p) is not None and res["phases"].get(p) is not None and res["starts"][p] >= 0]
    setup_total = max(ends) if ends else sum(v or 0 for v in res["phases"].values())
    res["setup_end"] = setup_total
    if setup_logged is not None:
        res["process_before_trainer"] = setup_logged - setup_total
        res["process_to_first_step_start"] = res["process_before_trainer"] + (res["time_to_first_step"] or 0)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--shape", default="llama2-7b")
    ap.add_argument("--dir", default="/root/offloadd-ckpt-7b")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--gpu-memory-limit", default="24GiB")
    ap.add_argument("--workers", default="1x15")
    ap.add_argument("--runs", default="serial:--setup-threads=1,parallel:--no-setup-overlap,overlap:",
                    help="comma-separated name:flags (flags space-separated)")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each run")
    ap.add_argument("--no-rates", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    work = pathlib.Path("/tmp/offloadd-startup")
    work.mkdir(parents=True, exist_ok=True)
    ckpt = pathlib.Path(args.dir)
    gen = write_checkpoint(args.shape, ckpt)
    print(f"checkpoint {ckpt}: written in {gen:.1f} s (not timed)" if gen else f"checkpoint {ckpt}: present",
          flush=True)
    result = {"rates": {}, "runs": []}
    if not args.no_rates:
        result["rates"].update(disk_rates(ckpt))
        result["rates"].update(memory_rates())
        print("rates:", json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                    for k, v in result["rates"].items()}), flush=True)
    for spec in args.runs.split(","):
        name, _, flags = spec.partition(":")
        r = run_train(args, name, flags.split(), work, args.cold)
        result["runs"].append(r)
        print(json.dumps(r), flush=True)
    print("\n| run | cold cache | process start -> first step s | trainer set-up -> first step s | "
          + " | ".join(PHASES) + " | first step s | second step s |")
    print("|---|---|---|---|" + "---|" * len(PHASES) + "---|---|")
    for r in result["runs"]:
        if "error" in r:
            print(f"| {r['name']} | error: {r['error']} |")
            continue
        def cell(p):
            d, st = r["phases"][p], r["starts"].get(p)
            if d is None:
                return "-"
            return f"{d:.2f}" + (f" @{st:.2f}" if st is not None and st >= 0 and p in OVERLAPPING else "")
        ph = " | ".join(cell(p) for p in PHASES)
        pf = r.get("process_to_first_step_start")
        print(f"| {r['name']} | {r['cold']} | {pf:.1f} | {r['time_to_first_step']:.1f} | {ph} | "
              f"{r['first_step_seconds']:.2f} | {r['second_step_seconds'] or 0:.2f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if all("error" not in r for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
