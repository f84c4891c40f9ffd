#!/usr/bin/env python3
"""Helper of bench/data_parallel/run_hosts_bench.sh (standard library only).

    hosts_bench.py sample --out PEAK.json --label NAME PID...   # until every PID has exited
    hosts_bench.py report --one ONE.stats.jsonl --hosts HOSTS.stats.jsonl --skip 1 \\
        --peaks ONE.peak.json HOSTS-h0.peak.json ... [--json OUT.json]

sample: every 0.5 s, the sum of Pss (/proc/PID/smaps_rollup) over the PIDs and all their
descendants (the ranks, their CPU workers and stores): the arena is a memfd every one of them maps,
and Pss counts each shared page once over the processes that map it. The peak of that sum is the
group's (or one simulated host's) host RAM peak.

report: tokens/s of each run (the mean over the steps after the first --skip of tokens /
step_seconds, from rank 0's --stats-jsonl; "tokens" is the global batch's), the overhead of the
hosts run against the one-group run, the host RAM peaks, and the per-step loss agreement (max
|loss_a - loss_b| / |loss_a|).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time


def children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(d))
    return out


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cmd_sample(a) -> int:
    roots = [int(p) for p in a.pids]
    peak = 0
    while any(os.path.exists(f"/proc/{p}") for p in roots):
        tree = children()
        todo, seen = list(roots), set()
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            todo.extend(tree.get(p, []))
        peak = max(peak, sum(pss_kib(p) for p in seen))
        time.sleep(0.5)
    pathlib.Path(a.out).write_text(json.dumps({"label": a.label, "peak_gib": peak / 2**20}))
    return 0


def stats(path: str) -> list[dict]:
    try:
        text = pathlib.Path(path).read_text()
    except OSError:
        return []
    return [json.loads(l) for l in text.splitlines() if l.strip().startswith("{")]


def tok_s(rows: list[dict], skip: int) -> float | None:
    rows = [r for r in rows if r.get("step", 0) > skip and r.get("step_seconds", 0) > 0]
    if not rows:
        return None
    return sum(r["tokens"] / r["step_seconds"] for r in rows) / len(rows)


def cmd_report(a) -> int:
    one, hosts = stats(a.one), stats(a.hosts)
    t1, t2 = tok_s(one, a.skip), tok_s(hosts, a.skip)
    out: dict = {"one_group_tok_s": t1, "hosts_tok_s": t2, "steps": [len(one), len(hosts)]}
    fmt = lambda v: "n/a" if v is None else f"{v:,.0f}"  # noqa: E731
    print(f"(a) one group, one arena:        {fmt(t1)} tok/s ({len(one)} steps)")
    print(f"(b) two hosts, separate arenas:  {fmt(t2)} tok/s ({len(hosts)} steps)")
    if t1 and t2:
        out["overhead"] = 1.0 - t2 / t1
        print(f"overhead of (b): {100 * out['overhead']:.1f}% (goal <= 10%)")
    for p in a.peaks:
        try:
            d = json.loads(pathlib.Path(p).read_text())
        except (OSError, ValueError):
            continue
        out.setdefault("host_ram_peak_gib", {})[d["label"]] = d["peak_gib"]
        print(f"host RAM peak, {d['label']}: {d['peak_gib']:.1f} GiB")
    la = {r["step"]: r["loss"] for r in one}
    lb = {r["step"]: r["loss"] for r in hosts}
    common = sorted(set(la) & set(lb))
    if common:
        rel = max(abs(la[s] - lb[s]) / max(abs(la[s]), 1e-12) for s in common)
        out["loss_max_rel_diff"] = rel
        print(f"loss agreement over {len(common)} steps: max relative difference {rel:.2e}")
        for s in common:
            print(f"  step {s}: {la[s]:.6f} vs {lb[s]:.6f}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(out, indent=2))
    ok = t1 is not None and t2 is not None and len(one) == len(hosts) and len(one) > 0
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--out", required=True)
    s.add_argument("--label", required=True)
    s.add_argument("pids", nargs="+")
    r = sub.add_parser("report")
    r.add_argument("--one", required=True)
    r.add_argument("--hosts", required=True)
    r.add_argument("--skip", type=int, default=1)
    r.add_argument("--peaks", nargs="*", default=[])
    r.add_argument("--json")
    a = p.parse_args()
    return cmd_sample(a) if a.cmd == "sample" else cmd_report(a)


if __name__ == "__main__":
    sys.exit(main())
