#!/usr/bin/env python3
"""Storage benchmark: TensorStore (offloadd-storage-bench) next to fio, same directory and sizes.

Prints a Markdown table of GB/s for sequential write, sequential read and mixed read+write at
several aio block sizes and queue depths, plus store/fio ratios. Without fio on PATH, prints the
store's figures alone.

  bench/storage/run_bench.py --dir /nvme0/bench [--dir /nvme1/bench] [--size 16GiB] \
      [--block-sizes 256KiB,1MiB,4MiB] [--queue-depths 8,32,64] [--bench build/bench/storage/offloadd-storage-bench]

fio runs with the io_uring engine, O_DIRECT, registered buffers and files, one job per directory
(sizes split by the same weights), `end_fsync=1` on the writing phases (the store fdatasyncs
every tensor it commits). Both read what their own write phase laid out; the last column is fio
reading the store's own data file (same bytes, same placement on the device), which separates
the engine from the file layout on virtual disks. Each directory gets a
scratch subdirectory that is removed at the end.
"""
import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30}


def parse_size(text):
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 4GiB, 1MiB)")
    return int(m.group(1)) * UNITS[m.group(2).lower()]


def human(n):
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


def default_bench():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for build in ("build", "build-gpu", "build-storage", "build-storage-dev"):
        p = os.path.join(root, build, "bench", "storage", "offloadd-storage-bench")
        if os.path.exists(p):
            return p
    return "offloadd-storage-bench"


def run_store(args, dirs, bs, qd):
    cmd = [args.bench, f"--size={args.size}", f"--tensor-size={args.tensor_size}",
           f"--block-size={bs}", f"--queue-depth={qd}", f"--in-flight={args.in_flight}",
           "--phases=write,read,mixed"] + [f"--dir={d}:{w}" for d, w in dirs]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"store bench failed: {' '.join(cmd)}\n{out.stdout}{out.stderr}")
    res = {}
    for line in out.stdout.splitlines():
        kv = dict(x.split("=", 1) for x in line.split() if "=" in x)
        if "phase" in kv:
            res[kv["phase"]] = float(kv["gbps"])
        elif "engine" in kv:
            res["engine"] = kv["engine"]
    return res, cmd


def run_fio(args, dirs, bs, qd, rw, fixed=True, store_file=False):
    total_w = sum(w for _, w in dirs)
    cmd = ["fio", "--output-format=json", "--ioengine=io_uring", "--direct=1", f"--bs={bs}",
           f"--iodepth={qd}", f"--rw={rw}", "--group_reporting"]
    if fixed:
        cmd += ["--fixedbufs", "--registerfiles"]
    if rw in ("write", "rw"):
        cmd.append("--end_fsync=1")
    if rw == "rw":
        cmd.append("--rwmixread=50")
    for i, (d, w) in enumerate(dirs):
        size = (int(args.size * w / total_w) // bs) * bs
        name = "data" if store_file else f"fio.{i}"  # "data": the store's own data file
        cmd += [f"--name=job{i}", f"--directory={d}", f"--size={size}", f"--filename={name}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        if fixed:
            return run_fio(args, dirs, bs, qd, rw, fixed=False, store_file=store_file)
        sys.exit(f"fio failed: {' '.join(cmd)}\n{out.stderr}")
    job = json.loads(out.stdout[out.stdout.find("{"):])["jobs"][0]
    return (job["read"]["bw_bytes"] + job["write"]["bw_bytes"]) / 1e9, cmd


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", action="append", required=True, help="directory (repeat per SSD), PATH[:WEIGHT]")
    p.add_argument("--size", type=parse_size, default=parse_size("2GiB"), help="bytes per phase (default 2GiB)")
    p.add_argument("--tensor-size", type=parse_size, default=parse_size("64MiB"))
    p.add_argument("--in-flight", type=int, default=4, help="tensors in flight in the store bench")
    p.add_argument("--block-sizes", default="256KiB,1MiB,4MiB")
    p.add_argument("--queue-depths", default="8,32,64")
    p.add_argument("--bench", default=default_bench(), help="path of offloadd-storage-bench")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs per cell, store and fio interleaved; the median is reported (default 3)")
    p.add_argument("--best", action="store_true",
                   help="report the best run of each cell instead of the median (for shared, noisy machines)")
    args = p.parse_args()

    dirs = []
    for spec in args.dir:
        path, _, w = spec.rpartition(":") if re.search(r":[0-9.]+$", spec) else (spec, "", "1")
        os.makedirs(path, exist_ok=True)
        dirs.append((tempfile.mkdtemp(prefix="offloadd-bench-", dir=path), float(w)))
    have_fio = shutil.which("fio") is not None
    fs = []
    if shutil.which("df"):
        fs = subprocess.run(["df", "--output=source,fstype"] + [d for d, _ in dirs],
                            capture_output=True, text=True).stdout.split("\n")[1:]
    print(f"# storage bench: {platform.node()} {platform.release()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"# command: {' '.join(sys.argv)}")
    print(f"# dirs: {', '.join(f'{d} (w={w:g})' for d, w in dirs)}; fs: {'; '.join(x.strip() for x in fs if x.strip())}")
    print(f"# size per phase {human(args.size)}, tensors of {human(args.tensor_size)}, "
          f"{args.in_flight} tensors in flight; {'best' if args.best else 'median'} of {args.repeat} runs per cell; "
          f"fio: {'present' if have_fio else 'ABSENT (store figures only)'}")
    print()
    print("| phase | block_size | queue_depth | store GB/s | fio GB/s | store/fio | fio on the store's file GB/s |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    try:
        for bs in [parse_size(x) for x in args.block_sizes.split(",")]:
            for qd in [int(x) for x in args.queue_depths.split(",")]:
                runs, fio_runs = [], []
                for _ in range(max(1, args.repeat)):
                    runs.append(run_store(args, dirs, bs, qd)[0])
                    if have_fio:
                        f = {}
                        # fio reading the file the store just wrote: same bytes, same placement.
                        f["read_store_file"], _ = run_fio(args, dirs, bs, qd, "read", store_file=True)
                        for phase, rw in (("write", "write"), ("read", "read"), ("mixed", "rw")):
                            f[phase], _ = run_fio(args, dirs, bs, qd, rw)
                        fio_runs.append(f)
                        for d, _ in dirs:
                            for name in os.listdir(d):
                                if name.startswith("fio."):
                                    os.unlink(os.path.join(d, name))
                median = lambda xs: sorted(xs)[len(xs) // 2]
                pick = max if args.best else median
                store = {ph: pick([r.get(ph, 0.0) for r in runs]) for ph in ("write", "read", "mixed")}
                store["engine"] = runs[0].get("engine", "?")
                fio = ({ph: pick([r[ph] for r in fio_runs]) for ph in ("write", "read", "mixed", "read_store_file")}
                       if fio_runs else {})
                for phase in ("write", "read", "mixed"):
                    s = store.get(phase, 0.0)
                    if phase in fio:
                        r = s / fio[phase] if fio[phase] > 0 else 0
                        ratios.append(r)
                        extra = f"{fio['read_store_file']:.2f}" if phase == "read" else ""
                        print(f"| {phase} | {human(bs)} | {qd} | {s:.2f} | {fio[phase]:.2f} | {100 * r:.0f}% | {extra} |",
                              flush=True)
                    else:
                        print(f"| {phase} | {human(bs)} | {qd} | {s:.2f} | - | - | |", flush=True)
    finally:
        for d, _ in dirs:
            shutil.rmtree(d, ignore_errors=True)
    if ratios:
        ratios.sort()
        print(f"\nstore/fio: median {100 * ratios[len(ratios) // 2]:.0f}%, min {100 * ratios[0]:.0f}%, "
              f"max {100 * ratios[-1]:.0f}% over {len(ratios)} cells (engine {store.get('engine', '?')})")


if __name__ == "__main__":
    main()
