"""Full disks and I/O errors under the three places the daemon writes:
the job's output directory (checkpoints, the exported model), the state directory (SQLite job
records) and the store's directory (NVMe tier optimizer states).

* ENOSPC: the directory is a small tmpfs (the suite runs as root, here and in CI; skipped with the
  reason where mount(2) is refused). Once the job has committed a checkpoint the tmpfs is filled
  to the last byte.
* EIO: an LD_PRELOAD shim (fault_shim.c, compiled here) fails every write and sync of a file under
  the directory once the job has committed a checkpoint; for the store it also refuses io_uring
  (seccomp), so the store's pread/pwrite engine runs and its writes reach the shim.

In both the job is held (faultlib.Hold, the shim again) from the commit of its first checkpoint
until the fault is in place, so that it cannot finish or pass the writes the fault is for while
the test sets it up on a loaded machine.

Each case then requires: the job fails with an error naming the failure (or carries on where
nothing needed the directory), never standing still for FAULT_BOUND_S while RUNNING; the daemon
stays up and serving; the newest committed checkpoint is intact and loadable: with the fault
cleared, a job resumed from it completes with weights bit-for-bit equal to an uninterrupted run's.
The state-directory cases also check that jobs.db passes SQLite's integrity_check and that the
job's recorded state matches what it left on disk after a restart."""

from __future__ import annotations

import errno
import os
import pathlib
import re
import sqlite3
import subprocess
import time

import pytest

import offloadd
from faultlib import (S, Events, FaultDaemon, Hold, build_fault_shim, differing_bytes, load_weights, make_assets,
                      make_workspace, spec, state_name, wait_final)

STEPS, SAVE_STEPS = 24, 4
# A hang's bound, not a speed's: how long a RUNNING job may show no new step. A full disk fails a
# job only at the first write that needs a block the disk no longer has, which can be steps after
# the fill: the NVMe store reserves its data blocks up front (fallocate) and reuses the extents a
# commit frees, so once its data file has reached its steady size only the manifest asks for
# space, one 4 KiB page per ~1 KiB of commit records a step appends. On a loaded machine those
# steps took longer than 30 s (ENOSPC-store: RUNNING at step 8 30 s after the fill, at step 9 when
# stopped, never failed by then).
FAULT_BOUND_S = 30
SETTLE_S = 5
CLEARED_BOUND_S = 90  # a hang's bound, not a speed's: the job's remaining steps on a loaded box
TMPFS_SIZE = "64m"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("disk_assets"))


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> pathlib.Path:
    return build_fault_shim(tmp_path_factory.mktemp("shim"))


workspace = make_workspace


@pytest.fixture(scope="module")
def reference(binary_dir, tmp_path_factory, assets):
    ws = workspace(tmp_path_factory.mktemp("disk_reference"), assets)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws).start()
    try:
        with offloadd.Client(d.target, timeout=30) as c:
            done = c.submit(spec(ws, "out", steps=STEPS, save_steps=SAVE_STEPS), wait=True, timeout=300)
        assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, d.log()[-3000:])
        return load_weights(ws / "out" / "model.safetensors")
    finally:
        d.stop()


class Tmpfs:
    def __init__(self, path: pathlib.Path):
        self.path = path
        self.mounted = False

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(self.path)],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs for the ENOSPC cases: {r.stderr.strip()}")
        self.mounted = True

    def fill(self) -> int:
        """Writes zeros until ENOSPC; returns the bytes written."""
        written = 0
        chunk = b"\0" * (1 << 20)
        with open(self.path / ".filler", "wb", buffering=0) as f:
            try:
                while True:
                    written += f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
            try:
                while True:  # the last partial megabyte
                    written += f.write(b"\0" * 4096)
            except OSError:
                pass
        return written

    def free(self) -> None:
        (self.path / ".filler").unlink(missing_ok=True)

    def umount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30)
            self.mounted = False


def wait_ended(c: offloadd.Client, d: FaultDaemon, job_id: str, t_fault: float, out: pathlib.Path,
               bound: float = FAULT_BOUND_S) -> S.Job:
    """The job once it ends; or the job as it stands once it has shown no new step for `bound` s
    since the fault (or its last step), or SETTLE_S after the daemon's log says the job ended or its
    model is exported (a job that stands still, or that the daemon finished but still shows
    RUNNING, is a defect). A job still making steps is waited for: how many steps it takes before
    a write needs the disk is the product's (see FAULT_BOUND_S), how long they take the machine's."""
    ended_at = None
    last_step, last_progress = None, t_fault
    while True:
        job = wait_final(c, job_id, 1)
        if job.state in (S.JOB_STATE_SUCCEEDED, S.JOB_STATE_FAILED, S.JOB_STATE_CANCELLED):
            return job
        now = time.monotonic()
        if job.progress.step != last_step:
            if last_step is not None:
                last_progress = now
            last_step = job.progress.step
        if ended_at is None and (re.search(rf"job {job_id} (SUCCEEDED|FAILED|CANCELLED)", d.log())
                                 or (out / "model.safetensors").exists()):
            ended_at = now
        if now - last_progress > bound or (ended_at is not None and now - ended_at > SETTLE_S):
            return job


def store_file_sizes(store: pathlib.Path) -> dict[str, int]:
    """The store's files (job-*/MANIFEST, job-*/data) and their sizes in bytes."""
    return {p.name: p.stat().st_size for p in sorted(store.glob("job-*/*"))
            if p.name in ("MANIFEST", "data")}


def committed_checkpoints(out: pathlib.Path) -> list[pathlib.Path]:
    return sorted((p for p in out.glob("checkpoint-*") if p.name.split("-", 1)[1].isdigit()),
                  key=lambda p: int(p.name.split("-", 1)[1]))


CLEAR_ERRORS = {"ENOSPC": ("No space left", "ENOSPC", "full"), "EIO": ("Input/output error", "EIO", "I/O error")}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["output", "state", "store"])
@pytest.mark.parametrize("fault", ["ENOSPC", "EIO"])
def test_disk_fault_fails_cleanly_and_keeps_the_last_checkpoint(binary_dir, tmp_path, assets, reference, shim,
                                                                 figures, fault, where):
    ws = workspace(tmp_path / "ws", assets)
    target = {"output": ws / "out", "state": ws / "state", "store": ws / "nvme"}[where]
    env = {}
    fs = Tmpfs(target)
    arm = ws / "ARM"
    if fault == "ENOSPC":
        fs.mount()
    else:
        target.mkdir(parents=True, exist_ok=True)
        env = {"LD_PRELOAD": str(shim), "OFFLOADD_FAULT_PREFIX": str(target) + "/", "OFFLOADD_FAULT_ARM": str(arm),
               "OFFLOADD_FAULT_ERRNO": str(errno.EIO)}
        if where == "store":
            env["OFFLOADD_FAULT_NO_URING"] = "1"
    # The job stands still once checkpoint-SAVE_STEPS is committed until the fault is in place: it
    # cannot finish, or pass the writes the fault is for, while the test sets it up.
    hold = Hold(ws / "hold", f"checkpoint-{SAVE_STEPS}", shim)
    env = {**env, **hold.env}
    figures.did.append(f"{fault} under the {where} directory ({'a ' + TMPFS_SIZE + ' tmpfs filled to the last byte' if fault == 'ENOSPC' else 'LD_PRELOAD shim failing every write and sync'}) "
                       f"once a {STEPS}-step NVMe-tier job had committed its first checkpoint")
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws, env=env)
    try:
        d.start()
        with offloadd.Client(d.target, timeout=30) as c:
            job = c.create_job(spec(ws, "out", steps=STEPS, save_steps=SAVE_STEPS))
            ev = Events(c, job.id)
            hold.wait(FAULT_BOUND_S, f" (no checkpoint before the fault):\n{d.log()[-3000:]}")
            t_fault = time.monotonic()
            if fault == "ENOSPC":
                filled = fs.fill()
                figures.numbers["filler_bytes"] = filled
                if where == "store":  # what asks the full disk for space next (see FAULT_BOUND_S)
                    figures.numbers.update(store_files_at_fill=store_file_sizes(target))
            else:
                arm.touch()
            at_step = ev.last_step()
            hold.release()
            final = wait_ended(c, d, job.id, t_fault, ws / "out")
            took = time.monotonic() - t_fault
            figures.numbers.update(fault_at_step=at_step, end_state=state_name(final.state),
                                   end_step=final.progress.step, seconds_to_end=round(took, 2))
            alive = d.alive()
            health = c.health() if alive else "DEAD"
            figures.happened.append(f"fault armed at step {at_step}; job {state_name(final.state)} at step "
                                    f"{final.progress.step} after {took:.1f} s"
                                    + (f": {final.error.message[:300]}" if final.error.message else "")
                                    + f"; daemon {'up, ' + health if alive else 'DIED'}")
            assert alive, figures.defect(f"the daemon did not survive {fault} under {where}:\n{d.log()[-3000:]}")
            # A failing state directory makes jobs not durable: health says so, with the reason.
            # A full one may still take writes into space SQLite holds.
            problem = c.node_info().serving_problem
            if where == "state" and fault == "EIO":
                assert health == "NOT_SERVING" and "jobs.db" in problem, figures.defect(
                    f"health {health} while every write to the state directory fails ({problem!r})")
            elif where != "state":
                assert health == "SERVING", figures.defect(f"health {health} with {fault} under {where}: {problem!r}")
            assert (health == "NOT_SERVING") == bool(problem), (health, problem)
            hung = final.state in (S.JOB_STATE_RUNNING, S.JOB_STATE_QUEUED, S.JOB_STATE_PAUSING,
                                   S.JOB_STATE_CANCELLING)
            if hung and where == "state":
                # Nothing can be recorded while the state directory is full or failing; the job's
                # end must be recorded once it is writable again, without a restart.
                on_disk = (ws / "out" / "model.safetensors").exists()
                figures.happened.append(f"while the state dir failed: {state_name(final.state)} at step "
                                        f"{final.progress.step} (exported model on disk: {on_disk})")
                fs.free() if fault == "ENOSPC" else arm.unlink()
                t_clear = time.monotonic()
                # The job has the rest of its steps to run (all but SAVE_STEPS of them, the fault
                # being in place from checkpoint-SAVE_STEPS on): its record must be final SETTLE_S
                # after it ended, not after a guess at how long the steps take on a loaded machine.
                final = wait_ended(c, d, job.id, t_clear, ws / "out", bound=CLEARED_BOUND_S)
                hung = final.state not in (S.JOB_STATE_SUCCEEDED, S.JOB_STATE_FAILED, S.JOB_STATE_CANCELLED)
                figures.happened.append(f"fault cleared: {state_name(final.state)} at step {final.progress.step} "
                                        f"{time.monotonic() - t_clear:.1f} s later")
                if not hung and final.progress.step != STEPS and final.state == S.JOB_STATE_SUCCEEDED:
                    figures.lost.append(f"progress recorded only to step {final.progress.step} of {STEPS} (events "
                                        f"appended while the state dir failed are gone)")
            if hung:  # recorded; the restart below shows whether the state comes right
                on_disk = (ws / "out" / "model.safetensors").exists()
                figures.defect(f"{fault} under {where}: the job still shows {state_name(final.state)} at step "
                               f"{final.progress.step}, no new step for {FAULT_BOUND_S} s, {took:.0f} s after the fault "
                               "(and after it was cleared)"
                               + (" although it ended and its exported model is on disk"
                                  if on_disk else ""))
            # Every step commits about 1 KiB of records to the store's manifest (every write fails
            # under EIO): the job's remaining steps cannot all fit in the page the full disk left it.
            assert where != "store" or hung or final.state == S.JOB_STATE_FAILED, figures.defect(
                f"{fault} under the store: the job {state_name(final.state)} at step {final.progress.step}")
            if final.state == S.JOB_STATE_FAILED:
                msg = final.error.message
                assert any(k in msg for k in CLEAR_ERRORS[fault]), figures.defect(
                    f"{fault} under {where} failed the job with an unclear error: {msg!r}")
        # Clear the fault: the newest committed checkpoint must be intact and loadable.
        if fault == "ENOSPC":
            fs.free()
        else:
            arm.unlink(missing_ok=True)
        d.stop()
        d.start()
        with offloadd.Client(d.target, timeout=30) as c:
            after = c.get_job(job.id)
            on_disk = (ws / "out" / "model.safetensors").exists()
            if hung:
                figures.happened.append(f"after clearing the fault and a restart the job shows {state_name(after.state)}"
                                        f" at step {after.progress.step}")
                if after.state in (S.JOB_STATE_QUEUED, S.JOB_STATE_RUNNING):
                    final = wait_final(c, job.id, 120)
                    figures.happened.append(f"then {state_name(final.state)} at step {final.progress.step}")
            if where == "state":
                with sqlite3.connect(f"file:{ws / 'state' / 'jobs.db'}?mode=ro", uri=True) as db:
                    check = db.execute("PRAGMA integrity_check").fetchone()[0]
                figures.happened.append(f"jobs.db integrity_check: {check}; after a restart the job is "
                                        f"{state_name(after.state)}")
                assert check == "ok", figures.defect(f"jobs.db corrupt after {fault}: {check}")
            if final.state == S.JOB_STATE_SUCCEEDED:
                if not hung:
                    figures.happened.append("the job did not need the directory after the fault: it succeeded")
                resumed_from = "- (the job itself completed)"
            else:
                cps = committed_checkpoints(ws / "out")
                assert cps, f"no committed checkpoint left in {ws / 'out'}: {sorted(os.listdir(ws / 'out'))}"
                incomplete = [p.name for p in cps if not (p / "offloadd_state.json").exists()]
                assert not incomplete, figures.defect(f"checkpoints without offloadd_state.json visible: {incomplete}")
                newest = cps[-1]
                done = c.submit(spec(ws, "out", steps=STEPS, save_steps=SAVE_STEPS, resume_from=str(newest)),
                                wait=True, timeout=120)
                assert done.state == S.JOB_STATE_SUCCEEDED, figures.defect(
                    f"the job resumed from {newest.name} after {fault} under {where} did not complete: "
                    f"{state_name(done.state)} {done.error.message}") + "\n" + d.log()[-3000:]
                resumed_from = newest.name
            weights = load_weights(ws / "out" / "model.safetensors")
            diff, total = differing_bytes(weights, reference)
            figures.numbers.update(resumed_from=resumed_from, differing_bytes=diff)
            figures.lost.append(f"resumed from {resumed_from}; {diff} of {total} bytes of the final weights differ "
                                f"from an uninterrupted run")
            assert diff == 0, f"final weights differ in {diff} of {total} bytes"
        assert not figures.defects, "\n".join(figures.defects) + "\n" + d.all_logs()[-3000:]
    finally:
        hold.release()
        hold.close()
        d.stop()
        fs.umount()
