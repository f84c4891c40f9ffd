"""Hung children: a job's process that stops answering is killed and
recovered as after its crash, a cancel that the job's processes do not obey escalates to SIGKILL,
and the death of the job's NVMe store restarts the job as an executor's does.

SIGSTOP stands in for a process wedged in D-state I/O or a deadlock: nothing ends, no pidfd
fires. The daemon runs with small liveness deadlines (jobs.liveness: a 3 s floor, 0.5 s
heartbeats) so that each case takes seconds:

* a stopped optimizer worker: its pool kills it once its oldest command is past the deadline,
  restarts it and replays its commands; the job goes on and its final weights equal an
  uninterrupted run's bit for bit;
* a stopped executor: the daemon hears no heartbeat, kills it, and the job restarts from its last
  checkpoint (final weights bitwise equal); with no restarts left the job fails, naming the
  executor and what it was doing;
* a stopped or killed offloadd-store: the job restarts from its last checkpoint (no resubmit) and
  succeeds with bitwise equal weights;
* cancel of a stopped executor: CANCELLED within jobs.cancel_grace_seconds plus a margin;
  `offloadctl cancel --force`: CANCELLED at once, whatever the grace period."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

import offloadd
from faultlib import (S, Events, FaultDaemon, Hold, build_fault_shim, differing_bytes, load_weights, logs, make_assets,
                      make_workspace, spec, state_name, wait_final)

STEPS = 24
SAVE_STEPS = 4
FLOOR_S = 3
HEARTBEAT_S = 0.5
# A stopped process is killed within the floor (worker, store) or 6 heartbeats (executor); the
# rest is the job's restart on a busy 2-core CI box.
RECOVERY_BOUND_S = 60
STARTED = re.compile(r"executor started: pid (\d+) rank (\d+)")


def liveness_yaml(*, restarts: int = 2, cancel_grace: float = 30, heartbeat: float = HEARTBEAT_S,
                  floor: float = FLOOR_S) -> str:
    return (f"jobs:\n  max_executor_restarts: {restarts}\n  cancel_grace_seconds: {cancel_grace}\n"
            f"  liveness: {{floor_seconds: {floor}, factor: 10, heartbeat_seconds: {heartbeat}}}\n")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("liveness_assets"))


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> pathlib.Path:
    return build_fault_shim(tmp_path_factory.mktemp("liveness_shim"))


workspace = make_workspace


@pytest.fixture(scope="module")
def reference(binary_dir, tmp_path_factory, assets):
    """The final weights of the uninterrupted STEPS-step job."""
    ws = workspace(tmp_path_factory.mktemp("liveness_reference"), assets)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws).start()
    try:
        with offloadd.Client(d.target, timeout=30) as c:
            done = c.submit(spec(ws, "out", steps=STEPS, save_steps=SAVE_STEPS), wait=True, timeout=300)
        assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, d.log()[-3000:])
        return load_weights(ws / "out" / "model.safetensors")
    finally:
        d.stop()


def executor_pid(ev: Events) -> int:
    started = ev.wait_for(lambda e: e.HasField("log") and STARTED.search(e.log.message), 60)
    assert started is not None, "no 'executor started' event"
    return int(STARTED.search(started.log.message).group(1))


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def unstop(pid: int) -> None:
    """Lets a test's stopped process go (it is normally killed by then)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def child_of(d: FaultDaemon, name: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while not (pids := d.children(name)):
        assert time.monotonic() < deadline, f"no {name} below the daemon within {timeout} s"
        time.sleep(0.01)
    return pids[0]


def held_at_first_checkpoint(binary_dir, ws: pathlib.Path, shim: pathlib.Path, yaml: str, *,
                             nvme: bool = True, ranks: int = 1):
    """A STEPS-step job held (Hold) once it has committed checkpoint-SAVE_STEPS, so that what the
    test does next happens before step SAVE_STEPS + 1 whatever the machine's load: (daemon,
    client, job, events, hold). Release the hold once done."""
    hold = Hold(ws / "hold", f"checkpoint-{SAVE_STEPS}", shim)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws, env=hold.env, extra_yaml=yaml).start()
    c = offloadd.Client(d.target, timeout=30)
    s = spec(ws, "out", steps=STEPS, save_steps=SAVE_STEPS, nvme=nvme)
    if ranks > 1:
        s["training"]["per_device_train_batch_size"] = 4 // ranks
        s["resources"] = {"gpus": ranks}
    try:
        job = c.create_job(s)
        ev = Events(c, job.id)
        hold.wait(120, f":\n{d.log()[-3000:]}")
    except BaseException:
        c.close()
        d.stop()
        hold.close()
        raise
    return d, c, job, ev, hold


def run_stopped(binary_dir, tmp_path, assets, shim, figures, name: str) -> tuple[S.Job, list[str], FaultDaemon, int]:
    """A STEPS-step NVMe-tier job whose process `name` is SIGSTOPped once the job has committed
    its first checkpoint (the job held there until then); returns the job once it ended, its log
    events, the daemon and the pid."""
    ws = workspace(tmp_path / "ws", assets)
    d, c, job, ev, hold = held_at_first_checkpoint(binary_dir, ws, shim, liveness_yaml())
    try:
        first_executor = executor_pid(ev)
        pid = first_executor if name == "offloadd-executor" else child_of(d, name)
        t0 = time.monotonic()
        stop(pid)
        hold.release()  # a stopped executor stays held: the watchdog kills it
        try:
            final = wait_final(c, job.id, timeout=RECOVERY_BOUND_S + 120)
        finally:
            unstop(pid)
        ev.join()
        figures.did.append(f"SIGSTOP of {name} (pid {pid}) after the first checkpoint of a {STEPS}-step job; "
                           f"jobs.liveness floor {FLOOR_S} s, heartbeat {HEARTBEAT_S} s")
        figures.happened.append(f"{name}: job {state_name(final.state)} {time.monotonic() - t0:.1f} s after the stop")
        return final, logs(ev.events), d, pid
    finally:
        hold.release()
        hold.close()
        c.close()


@pytest.mark.timeout(300)
def test_stopped_worker_is_killed_and_its_commands_replayed(binary_dir, tmp_path, assets, shim, reference, figures):
    final, messages, d, pid = run_stopped(binary_dir, tmp_path, assets, shim, figures, "offloadd-worker")
    try:
        log = d.log()
        assert final.state == S.JOB_STATE_SUCCEEDED, (final.error.message, messages[-10:], log[-3000:])
        assert f"(pid {pid}) completed nothing for" in log and "killing it" in log, log[-3000:]
        assert f"(pid {pid}) killed by the liveness watchdog; replaying" in log, log[-3000:]
        # The pool replayed in place: the job itself never restarted.
        assert not [m for m in messages if "restarting the job" in m], messages
        diff, total = differing_bytes(load_weights(tmp_path / "ws" / "out" / "model.safetensors"), reference)
        figures.lost.append(f"worker: {diff} of {total} bytes of the final weights differ")
        assert diff == 0, f"{diff} of {total} bytes differ from the uninterrupted run"
    finally:
        d.stop()


@pytest.mark.parametrize("name", ["offloadd-executor", "offloadd-store"])
@pytest.mark.timeout(300)
def test_stopped_process_is_killed_and_the_job_resumes_from_its_checkpoint(binary_dir, tmp_path, assets, shim,
                                                                            reference, figures, name):
    final, messages, d, pid = run_stopped(binary_dir, tmp_path, assets, shim, figures, name)
    try:
        assert final.state == S.JOB_STATE_SUCCEEDED, (final.error.message, messages[-10:], d.log()[-3000:])
        restarts = [m for m in messages if "restarting the job from its last checkpoint" in m]
        assert len(restarts) == 1, messages
        assert "killed by the liveness watchdog" in restarts[0], restarts
        if name == "offloadd-executor":
            assert f"executor rank 0 (pid {pid})" in restarts[0] and "no heartbeat for" in restarts[0], restarts
        else:
            assert f"offloadd-store (pid {pid})" in restarts[0], restarts
        assert [m for m in messages if m.startswith("resuming from ")], messages
        diff, total = differing_bytes(load_weights(tmp_path / "ws" / "out" / "model.safetensors"), reference)
        figures.lost.append(f"{name}: {diff} of {total} bytes of the final weights differ")
        assert diff == 0, f"{diff} of {total} bytes differ from the uninterrupted run"
    finally:
        d.stop()


@pytest.mark.timeout(240)
def test_stopped_executor_fails_the_job_naming_it_after_the_restart_budget(binary_dir, tmp_path, assets, figures):
    ws = workspace(tmp_path / "ws", assets)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws, extra_yaml=liveness_yaml(restarts=0)).start()
    try:
        with offloadd.Client(d.target, timeout=30) as c:
            job = c.create_job(spec(ws, "out", steps=400, save_steps=SAVE_STEPS))
            ev = Events(c, job.id)
            pid = executor_pid(ev)
            assert ev.wait_for(lambda e: e.HasField("progress") and e.progress.step >= 2, 120) is not None
            t0 = time.monotonic()
            stop(pid)
            try:
                final = wait_final(c, job.id, timeout=RECOVERY_BOUND_S)
            finally:
                unstop(pid)
            took = time.monotonic() - t0
        figures.did.append("SIGSTOP of the executor of a job with jobs.max_executor_restarts: 0")
        figures.happened.append(f"job {state_name(final.state)} after {took:.1f} s: {final.error.message[:160]}")
        assert final.state == S.JOB_STATE_FAILED, (state_name(final.state), d.log()[-3000:])
        msg = final.error.message
        assert f"executor rank 0 (pid {pid})" in msg and "killed by the liveness watchdog" in msg, msg
        assert re.search(r"while in '(step \d+|setting up[^']*)'", msg), msg  # what it was doing
        assert "jobs.max_executor_restarts is 0" in msg, msg
    finally:
        d.stop()


def start_stopped_job(binary_dir, ws: pathlib.Path, extra_yaml: str):
    """A long job whose executor is SIGSTOPped after its first steps: (daemon, client, job id, pid)."""
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws, extra_yaml=extra_yaml).start()
    c = offloadd.Client(d.target, timeout=30)
    job = c.create_job(spec(ws, "out", steps=400, save_steps=1000))
    ev = Events(c, job.id)
    pid = executor_pid(ev)
    assert ev.wait_for(lambda e: e.HasField("progress") and e.progress.step >= 2, 120) is not None, d.log()[-3000:]
    stop(pid)
    return d, c, job.id, pid


@pytest.mark.timeout(180)
def test_cancel_of_a_stopped_executor_escalates_after_the_grace_period(binary_dir, tmp_path, assets, figures):
    grace = 1.0
    # Deadlines far off: here the cancel's grace period, not the liveness watchdog, ends it.
    yaml = liveness_yaml(cancel_grace=grace, heartbeat=600, floor=600)
    d, c, job_id, pid = start_stopped_job(binary_dir, workspace(tmp_path / "ws", assets), yaml)
    try:
        t0 = time.monotonic()
        assert c.cancel_job(job_id, "test").state == S.JOB_STATE_CANCELLING
        final = wait_final(c, job_id, timeout=grace + 30)
        took = time.monotonic() - t0
        figures.did.append(f"CancelJob of a job whose executor is SIGSTOPped; jobs.cancel_grace_seconds {grace}")
        figures.happened.append(f"job {state_name(final.state)} {took:.1f} s after the cancel")
        assert final.state == S.JOB_STATE_CANCELLED, (state_name(final.state), d.log()[-3000:])
        assert took < grace + 10, f"cancel took {took:.1f} s with a grace period of {grace} s"
        assert "did not stop within jobs.cancel_grace_seconds" in d.log(), d.log()[-3000:]
        # The reason given stays the job's: its error and last transition, through the SDK and
        # `offloadctl get -o json`, not "cancelled".
        assert final.error.message == "test" and final.transitions[-1].reason == "test", final
        assert offloadd.JobResult.from_job(final).error == "test"
        got = subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", d.target, "get", job_id,
                              "-o", "json"], capture_output=True, text=True, timeout=30)
        assert got.returncode == 0, got.stderr
        import json
        as_json = json.loads(got.stdout)
        assert as_json["state"] == "cancelled" and as_json["error"]["message"] == "test", got.stdout
    finally:
        unstop(pid)
        c.close()
        d.stop()


@pytest.mark.timeout(180)
def test_cancel_force_kills_at_once(binary_dir, tmp_path, assets, figures):
    # Neither the grace period nor the watchdog would end it within the test.
    yaml = liveness_yaml(cancel_grace=3600, heartbeat=600, floor=600)
    d, c, job_id, pid = start_stopped_job(binary_dir, workspace(tmp_path / "ws", assets), yaml)
    try:
        ctl = [str(binary_dir / "client" / "offloadctl"), "--target", d.target]
        # A plain cancel leaves it CANCELLING: the stopped executor cannot obey.
        subprocess.run(ctl + ["cancel", job_id], check=True, capture_output=True, timeout=30)
        assert c.get_job(job_id).state == S.JOB_STATE_CANCELLING
        t0 = time.monotonic()
        r = subprocess.run(ctl + ["cancel", job_id, "--force"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        final = wait_final(c, job_id, timeout=20)
        took = time.monotonic() - t0
        figures.did.append("`offloadctl cancel --force` of a CANCELLING job whose executor is SIGSTOPped "
                           "(jobs.cancel_grace_seconds 3600)")
        figures.happened.append(f"job {state_name(final.state)} {took:.1f} s after the forced cancel")
        assert final.state == S.JOB_STATE_CANCELLED, (state_name(final.state), d.log()[-3000:])
        assert took < 10, f"a forced cancel took {took:.1f} s"
        assert not os.path.exists(f"/proc/{pid}") or "Z" in pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2]
    finally:
        unstop(pid)
        c.close()
        d.stop()


@pytest.mark.timeout(300)
def test_cancel_during_a_checkpoint_write_keeps_the_last_checkpoint(binary_dir, tmp_path, assets, shim, figures):
    """The executor is SIGSTOPped while it writes a checkpoint (its .checkpoint-N.tmp-* directory
    exists), then the job is cancelled: it ends within the grace period, the half-written
    directory never becomes a checkpoint-N, and the previous checkpoint is intact (a new job
    resumes from it)."""
    grace = 1.0
    ws = workspace(tmp_path / "ws", assets)
    # The executor is held once it has made checkpoint-2's temporary directory (checkpoint-1
    # committed): the stop lands mid-write whatever the machine's load.
    hold = Hold(ws / "hold", ".checkpoint-2.tmp-*", shim)
    d = FaultDaemon(binary_dir / "daemon" / "offloadd", ws, env=hold.env,
                    extra_yaml=liveness_yaml(cancel_grace=grace, heartbeat=600, floor=600)).start()
    c = offloadd.Client(d.target, timeout=30)
    out = ws / "out"
    pid = None
    try:
        job = c.create_job(spec(ws, "out", steps=STEPS, save_steps=1))
        ev = Events(c, job.id)
        pid = executor_pid(ev)
        hold.wait(120, f":\n{d.log()[-3000:]}")
        stop(pid)
        hold.release()  # the stopped executor stays where it is
        caught = next((p.name for p in out.iterdir() if p.name.startswith(".checkpoint-2.tmp-")), None)
        assert caught, sorted(p.name for p in out.iterdir())
        t0 = time.monotonic()
        c.cancel_job(job.id, "stopped mid-checkpoint")
        final = wait_final(c, job.id, timeout=grace + 30)
        took = time.monotonic() - t0
        figures.did.append(f"SIGSTOP of the executor while {caught} was being written, then CancelJob "
                           f"(jobs.cancel_grace_seconds {grace})")
        figures.happened.append(f"job {state_name(final.state)} {took:.1f} s after the cancel")
        assert final.state == S.JOB_STATE_CANCELLED and took < grace + 10, (state_name(final.state), took)
        step = int(caught.split("-")[1].split(".")[0])
        assert not (out / f"checkpoint-{step}").exists() or (out / f"checkpoint-{step}" / "offloadd_state.json").exists()
        committed = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
        assert committed, list(out.iterdir())
        last = out / f"checkpoint-{committed[-1]}"
        # A new job continuing from it validates it (every file's crc32c) and trains on.
        more = c.submit(spec(ws, "more", steps=committed[-1] + 2, save_steps=1000, resume_from=str(last)),
                        wait=True, timeout=300)
        assert more.state == S.JOB_STATE_SUCCEEDED, (more.error, d.log()[-3000:])
    finally:
        if pid is not None:
            unstop(pid)
        hold.release()
        hold.close()
        c.close()
        d.stop()


@pytest.mark.timeout(300)
def test_killed_store_restarts_the_job_like_a_dead_executor(binary_dir, tmp_path, assets, shim, reference, figures):
    """Item 21: SIGKILL of offloadd-store mid-job: the job restarts from its last checkpoint by
    itself (no resubmit) and its final weights equal an uninterrupted run's."""
    ws = workspace(tmp_path / "ws", assets)
    d, c, job, ev, hold = held_at_first_checkpoint(binary_dir, ws, shim, liveness_yaml())
    try:
        with c:
            pid = child_of(d, "offloadd-store")
            os.kill(pid, signal.SIGKILL)
            hold.release()
            final = wait_final(c, job.id, timeout=RECOVERY_BOUND_S + 120)
            ev.join()
        messages = logs(ev.events)
        figures.did.append(f"SIGKILL of offloadd-store after the first checkpoint of a {STEPS}-step job")
        figures.happened.append(f"job {state_name(final.state)}; "
                                + "; ".join(m[:120] for m in messages if "restarting the job" in m))
        assert final.state == S.JOB_STATE_SUCCEEDED, (final.error.message, messages[-10:], d.log()[-3000:])
        restarts = [m for m in messages if "restarting the job from its last checkpoint" in m]
        assert len(restarts) == 1 and f"offloadd-store (pid {pid}) died" in restarts[0], restarts
        diff, total = differing_bytes(load_weights(ws / "out" / "model.safetensors"), reference)
        figures.lost.append(f"store SIGKILL: {diff} of {total} bytes of the final weights differ")
        assert diff == 0, f"{diff} of {total} bytes differ from the uninterrupted run"
    finally:
        hold.release()
        hold.close()
        d.stop()


@pytest.mark.timeout(300)
def test_stopped_data_parallel_rank_is_killed_not_waited_for(binary_dir, tmp_path, assets, shim, figures):
    """A SIGSTOPped rank of a two-executor (Gloo) job: the watchdog kills it within its heartbeat
    deadline instead of the group waiting out its timeout (jobs.group_timeout_seconds, which the
    ranks use for the group: the log names it), and the job restarts and succeeds."""
    ws = workspace(tmp_path / "ws", assets)
    yaml = liveness_yaml() + "  group_timeout_seconds: 120\n"
    d, c, job, ev, hold = held_at_first_checkpoint(binary_dir, ws, shim, yaml, nvme=False, ranks=2)
    try:
        with c:
            rank1 = ev.wait_for(lambda e: e.HasField("log") and (m := STARTED.search(e.log.message)) and
                                m.group(2) == "1", 60)
            assert rank1 is not None, d.log()[-3000:]
            pid = int(STARTED.search(rank1.log.message).group(1))
            t0 = time.monotonic()
            stop(pid)
            hold.release()
            try:
                final = wait_final(c, job.id, timeout=RECOVERY_BOUND_S + 120)
            finally:
                unstop(pid)
            ev.join()
        messages = logs(ev.events)
        restarts = [m for m in messages if "restarting the job from its last checkpoint" in m]
        figures.did.append("SIGSTOP of rank 1 of a two-executor Gloo job (jobs.group_timeout_seconds 120)")
        figures.happened.append(f"job {state_name(final.state)} {time.monotonic() - t0:.1f} s after the stop; "
                                + "; ".join(m[:120] for m in restarts))
        assert final.state == S.JOB_STATE_SUCCEEDED, (final.error.message, messages[-10:], d.log()[-3000:])
        assert any("group timeout 120 s" in m for m in messages), [m for m in messages if "data parallel" in m]
        assert restarts and f"executor rank 1 (pid {pid}) killed by the liveness watchdog" in restarts[0], restarts
    finally:
        hold.release()
        hold.close()
        d.stop()
