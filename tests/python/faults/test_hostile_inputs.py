"""Hostile paths and resource exhaustion.

Paths: symlinks and `..` leading out of allowed_roots, FIFOs and devices given as the model's
config.json, the dataset, the chat template and the daemon's own --config, and a dataset that
grows while it is read. Each must be refused, or read with bounds; never hang (every call carries
a gRPC deadline, every job a wait bound) and never read outside the roots.

Exhaustion: a huge dataset line, templates that loop or allocate without bound, huge number
literals, and a safetensors header claiming huge shapes. Each must be refused (at CreateJob or by
the job failing) within CASE_BOUND_S, with the daemon's VmRSS growing by less than RSS_BOUND_MIB
(sampled every 20 ms), and the daemon must still serve afterwards."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import struct
import subprocess
import threading
import time

import pytest

import offloadd
from faultlib import (S, FaultDaemon, PeakRss, make_assets, make_workspace, spec, state_name, wait_final)

CASE_BOUND_S = 20
RSS_BOUND_MIB = 512
SECRET = "outside-the-roots-7f3a"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("hostile_assets"))


@pytest.fixture(scope="module")
def env(binary_dir, tmp_path_factory, assets):
    """One daemon for every case (each case gets its own names): root/ is the only allowed root,
    outside/ holds a model, a dataset and a template the daemon must never read."""
    base = tmp_path_factory.mktemp("hostile")
    root = make_workspace(base / "root", assets)
    outside = make_workspace(base / "outside", assets)
    (outside / "chat.jinja").write_text(SECRET + "{% for m in messages %}{{ m.content }}{% endfor %}")
    (root / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, '
                                     '{"role": "assistant", "content": "hello there"}]}\n' * 32)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", root).start()
    yield root, outside, d
    d.stop()


def chat_spec(root: pathlib.Path, out: str, **kw) -> dict:
    s = spec(root, out, steps=2, save_steps=100, nvme=False, accum=1, **kw)
    s["dataset"] = {"paths": [str(root / "chat.jsonl")], "format": "messages", "max_seq_length": 64}
    return s


def attempt(d: FaultDaemon, s: dict, bound: float = CASE_BOUND_S) -> tuple[str, str, float, int]:
    """CreateJob and, if accepted, the job to its end: (outcome, message, seconds, peak RSS growth
    KiB). outcome: refused | failed | succeeded | hung | daemon died."""
    rss0 = d.rss_kib()
    peak = PeakRss(d.proc.pid)
    t0 = time.monotonic()
    try:
        with offloadd.Client(d.target, timeout=bound) as c:
            try:
                job = c.create_job(s)
            except offloadd.OffloaddError as e:
                code = getattr(getattr(e, "code", None), "name", "")
                return ("hung" if code == "DEADLINE_EXCEEDED" else "refused"), str(e)[:300], time.monotonic() - t0, \
                    peak.stop() - rss0
            final = wait_final(c, job.id, max(1.0, bound - (time.monotonic() - t0)))
            took = time.monotonic() - t0
            if final.state not in (S.JOB_STATE_SUCCEEDED, S.JOB_STATE_FAILED, S.JOB_STATE_CANCELLED):
                c.cancel_job(job.id)
                return "hung", f"{state_name(final.state)} at step {final.progress.step}", took, peak.stop() - rss0
            outcome = {S.JOB_STATE_SUCCEEDED: "succeeded", S.JOB_STATE_FAILED: "failed"}.get(final.state, "cancelled")
            return outcome, final.error.message[:300], took, peak.stop() - rss0
    finally:
        peak.stop()
        if not d.alive():
            return "daemon died", d.log()[-300:], time.monotonic() - t0, 0  # noqa: B012


def record(figures, case: str, outcome: str, msg: str, took: float, rss_kib: int) -> None:
    figures.rows.append({"case": case, "outcome": outcome, "s": round(took, 2), "rss_growth_mib": round(rss_kib / 1024, 1),
                         "message": msg[:200]})
    figures.happened.append(f"{case}: {outcome} in {took:.1f} s, RSS +{rss_kib / 1024:.0f} MiB: {msg[:140]}")


def restart_if_dead(d: FaultDaemon) -> None:
    if not d.alive():
        d.stop()
        d.start()


# ---------------------------------------------------------------- paths


def path_cases(root: pathlib.Path, outside: pathlib.Path) -> dict:
    """name -> spec. Each would read or write outside the roots, or block, if obeyed."""
    os.symlink(outside / "model", root / "link-model")
    os.symlink(outside / "data.jsonl", root / "link-data.jsonl")
    os.symlink(outside / "chat.jinja", root / "link-chat.jinja")
    os.symlink(outside, root / "link-out")
    shutil.copytree(root / "model", root / "model-cfglink")
    (root / "model-cfglink" / "config.json").unlink()
    os.symlink(outside / "model" / "config.json", root / "model-cfglink" / "config.json")
    os.mkfifo(root / "fifo.jsonl")
    os.mkfifo(root / "fifo.jinja")
    shutil.copytree(root / "model", root / "model-fifocfg")
    (root / "model-fifocfg" / "config.json").unlink()
    os.mkfifo(root / "model-fifocfg" / "config.json")
    os.mknod(root / "zero.jsonl", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    os.symlink("/dev/zero", root / "devzero-link.jsonl")
    dotdot = str(root / "model" / ".." / ".." / "outside" / "model")
    cases = {
        "symlinked model dir -> outside": spec(root, "o1", steps=2, save_steps=100, nvme=False, model="link-model"),
        "model config.json symlink -> outside": spec(root, "o2", steps=2, save_steps=100, nvme=False,
                                                     model="model-cfglink"),
        "symlinked dataset -> outside": spec(root, "o3", steps=2, save_steps=100, nvme=False, data="link-data.jsonl"),
        "symlinked template -> outside": chat_spec(root, "o4"),
        "output_dir symlink -> outside": spec(root, "link-out", steps=2, save_steps=100, nvme=False),
        "'..' model path leading outside": spec(root, "o6", steps=2, save_steps=100, nvme=False),
        "FIFO dataset": spec(root, "o7", steps=2, save_steps=100, nvme=False, data="fifo.jsonl"),
        "FIFO template": chat_spec(root, "o8"),
        "FIFO model config.json": spec(root, "o9", steps=2, save_steps=100, nvme=False, model="model-fifocfg"),
        "char device dataset": spec(root, "o10", steps=2, save_steps=100, nvme=False, data="zero.jsonl"),
        "symlink to /dev/zero dataset": spec(root, "o11", steps=2, save_steps=100, nvme=False,
                                             data="devzero-link.jsonl"),
    }
    cases["symlinked template -> outside"]["dataset"]["template"] = str(root / "link-chat.jinja")
    cases["FIFO template"]["dataset"]["template"] = str(root / "fifo.jinja")
    cases["'..' model path leading outside"]["model"]["path"] = dotdot
    return cases


@pytest.mark.timeout(300)
def test_hostile_paths_are_refused_and_never_hang(env, figures):
    root, outside, d = env
    cases = path_cases(root, outside)
    figures.did.append(f"{len(cases)} job specs naming symlinks/'..' out of allowed_roots, FIFOs and devices as "
                       f"model config, dataset and template")
    bad = []
    for name, s in cases.items():
        outcome, msg, took, rss = attempt(d, s)
        record(figures, name, outcome, msg, took, rss)
        out = pathlib.Path(s["output_dir"])
        leaked = out.exists() and not out.is_symlink() and any(
            SECRET in p.read_text(errors="ignore") for p in out.rglob("*") if p.is_file())
        wrote_outside = any(p.name.startswith("checkpoint") or p.name == "model.safetensors" for p in outside.iterdir())
        if outcome not in ("refused", "failed") or leaked or wrote_outside:
            bad.append(f"{name}: {outcome}{' (outside content copied in)' if leaked else ''}"
                       f"{' (wrote outside the roots)' if wrote_outside else ''}: {msg[:120]}")
        restart_if_dead(d)
    figures.lost.append(f"{len(bad)} of {len(cases)} hostile paths not refused" + (": " + "; ".join(bad) if bad else ""))
    assert not bad, figures.defect("hostile paths obeyed or hung: " + " | ".join(bad))


@pytest.mark.timeout(120)
def test_fifo_as_daemon_config_is_refused_within_a_bound(binary_dir, tmp_path, figures):
    fifo = tmp_path / "offloadd.yaml"
    os.mkfifo(fifo)
    figures.did.append("a FIFO as `offloadd --config` and `offloadd --validate-config`")
    bad = []
    for args in (["--config", str(fifo)], ["--validate-config", "--config", str(fifo)]):
        t0 = time.monotonic()
        try:
            r = subprocess.run([str(binary_dir / "daemon" / "offloadd"), *args], capture_output=True, text=True,
                               timeout=10)
            outcome, msg = f"exit {r.returncode}", (r.stdout + r.stderr).strip()[-200:]
            if r.returncode == 0:
                bad.append(f"{' '.join(args[:1])}: accepted")
        except subprocess.TimeoutExpired:
            outcome, msg = "hung", "still blocked after 10 s"
            bad.append(f"{args[0]}: hung reading the FIFO")
        figures.happened.append(f"offloadd {args[0]}: {outcome} in {time.monotonic() - t0:.1f} s: {msg}")
    assert not bad, figures.defect("FIFO as the daemon's config: " + "; ".join(bad))


@pytest.mark.timeout(120)
def test_dataset_growing_while_read_is_bounded(env, figures):
    root, _, d = env
    grow = root / "growing.jsonl"
    shutil.copy(root / "data.jsonl", grow)
    line = (root / "data.jsonl").read_text().splitlines()[0] + "\n"
    stop = threading.Event()
    appended = [0]

    def writer():
        with open(grow, "a") as f:
            while not stop.is_set():
                f.write(line * 64)
                f.flush()
                appended[0] += len(line) * 64
                time.sleep(0.001)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        figures.did.append("a dataset appended to continuously (~MB/s) while CreateJob validates it and the job "
                           "reads it (an epoch, capped at 300 steps)")
        # The epoch's length is whatever had been appended when the job read the file: on a loaded
        # box that was thousands of steps (2431 reached in 60 s in one CI run, still running), so
        # max_steps caps the run; the read itself must still end.
        s = spec(root, "grow-out", steps=300, save_steps=100000, nvme=False, accum=1, data="growing.jsonl")
        s["training"]["num_train_epochs"] = 1
        outcome, msg, took, rss = attempt(d, s, bound=60)
    finally:
        stop.set()
        t.join(5)
    record(figures, "growing dataset", outcome, msg, took, rss)
    figures.lost.append(f"{appended[0] / 2**20:.1f} MiB appended during the case")
    assert outcome in ("refused", "failed", "succeeded"), figures.defect(
        f"a dataset growing while read: {outcome} after {took:.0f} s ({msg})")


# ---------------------------------------------------------------- exhaustion


def huge_shape_model(src: pathlib.Path, dst: pathlib.Path) -> None:
    shutil.copytree(src, dst)
    header = {"model.embed_tokens.weight": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 16]},
              "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    (dst / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)


def huge_header_model(src: pathlib.Path, dst: pathlib.Path) -> None:
    shutil.copytree(src, dst)
    (dst / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 50) + b"{" * 64)


TEMPLATES = {
    "template: range(10**9) loop": "{% for i in range(1000000000) %}x{% endfor %}",
    "template: nested loops": "{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}",
    "template: string doubling": "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}"
                                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "template: 'x' * 10**10": "{{ 'x' * 10000000000 }}",
    "template: recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "template: 99999999999999999999": "{{ 99999999999999999999 }}",
    "template: 1e999": "{{ 1e999 }}",
}


@pytest.mark.timeout(300)
def test_exhausting_inputs_are_refused_within_time_and_memory(env, figures):
    root, _, d = env
    cases = {}
    for name, text in TEMPLATES.items():
        p = root / f"t{len(cases)}.jinja"
        p.write_text(text)
        s = chat_spec(root, f"x{len(cases)}")
        s["dataset"]["template"] = str(p)
        cases[name] = s
    line = root / "hugeline.jsonl"
    with open(line, "w") as f:  # one 96 MiB record
        f.write('{"input_ids": [' + "1, " * (32 << 20) + '1], "labels": [1]}\n')
    cases["dataset: one 96 MiB line"] = spec(root, "x-line", steps=2, save_steps=100, nvme=False, data="hugeline.jsonl")
    huge_shape_model(root / "model", root / "model-hugeshape")
    cases["safetensors: shape [2^40, 2^40]"] = spec(root, "x-shape", steps=2, save_steps=100, nvme=False,
                                                   model="model-hugeshape")
    huge_header_model(root / "model", root / "model-hugeheader")
    cases["safetensors: header length 2^50"] = spec(root, "x-header", steps=2, save_steps=100, nvme=False,
                                                   model="model-hugeheader")
    figures.did.append(f"{len(cases)} exhausting inputs; bound {CASE_BOUND_S} s and +{RSS_BOUND_MIB} MiB daemon RSS "
                       f"each")
    bad = []
    for name, s in cases.items():
        outcome, msg, took, rss = attempt(d, s)
        record(figures, name, outcome, msg, took, rss)
        if outcome not in ("refused", "failed") or took > CASE_BOUND_S or rss > RSS_BOUND_MIB * 1024:
            bad.append(f"{name}: {outcome} in {took:.1f} s, RSS +{rss / 1024:.0f} MiB: {msg[:100]}")
        restart_if_dead(d)
    line.unlink()
    figures.lost.append(f"{len(bad)} of {len(cases)} not refused within bounds")
    assert not bad, figures.defect("unbounded input handling: " + " | ".join(bad))
