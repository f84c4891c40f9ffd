"""Corrupted checkpoint, store and SQLite files: each corruption is
detected with a clear error, never used silently.

* Checkpoint: one byte flipped in each kind of file a checkpoint holds (a model layer, an optimizer
  layer, offloadd_state.json, HF's trainer_state.json, the safetensors index); a job told to resume from it must fail naming
  the damage, not train on. (The fallback to an older intact checkpoint after a crash is
  tests/python/daemon/test_checkpoint_corruption.py.)
* Store: a job's per-job store directory is left by a daemon SIGKILL; bytes flipped in its data
  file and its MANIFEST must be reported by `offloadd-store --verify`; bytes flipped in the data
  file of a running job's store must fail the job or leave its weights bit-for-bit right.
* SQLite: jobs.db (WAL checkpointed, daemon stopped) with its header overwritten, a page of its
  b-tree flipped, or truncated: the daemon must refuse to start naming jobs.db, or start with every
  job intact; never serve damaged or missing records silently."""

from __future__ import annotations

import pathlib
import random
import shutil
import signal
import sqlite3
import subprocess
import time

import pytest

import offloadd
from faultlib import (SEED, S, Events, FaultDaemon, Hold, build_fault_shim, differing_bytes, load_weights, make_assets,
                      make_workspace, spec, state_name, wait_final)

STEPS, SAVE_STEPS = 12, 4
CLEAR = ("checksum", "crc", "corrupt", "mismatch", "invalid", "malformed", "parse")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("corrupt_assets"))


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> pathlib.Path:
    return build_fault_shim(tmp_path_factory.mktemp("corrupt_shim"))


def flip(path: pathlib.Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


@pytest.mark.timeout(240)
def test_corrupt_checkpoint_files_are_refused_on_resume(binary_dir, tmp_path, assets, figures):
    ws = make_workspace(tmp_path / "ws", assets)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws).start()
    rng = random.Random(f"{SEED}-checkpoint")
    try:
        with offloadd.Client(d.target, timeout=30) as c:
            done = c.submit(spec(ws, "src", steps=SAVE_STEPS + 1, save_steps=SAVE_STEPS), wait=True, timeout=120)
            assert done.state == S.JOB_STATE_SUCCEEDED, done.error
            good = ws / "src" / f"checkpoint-{SAVE_STEPS}"
            files = ["model-layer-00001.safetensors", "optimizer-layer-00002.safetensors", "offloadd_state.json",
                     "trainer_state.json", "model.safetensors.index.json"]
            figures.did.append(f"one byte flipped (seeded offset) in each of {files} of a committed checkpoint; a job "
                               f"resumes from each copy")
            silent = []
            for name in files:
                bad = ws / f"bad-{name.split('.')[0]}"
                shutil.copytree(good, bad)
                size = (bad / name).stat().st_size
                # Past the safetensors header for the tensor files (data bytes), anywhere for JSON.
                off = rng.randrange(size - 64, size) if name.endswith(".safetensors") else rng.randrange(size)
                flip(bad / name, off)
                t0 = time.monotonic()
                try:
                    r = c.submit(spec(ws, f"out-{bad.name}", steps=STEPS, save_steps=SAVE_STEPS,
                                      resume_from=str(bad)), wait=True, timeout=120)
                    state, msg, shown = r.state, r.error.message, state_name(r.state)
                except offloadd.InvalidArgument as e:  # refused at CreateJob: the checkpoint's state is read there
                    state, msg, shown = S.JOB_STATE_FAILED, str(e), "refused at CreateJob"
                took = time.monotonic() - t0
                clear = state == S.JOB_STATE_FAILED and name in msg or any(k in msg.lower() for k in CLEAR)
                figures.rows.append({"case": name, "offset": off, "state": shown, "s": round(took, 2),
                                     "error": msg[:200]})
                figures.happened.append(f"{name} @ {off}: {shown} in {took:.1f} s: {msg[:160]}")
                if state == S.JOB_STATE_SUCCEEDED:
                    # Only harmless if the file is not read on resume: the result must equal a
                    # resume from the intact checkpoint.
                    if not (ws / "out-good" / "model.safetensors").exists():
                        g = c.submit(spec(ws, "out-good", steps=STEPS, save_steps=SAVE_STEPS, resume_from=str(good)),
                                     wait=True, timeout=120)
                        assert g.state == S.JOB_STATE_SUCCEEDED, g.error
                    diff, _ = differing_bytes(load_weights(ws / f"out-{bad.name}" / "model.safetensors"),
                                              load_weights(ws / "out-good" / "model.safetensors"))
                    figures.happened.append(f"{name}: not read on resume (its crc32c in offloadd_state.json is not "
                                            f"checked); final weights differ from an intact resume in {diff} bytes")
                    if diff:
                        silent.append(f"{name} (byte {off}): used, {diff} weight bytes differ")
                elif not clear:
                    silent.append(f"{name} (byte {off}): {shown} {msg!r}")
            figures.lost.append(f"{len(silent)} of {len(files)} corrupt checkpoints used silently")
            assert not silent, figures.defect("corrupt checkpoint used or refused unclearly: " + "; ".join(silent))
    finally:
        d.stop()


@pytest.mark.timeout(240)
def test_corrupt_store_files_are_detected(binary_dir, tmp_path, assets, figures):
    ws = make_workspace(tmp_path / "ws", assets)
    store = binary_dir / "storage" / "offloadd-store"
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws)
    rng = random.Random(f"{SEED}-store")
    try:
        d.start()
        with offloadd.Client(d.target, timeout=30) as c:
            job = c.create_job(spec(ws, "out", steps=200, save_steps=100))
            ev = Events(c, job.id)
            assert ev.wait_for(lambda e: e.HasField("progress") and e.progress.step >= 3, 60), d.log()[-2000:]
            d.kill9()  # leaves nvme/<job id> behind, as a crash does
        jobdir = ws / "nvme" / job.id
        assert (jobdir / "data").exists(), sorted(p.name for p in (ws / "nvme").rglob("*"))
        ok = subprocess.run([str(store), f"--dir={jobdir}", "--verify"], capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        cases = []
        for what in ("data", "MANIFEST"):
            copy = ws / f"copy-{what}"
            shutil.copytree(jobdir, copy)
            (copy / "LOCK").unlink(missing_ok=True)
            raw = (copy / what).read_bytes()
            if what == "data":  # one byte in every 4 KiB block: every live extent is hit
                offs = [b + rng.randrange(4096) for b in range(0, len(raw) - 4096, 4096)]
            else:  # inside the first commit frame's payload: not a torn tail, which replay may drop
                first = raw.find(b"OFMR")
                assert first >= 0 and raw.find(b"OFMR", first + 4) > 0, "expected several MANIFEST frames"
                offs = [first + 12 + rng.randrange(8)]
            for off in offs:
                flip(copy / what, off)
            t0 = time.monotonic()
            r = subprocess.run([str(store), f"--dir={copy}", "--verify"], capture_output=True, text=True, timeout=60)
            out = (r.stdout + r.stderr).strip().splitlines()
            named = [ln for ln in out if any(k in ln.lower() for k in ("mismatch", "data_loss", "corrupt"))]
            cases.append((what, f"{len(offs)} byte(s) from {offs[0]}", r.returncode, (named or out or [""])[-1],
                          time.monotonic() - t0))
        figures.did.append("a store directory left by a daemon SIGKILL mid-job: one byte flipped in every 4 KiB block "
                           "of `data`, and one in the first commit frame of `MANIFEST` (seeded offsets), each checked by offloadd-store --verify")
        for what, off, rc, last, took in cases:
            figures.happened.append(f"{what} @ {off}: --verify exit {rc} in {took:.1f} s: {last[:160]}")
            figures.rows.append({"case": what, "offset": off, "rc": rc, "message": last[:200]})
        missed = [f"{w} @ {o}" for w, o, rc, _, _ in cases if rc == 0]
        figures.lost.append(f"{len(missed)} of {len(cases)} corruptions passed --verify")
        assert not missed, figures.defect(f"offloadd-store --verify passed a corrupted store: {missed}")
    finally:
        d.stop()


@pytest.mark.timeout(240)
def test_corrupt_store_data_under_a_running_job_is_never_used_silently(binary_dir, tmp_path, assets, shim, figures):
    ref_ws = make_workspace(tmp_path / "ref", assets)
    ws = make_workspace(tmp_path / "ws", assets)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ref_ws).start()
    try:
        with offloadd.Client(d.target, timeout=30) as c:
            ref = c.submit(spec(ref_ws, "out", steps=STEPS * 2, save_steps=SAVE_STEPS), wait=True, timeout=120)
            assert ref.state == S.JOB_STATE_SUCCEEDED, ref.error
    finally:
        d.stop()
    rng = random.Random(f"{SEED}-store-live")
    # The job stands still from the commit of checkpoint-SAVE_STEPS until the bytes are flipped:
    # it cannot end (and remove its store) or move on while they are.
    hold = Hold(ws / "hold", f"checkpoint-{SAVE_STEPS}", shim)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws, env=hold.env).start()
    try:
        with offloadd.Client(d.target, timeout=30) as c:
            job = c.create_job(spec(ws, "out", steps=STEPS * 2, save_steps=SAVE_STEPS))
            ev = Events(c, job.id)
            hold.wait(60, f":\n{d.log()[-2000:]}")
            data = ws / "nvme" / job.id / "data"
            size = data.stat().st_size
            offs = sorted(rng.randrange(0, size) for _ in range(64))
            for off in offs:
                flip(data, off)
            at = ev.last_step()
            hold.release()
            final = wait_final(c, job.id, 120)
        figures.did.append(f"64 bytes flipped (seeded offsets) in the data file of a running job's store at step {at}")
        figures.happened.append(f"job {state_name(final.state)} at step {final.progress.step}: "
                                f"{final.error.message[:200]}")
        if final.state == S.JOB_STATE_SUCCEEDED:
            diff, total = differing_bytes(load_weights(ws / "out" / "model.safetensors"),
                                          load_weights(ref_ws / "out" / "model.safetensors"))
            figures.lost.append(f"job succeeded; {diff} of {total} bytes of the final weights differ from a clean run "
                                f"(the flipped extents were rewritten before they were read)" if diff == 0 else
                                f"{diff} of {total} bytes of the final weights differ")
            assert diff == 0, figures.defect(f"corrupt store data used silently: the job succeeded with {diff} of "
                                             f"{total} weight bytes different from a clean run")
        else:
            msg = final.error.message.lower()
            figures.lost.append("the job failed; nothing corrupt was used")
            assert final.state == S.JOB_STATE_FAILED and any(k in msg for k in CLEAR), figures.defect(
                f"corrupt store data: job {state_name(final.state)} with an unclear error {final.error.message!r}")
    finally:
        hold.release()
        hold.close()
        d.stop()


def checkpoint_wal(db: pathlib.Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for ext in ("-wal", "-shm"):
        pathlib.Path(str(db) + ext).unlink(missing_ok=True)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("damage", ["header", "btree_page", "truncated"])
def test_corrupt_job_database_is_refused_or_intact(binary_dir, tmp_path, assets, figures, damage):
    ws = make_workspace(tmp_path / "ws", assets)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws).start()
    try:
        with offloadd.Client(d.target, timeout=30) as c:
            jobs = [c.submit(spec(ws, f"out{i}", steps=2, save_steps=100, nvme=False), wait=True, timeout=120)
                    for i in range(3)]
            before = {j.id: (j.state, j.progress.step, j.spec.output_dir) for j in jobs}
    finally:
        d.stop()
    db = ws / "state" / "jobs.db"
    checkpoint_wal(db)
    size = db.stat().st_size
    page = 4096
    with open(db, "r+b") as f:
        if damage == "header":
            f.write(b"\xff" * 100)
        elif damage == "btree_page":  # the last page: job records/events, not the schema
            f.seek(size - page)
            f.write(bytes(random.Random(f"{SEED}-db").randrange(256) for _ in range(page)))
        else:
            f.truncate(size // 2)
    figures.did.append(f"jobs.db ({size} bytes, 3 finished jobs, WAL checkpointed) with its {damage.replace('_', ' ')} "
                       f"damaged while the daemon was stopped; then the daemon started")
    try:
        t0 = time.monotonic()
        try:
            d.start(timeout=20)
            started = True
        except AssertionError:
            started = False
        took = time.monotonic() - t0
        log = d.log()
        if not started:
            named = "jobs.db" in log
            figures.happened.append(f"the daemon refused to start in {took:.1f} s: "
                                    + (log.strip().splitlines()[-1][:200] if log.strip() else "(no log)"))
            figures.lost.append("nothing used; the operator is told")
            assert named, figures.defect(f"the daemon refused a corrupt jobs.db without naming it:\n{log[-2000:]}")
            return
        with offloadd.Client(d.target, timeout=30) as c:
            after = {}
            for jid in before:
                try:
                    j = c.get_job(jid)
                    after[jid] = (j.state, j.progress.step, j.spec.output_dir)
                except offloadd.OffloaddError as e:
                    after[jid] = ("error", str(e)[:120])
            try:
                listed = sorted(j.id for j in c.list_jobs())
            except offloadd.OffloaddError as e:
                listed = [f"list_jobs error: {str(e)[:120]}"]
        damaged = [jid for jid in before if after[jid] != before[jid]]
        warned = any(k in log.lower() for k in ("corrupt", "malformed", "integrity", "jobs.db"))
        figures.happened.append(f"the daemon started ({took:.1f} s); {len(before) - len(damaged)} of {len(before)} jobs "
                                f"intact; list_jobs: {len(listed)} job(s); log names the damage: {warned}")
        figures.lost.append(f"{len(damaged)} job record(s) damaged or missing")
        assert not damaged or warned, figures.defect(
            f"a corrupt jobs.db ({damage}) was used silently: records changed or lost with no error or log line: "
            f"{ {k: after[k] for k in damaged} }")
        assert not damaged, figures.defect(f"corrupt jobs.db ({damage}): daemon started and serves damaged records "
                                           f"{ {k: after[k] for k in damaged} } (logged, but served)")
    finally:
        d.stop()
