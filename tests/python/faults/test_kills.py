"""SIGKILL campaigns: the daemon, an optimizer worker (offloadd-worker)
and the NVMe tensor store (offloadd-store) are killed at seeded random points of one CPU fp32 job
whose optimizer states live on the NVMe tier (storage directory: a tmp dir).

A kill point is a step the job must reach (sampled without replacement from the job's steps) plus
a random delay of up to one step of the uninterrupted run (its median step time), so kills land mid-step, during checkpoint writes and renames,
during store writes, and between steps. After each kill the job must recover:
* daemon: the restarted daemon finds the job RUNNING, queues it again, and it resumes from its
  newest intact checkpoint;
* worker: the pool restarts the worker and replays its commands (no resume); only a crash loop
  (more than the pool's max_restarts crashes in a row with no completed command between) would fail
  the job, which is then resubmitted as a store-killed one is;
* store: the job restarts from its newest checkpoint by itself, as after an executor's death,
  within jobs.max_executor_restarts; past them it ends with an error naming the dead
  store and is resubmitted with resume_from_checkpoint = its newest checkpoint, into the same
  output_dir.
Every wait is bounded: a job that neither progresses nor ends within RECOVERY_BOUND_S after a kill
is a hang, named as such.

At the end the job succeeds and its exported weights equal an uninterrupted run's bit for bit;
the figures (per kill point: step reached, last event before the kill, checkpoint resumed from,
steps redone, recovery path and time; bytes of the final weights that differ; per-job store
directories left behind) go to the suite's summary."""

from __future__ import annotations

import os
import pathlib
import random
import signal
import time

import pytest

import offloadd
from faultlib import (FULL, SEED, S, Events, FaultDaemon, differing_bytes, load_weights, logs, make_assets,
                      make_workspace, spec, state_name, wait_final)

STEPS = 48 if FULL else 20
# A worker's death does not stop the job (the pool restarts it and replays), nor does
# the store's (the job restarts by itself), so the job runs on while the test handles each kill: their
# jobs are longer, or the last kill points would find them finished (6 of 8 landed in a CI run on a
# loaded box).
STEPS_BY_KIND = {"daemon": STEPS, "worker": 3 * STEPS, "store": 3 * STEPS}
SAVE_STEPS = 4
KILLS = {"daemon": 30, "worker": 30, "store": 30} if FULL else {"daemon": 8, "worker": 8, "store": 6}
RECOVERY_BOUND_S = 60
STEP_BOUND_S = 60  # a healthy step of this model takes well under a second, even on a busy CI box


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("kill_assets"))


@pytest.fixture(scope="module")
def references(binary_dir, tmp_path_factory, assets):
    """steps -> the uninterrupted run's final weights, its wall time and its median step time."""
    cache = {}

    def get(steps: int):
        if steps not in cache:
            cache[steps] = uninterrupted_run(binary_dir, tmp_path_factory, assets, steps)
        return cache[steps]
    return get


def uninterrupted_run(binary_dir, tmp_path_factory, assets, steps: int):
    ws = make_workspace(tmp_path_factory.mktemp("kill_reference"), assets)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws).start()
    try:
        t0 = time.monotonic()
        stamps = []
        with offloadd.Client(d.target, timeout=30) as c:
            done = c.submit(spec(ws, "out", steps=steps, save_steps=SAVE_STEPS), wait=True, timeout=300,
                            on_event=lambda e: e.HasField("progress") and stamps.append(time.monotonic()))
        assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, d.log()[-3000:])
        gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
        return load_weights(ws / "out" / "model.safetensors"), time.monotonic() - t0, gaps[len(gaps) // 2]
    finally:
        d.stop()


def newest_checkpoint(out: pathlib.Path) -> str:
    """The newest checkpoint directory the job left (the daemon itself skips a corrupt one; a
    resubmit names the newest and trusts the trainer's crc32c check)."""
    steps = sorted(int(p.name.split("-", 1)[1]) for p in out.glob("checkpoint-*") if p.name.split("-", 1)[1].isdigit())
    return str(out / f"checkpoint-{steps[-1]}") if steps else ""


class Campaign:
    """One job driven through `kills` SIGKILLs of `kind`, resubmitted when a kill ends it."""

    def __init__(self, kind: str, binary_dir: pathlib.Path, ws: pathlib.Path, figures, step_s: float):
        self.kind = kind
        self.steps = STEPS_BY_KIND[kind]
        self.step_s = step_s
        self.ws = ws
        self.figures = figures
        self.rng = random.Random(f"{SEED}-{kind}")
        self.d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws)
        self.client: offloadd.Client | None = None
        self.jobs: list[str] = []
        self.resubmits = 0
        self.daemon_restarts = 0

    def connect(self) -> None:
        if self.client:
            self.client.close()
        self.client = offloadd.Client(self.d.target, timeout=30)

    def submit(self, resume_from: str = "") -> Events:
        job = self.client.create_job(spec(self.ws, "out", steps=self.steps, save_steps=SAVE_STEPS,
                                          resume_from=resume_from))
        self.jobs.append(job.id)
        return Events(self.client, job.id)

    def resubmit_after_failure(self, failed: S.Job) -> tuple[Events, str]:
        resume = newest_checkpoint(self.ws / "out")
        self.resubmits += 1
        return self.submit(resume), resume

    def run(self, n_kills: int) -> None:
        targets = sorted(self.rng.sample(range(1, self.steps - 2), n_kills))
        self.d.start()
        self.connect()
        ev = self.submit()
        for i, target in enumerate(targets, 1):
            # Or the job ended: a resumed run does not report again the steps reported before the
            # kill, so a late kill point may see the job succeed with no progress event past it
            # (full campaign, daemon kill point 30); the SUCCEEDED case below then ends the campaign.
            hit = ev.wait_for(lambda e: (e.HasField("progress") and e.progress.step >= target) or (
                e.HasField("state_change") and e.state_change.state in (S.JOB_STATE_FAILED, S.JOB_STATE_SUCCEEDED)),
                STEP_BOUND_S)
            if hit is not None and not hit.HasField("state_change") and self.kind == "store" and \
                    not self.d.children("offloadd-store"):
                # The store killed last time is gone and the job has not noticed yet: a dead store is
                # seen at the next I/O, which must fail the job naming it, within the recovery bound.
                hit = ev.wait_for(lambda e: e.HasField("state_change") and e.state_change.state in (
                    S.JOB_STATE_FAILED, S.JOB_STATE_SUCCEEDED), RECOVERY_BOUND_S)
                assert hit is not None, self.figures.defect(
                    f"kill point {i}: the store killed at point {i - 1} is gone, and job {self.jobs[-1]} neither "
                    f"failed nor ended within {RECOVERY_BOUND_S} s\n{self.d.log()[-3000:]}")
            if hit is not None and hit.HasField("state_change") and hit.state_change.state == S.JOB_STATE_FAILED:
                # A kill's failure surfaced after the progress event its recovery waited for.
                failed = self.client.get_job(self.jobs[-1])
                assert i > 1, f"the job failed before the first kill: {failed.error.message}\n{self.d.log()[-3000:]}"
                if self.kind == "store":
                    assert "offloadd-store" in failed.error.message, (
                        f"a killed store failed the job without naming the store: {failed.error.message!r}")
                self.figures.rows[-1]["error"] = failed.error.message[:200]
                self.figures.rows[-1]["recovery"] += f" + late job error ({failed.error.message[:60]}...) + resubmit"
                ev, _ = self.resubmit_after_failure(failed)
                hit = ev.wait_for(lambda e: e.HasField("progress") and e.progress.step >= target, STEP_BOUND_S)
            job = self.client.get_job(self.jobs[-1])
            assert hit is not None, (f"kill point {i}: step {target} not reached in {STEP_BOUND_S} s; job "
                                     f"{state_name(job.state)} {job.error.message}\n{self.d.log()[-3000:]}")
            delay = self.rng.uniform(0, self.step_s)
            time.sleep(delay)
            row = {"kill": self.kind, "n": i, "target": target, "delay_ms": round(delay * 1000),
                   "step_at_kill": ev.last_step(), "last_event": ev.last_kind()}
            if self.client.get_job(self.jobs[-1]).state == S.JOB_STATE_SUCCEEDED:
                row.update(resumed_from="-", steps_redone=0, recovery="job had finished", recovery_s=0)
                self.figures.rows.append(row)
                break
            ev = self.kill_and_recover(ev, row)
            self.figures.rows.append(row)
        final = wait_final(self.client, self.jobs[-1], timeout=300)
        if final.state == S.JOB_STATE_FAILED:  # a kill's failure surfaced only after the last point
            ev, _ = self.resubmit_after_failure(final)
            final = wait_final(self.client, self.jobs[-1], timeout=300)
        assert final.state == S.JOB_STATE_SUCCEEDED, (
            f"the job did not complete after the kills: {state_name(final.state)} {final.error.message}\n"
            f"{self.d.log()[-3000:]}")

    def kill_and_recover(self, ev: Events, row: dict) -> Events:
        job_id = self.jobs[-1]
        t_kill = time.monotonic()
        after_cursor = ev.last_cursor()
        if self.kind == "daemon":
            self.d.kill9()
            ev.join()
            after_cursor = ev.last_cursor()
            self.d.start()
            self.daemon_restarts += 1
            self.connect()
            ev = Events(self.client, job_id, after_cursor=after_cursor)
            row["recovery"] = "daemon restart"
        else:
            name = "offloadd-worker" if self.kind == "worker" else "offloadd-store"
            # A worker killed at the last point is respawned by its pool within tens of ms, but the
            # job may report its next step first (nothing was queued for the worker): wait for the
            # new process rather than find none in that window (full campaign, kill point 13).
            deadline = time.monotonic() + 10
            while not (pids := self.d.children(name)) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert pids, f"no {name} child of the daemon within 10 s at kill point {row['n']} (step {row['step_at_kill']})"
            os.kill(self.rng.choice(pids), signal.SIGKILL)
            row["recovery"] = "worker restart + replay" if self.kind == "worker" else "job restart"
        if self.kind == "store":
            # The store's death restarts the job from its checkpoint: its recovery is
            # the progress after that restart, not a step the dying run still reported.
            restarted = ev.wait_for(lambda e: e.cursor > after_cursor and (
                (e.HasField("log") and "restarting the job from its last checkpoint" in e.log.message) or (
                    e.HasField("state_change") and e.state_change.state in (
                        S.JOB_STATE_FAILED, S.JOB_STATE_SUCCEEDED, S.JOB_STATE_CANCELLED))), RECOVERY_BOUND_S)
            if restarted is not None and restarted.HasField("log"):
                after_cursor = restarted.cursor
        # Recovered: a progress event past the kill. Or the job ended: it is resubmitted.
        got = ev.wait_for(lambda e: e.cursor > after_cursor and (
            e.HasField("progress") or (e.HasField("state_change") and e.state_change.state in (
                S.JOB_STATE_FAILED, S.JOB_STATE_SUCCEEDED, S.JOB_STATE_CANCELLED))), RECOVERY_BOUND_S)
        job = self.client.get_job(job_id)
        if got is None:
            pytest.fail(self.figures.defect(
                f"{self.kind} SIGKILL at step {row['step_at_kill']} (kill point {row['n']}): job {job_id} neither "
                f"progressed nor ended within {RECOVERY_BOUND_S} s (state {state_name(job.state)}, step "
                f"{job.progress.step}): a silent hang\n{self.d.log()[-3000:]}"))
        resumed = [m for m in logs(e for e in ev.events if e.cursor > after_cursor) if m.startswith("resuming from ")]
        if got.HasField("state_change") and got.state_change.state == S.JOB_STATE_FAILED:
            job = self.client.get_job(job_id)
            row["error"] = job.error.message[:200]
            if self.kind == "store":
                assert "offloadd-store" in job.error.message, (
                    f"a killed store failed the job without naming the store: {job.error.message!r}")
            ev, resume = self.resubmit_after_failure(job)
            row["recovery"] = f"job error ({job.error.message[:60]}...) + resubmit"
            first = ev.wait_for(lambda e: e.HasField("progress"), RECOVERY_BOUND_S)
            assert first is not None, f"the resubmitted job made no progress:\n{self.d.log()[-3000:]}"
            row["resumed_from"] = pathlib.Path(resume).name if resume else "scratch"
            resumed_step = int(resume.rsplit("-", 1)[1]) if resume else 0
        elif resumed:
            row["resumed_from"] = pathlib.Path(resumed[0].split(" ", 2)[2]).name
            resumed_step = int(resumed[0].rsplit("-", 1)[1])
        elif self.kind == "daemon":
            row["resumed_from"] = "scratch"
            resumed_step = 0
        else:
            row["resumed_from"] = "-"
            resumed_step = row["step_at_kill"]
        row["steps_redone"] = max(0, row["step_at_kill"] - resumed_step)
        row["recovery_s"] = round(time.monotonic() - t_kill, 2)
        return ev

    def close(self) -> None:
        if self.client:
            self.client.close()
        self.d.stop()


@pytest.mark.timeout(900 if FULL else 240)
@pytest.mark.parametrize("kind", ["daemon", "worker", "store"])
def test_sigkill_campaign_ends_with_bitwise_equal_weights(binary_dir, tmp_path, assets, references, figures, kind):
    ref_weights, ref_s, step_s = references(STEPS_BY_KIND[kind])
    ws = make_workspace(tmp_path / "ws", assets)
    n = KILLS[kind]
    figures.did.append(f"SIGKILL of {'the daemon' if kind == 'daemon' else 'offloadd-' + kind} at {n} seeded random "
                       f"points (seed {SEED}) of a {STEPS_BY_KIND[kind]}-step CPU fp32 job, optimizer states on the NVMe tier, "
                       f"checkpoint every {SAVE_STEPS} steps")
    c = Campaign(kind, binary_dir, ws, figures, step_s)
    try:
        c.run(n)
        log = c.d.all_logs()
    finally:
        c.close()
    rows = [r for r in figures.rows if r.get("kill") == kind]
    killed = [r for r in rows if r["recovery"] != "job had finished"]
    weights = load_weights(ws / "out" / "model.safetensors")
    diff, total = differing_bytes(weights, ref_weights)
    leftover = sorted(p.name for p in (ws / "nvme").iterdir() if p.is_dir())
    replays = log.count("; replaying ")
    figures.numbers.update(kill_points=len(killed), steps_redone=sum(r["steps_redone"] for r in killed),
                           differing_bytes=diff, weight_bytes=total, resubmits=c.resubmits,
                           daemon_restarts=c.daemon_restarts, worker_replays_logged=replays,
                           store_dirs_left=len(leftover), reference_s=round(ref_s, 1),
                           step_ms=round(step_s * 1000, 1))
    figures.happened.append(
        f"{len(killed)} kills; recoveries: " + ", ".join(
            f"{k} x{sum(1 for r in killed if r['recovery'].split(' (')[0] == k)}"
            for k in sorted({r['recovery'].split(' (')[0] for r in killed}))
        + f"; {c.resubmits} resubmit(s); job SUCCEEDED")
    figures.lost.append(f"{figures.numbers['steps_redone']} steps redone; {diff} of {total} bytes of the final "
                        f"weights differ from the uninterrupted run")
    if leftover:
        figures.lost.append(f"{len(leftover)} per-job store directories left in the storage directory: {leftover}")
    assert len(killed) >= min(n, 1) and len(killed) >= n - 1, f"only {len(killed)} of {n} kill points landed: {rows}"
    assert diff == 0, f"final weights differ from the uninterrupted run in {diff} of {total} bytes"
    assert not leftover, figures.defect(
        f"per-job NVMe state directories left behind after the job ended ({leftover}); the runner documents that "
        f"they are removed when the job stops running")
